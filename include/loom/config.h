/*
 * The one configuration structure. Every field is described once in the
 * settings table (src/config/table.c): its flag, JSON key, type, bounds,
 * default and help; parsing, validation, --help and the printed
 * configuration all come from that table. Precedence: defaults < preset
 * (--model) < DeepSpeed JSON < flags. Where each value came from is kept in
 * the structure itself (cfg->rec), so parsing has no state of its own: two
 * configurations can be parsed one after the other, or side by side.
 */
#ifndef LOOM_CONFIG_H
#define LOOM_CONFIG_H

#include <stdint.h>

enum loom_lr_decay_style {
    LOOM_LR_CONSTANT = 0,
    LOOM_LR_LINEAR = 1,
    LOOM_LR_COSINE = 2,
    /* DeepSpeed's schedulers (optim/lr.h) */
    LOOM_LR_WARMUP_LR = 3,
    LOOM_LR_WARMUP_DECAY_LR = 4,
    LOOM_LR_WARMUP_COSINE_LR = 5,
    LOOM_LR_DECAY_STYLE_COUNT
};

/* How DeepSpeed's schedulers rise during warmup (Megatron's: linear only). */
enum loom_lr_warmup_style { LOOM_LR_WARMUP_LINEAR = 0, LOOM_LR_WARMUP_LOG = 1, LOOM_LR_WARMUP_STYLE_COUNT };

enum loom_optimizer {
    LOOM_OPTIMIZER_ADAMW = 0,
    LOOM_OPTIMIZER_ADAM = 1, /* DeepSpeed's and Megatron's "adam": AdamW unless adam_w_mode is false */
    LOOM_OPTIMIZER_COUNT
};

/* Where the optimizer state lives (DeepSpeed's offload_optimizer.device). */
enum loom_offload {
    LOOM_OFFLOAD_NONE = 0,
    LOOM_OFFLOAD_CPU = 1, /* a no-op on the CPU backend: the state is in host memory already */
    LOOM_OFFLOAD_NVME = 2,
    LOOM_OFFLOAD_COUNT
};

/* How data parallelism reduces gradients. */
enum loom_ddp_impl {
    LOOM_DDP_BUCKETED = 0, /* buckets all-reduced during the backward */
    LOOM_DDP_NAIVE = 1,    /* one all-reduce after it: the reference */
    LOOM_DDP_IMPL_COUNT
};

/* What a non-finite loss or gradient does outside fp16's loss scaler. */
enum loom_on_nonfinite { LOOM_NONFINITE_ABORT = 0, LOOM_NONFINITE_SKIP = 1, LOOM_ON_NONFINITE_COUNT };

/* FSDP's names for ZeRO stages. */
enum loom_fsdp_strategy {
    LOOM_FSDP_NONE = 0,          /* not given: --zero-stage decides */
    LOOM_FSDP_FULL_SHARD = 1,    /* stage 3 */
    LOOM_FSDP_SHARD_GRAD_OP = 2, /* stage 2 */
    LOOM_FSDP_NO_SHARD = 3,      /* stage 0 */
    LOOM_FSDP_STRATEGY_COUNT
};

/* The dtype gradients are summed in across ranks: the values of enum
 * loom_dtype's F32, BF16 and F16. */
enum loom_reduce_dtype {
    LOOM_REDUCE_FP32 = 0,
    LOOM_REDUCE_BF16 = 1, /* with --bf16 */
    LOOM_REDUCE_FP16 = 2, /* with --fp16 */
    LOOM_REDUCE_DTYPE_COUNT
};

/* fp8 products (Megatron-LM's --fp8-format): off, E4M3 everywhere, or
 * E4M3 forward and E5M2 for gradients. */
enum loom_fp8_mode {
    LOOM_FP8_OFF = 0,
    LOOM_FP8_MODE_E4M3 = 1,
    LOOM_FP8_MODE_HYBRID = 2,
    LOOM_FP8_MODE_COUNT
};

/* How an fp8 scale's amax is taken from its history. */
enum loom_fp8_amax_compute {
    LOOM_FP8_AMAX_COMPUTE_MOST_RECENT = 0,
    LOOM_FP8_AMAX_COMPUTE_MAX = 1,
    LOOM_FP8_AMAX_COMPUTE_COUNT
};

/* --plugin: ColossalAI's and Accelerate's strategy names (config/plugin.c). */
enum loom_plugin {
    LOOM_PLUGIN_NONE = 0,
    LOOM_PLUGIN_TORCH_DDP = 1,
    LOOM_PLUGIN_TORCH_FSDP = 2,
    LOOM_PLUGIN_LOW_LEVEL_ZERO = 3,
    LOOM_PLUGIN_GEMINI = 4,
    LOOM_PLUGIN_HYBRID_PARALLEL = 5,
    LOOM_PLUGIN_DEEPSPEED = 6,
    LOOM_PLUGIN_MEGATRON = 7,
    LOOM_PLUGIN_COUNT
};

/* Block-sparse attention (DeepSpeed's sparse_attention.mode); none: the
 * dense causal kernel (and --attention-window W its sliding window). */
enum loom_sparse_attention_mode {
    LOOM_SPARSE_ATTN_NONE = 0,
    LOOM_SPARSE_ATTN_DENSE = 1,
    LOOM_SPARSE_ATTN_FIXED = 2,
    LOOM_SPARSE_ATTN_BIGBIRD = 3,
    LOOM_SPARSE_ATTN_BSLONGFORMER = 4,
    LOOM_SPARSE_ATTN_VARIABLE = 5,
    LOOM_SPARSE_ATTN_MODE_COUNT
};

/* sparse_attention.attention: a causal language model's is unidirectional. */
enum loom_attention_direction {
    LOOM_ATTN_UNIDIRECTIONAL = 0,
    LOOM_ATTN_BIDIRECTIONAL = 1,
    LOOM_ATTN_DIRECTION_COUNT
};

/* --attention-backend (Megatron's AttnBackend). flash, fused and auto run
 * loom's fused kernel (O(T) memory, no probabilities stored); unfused and
 * local the kernels that store the (T,T) probabilities. */
enum loom_attention_backend {
    LOOM_ATTN_BACKEND_AUTO = 0,
    LOOM_ATTN_BACKEND_FLASH = 1,
    LOOM_ATTN_BACKEND_FUSED = 2,
    LOOM_ATTN_BACKEND_UNFUSED = 3,
    LOOM_ATTN_BACKEND_LOCAL = 4,
    LOOM_ATTN_BACKEND_COUNT
};

/* --moe-token-dispatcher-type (Megatron's): how tokens reach the experts
 * of other expert-parallel ranks. alltoall: each rank's rows for a rank's
 * experts sent to it and the outputs back (all-to-all-v); allgather:
 * every rank's rows gathered, each rank's experts' outputs summed back. */
enum loom_moe_dispatcher {
    LOOM_MOE_DISPATCH_ALLTOALL = 0,
    LOOM_MOE_DISPATCH_ALLGATHER = 1,
    LOOM_MOE_DISPATCH_COUNT
};

/* --cp-comm-type (Megatron's): how context parallelism's ranks meet in
 * attention. p2p: key/value blocks around a ring; all_gather: keys and
 * values gathered once per layer; a2a: DeepSpeed-Ulysses' all-to-all from
 * sequence parts to head parts and back. */
enum loom_cp_comm_type {
    LOOM_CP_COMM_P2P = 0,
    LOOM_CP_COMM_ALL_GATHER = 1,
    LOOM_CP_COMM_A2A = 2,
    LOOM_CP_COMM_COUNT
};

/* The names of enum loom_moe_balance's values, NULL-ended (config/table.c). */
extern const char *const loom_moe_balance_names[];

/* A mixture of experts' load-balancing loss (Megatron's
 * --moe-router-load-balancing-type). */
enum loom_moe_balance {
    LOOM_MOE_AUX_LOSS = 0, /* the Switch Transformer's loss of each MoE layer over the micro-batch */
    LOOM_MOE_BALANCE_NONE = 1,
    LOOM_MOE_HF_AUX_LOSS = 2, /* Hugging Face's (MixtralForCausalLM's): one loss over all layers' router
                               * logits of the micro-batch */
    LOOM_MOE_BALANCE_COUNT
};

/* Which of an expert's rows a capacity keeps (Megatron's --moe-token-drop-policy). */
enum loom_moe_drop_policy {
    LOOM_MOE_DROP_PROBS = 0,    /* the rows with the largest routing weights */
    LOOM_MOE_DROP_POSITION = 1, /* the first rows of the micro-batch */
    LOOM_MOE_DROP_COUNT
};

/* The MLP's activation (Hugging Face's activation_function). */
enum loom_activation {
    LOOM_ACTIVATION_GELU_NEW = 0, /* GELU, tanh approximation (GPT-2's; gelu_pytorch_tanh is the same) */
    LOOM_ACTIVATION_GELU = 1,     /* GELU, exact (erf) */
    LOOM_ACTIVATION_COUNT
};
/* Their names, as flags, checkpoints and Hugging Face's config.json say
 * them; NULL-terminated. */
extern const char *const loom_activation_names[LOOM_ACTIVATION_COUNT + 1];

/* Activation recomputation, Megatron's --recompute-granularity. */
enum loom_recompute {
    LOOM_RECOMPUTE_NONE = 0,      /* keep every activation */
    LOOM_RECOMPUTE_SELECTIVE = 1, /* keep no attention probabilities: recomputed from qkv */
    LOOM_RECOMPUTE_FULL = 2,      /* keep only the inputs of recomputed layers: rerun their forward */
    LOOM_RECOMPUTE_COUNT
};

/* Which layers full recomputation covers, Megatron's --recompute-method
 * with --recompute-num-layers N. Uniform's last chunk is shorter when N
 * does not divide L. */
enum loom_recompute_method {
    LOOM_RECOMPUTE_METHOD_NONE = 0,
    LOOM_RECOMPUTE_UNIFORM = 1, /* every layer, in chunks of N: only each chunk's input is kept */
    LOOM_RECOMPUTE_BLOCK = 2,   /* the first N layers, each keeping its input; the rest keep everything */
    LOOM_RECOMPUTE_METHOD_COUNT
};

/* Megatron's architecture settings: GPT-2 has LayerNorm and learned
 * positions, Llama RMSNorm and rotary positions. */
enum loom_normalization { LOOM_NORM_LAYERNORM = 0, LOOM_NORM_RMSNORM = 1, LOOM_NORMALIZATION_COUNT };
enum loom_position_embedding {
    LOOM_POSITION_LEARNED = 0, /* learned_absolute */
    LOOM_POSITION_ROPE = 1,
    LOOM_POSITION_EMBEDDING_COUNT
};

/* The pipeline schedule (parallel/schedule.h), Megatron's and DeepSpeed's. */
enum loom_pipeline_schedule {
    LOOM_PIPELINE_SCHEDULE_1F1B = 0,        /* one forward, one backward (PipeDream-Flush) */
    LOOM_PIPELINE_SCHEDULE_GPIPE = 1,       /* every forward, then every backward */
    LOOM_PIPELINE_SCHEDULE_INTERLEAVED = 2, /* 1f1b over virtual stages */
    LOOM_PIPELINE_SCHEDULE_COUNT
};

/* The order training batches are drawn in (io/sampler.h). */
enum loom_data_order { LOOM_DATA_SHUFFLED = 0, LOOM_DATA_SEQUENTIAL = 1, LOOM_DATA_ORDER_COUNT };

/* Where a setting's value came from, in rising precedence; derived: computed
 * from other settings; load: the model --load names (loom_config_adopt). */
enum loom_origin {
    LOOM_ORIGIN_DEFAULT = 0,
    LOOM_ORIGIN_PRESET = 1,
    LOOM_ORIGIN_JSON = 2,
    LOOM_ORIGIN_FLAG = 3,
    LOOM_ORIGIN_DERIVED = 4,
    LOOM_ORIGIN_LOAD = 5,
    LOOM_ORIGIN_PLUGIN = 6,     /* --plugin NAME set it */
    LOOM_ORIGIN_AUTO = 7,       /* --layout auto chose it */
    LOOM_ORIGIN_DS_DEFAULT = 8, /* DeepSpeed's default where its JSON leaves a key out (fp16's scale) */
    LOOM_ORIGIN_COUNT
};

#define LOOM_MAX_DATA_PATHS 64
#define LOOM_DECIDED_LAYOUT 1u       /* --layout auto chose the layout */
#define LOOM_DECIDED_OFFLOAD 2u      /* --offload auto chose the placement */
#define LOOM_CONFIG_MAX_SETTINGS 192 /* rows of the settings table, at most */
#define LOOM_CONFIG_MAX_WARNINGS 64
#define LOOM_MOE_MAX_LAYERS 1024 /* the layers a --moe-layer-freq list may give */
#define LOOM_MOE_FREQ_TEXT 256   /* --moe-layer-freq's text, at most (with its end) */

/* Which layers have experts (--moe-layer-freq read): every freq-th from
 * layer 0, or (freq 0) those whose character in list is '1'. */
struct loom_moe_layers {
    int freq;
    char list[LOOM_MOE_MAX_LAYERS + 1];
};

/* What loom_config_parse records beside the values, by row of the settings
 * table; read it through loom_config_origin, loom_config_given and the
 * printed configuration. */
struct loom_config_record {
    uint8_t origin[LOOM_CONFIG_MAX_SETTINGS];        /* enum loom_origin */
    const char *json_path[LOOM_CONFIG_MAX_SETTINGS]; /* the JSON key a value came from (static text) */
    char json_had[LOOM_CONFIG_MAX_SETTINGS][128];    /* the JSON's value where a flag replaced it */
    /* start-up warnings (unknown JSON keys, flags overriding the file),
     * printed once by loom_config_resolve when the ranks are known */
    char warnings[LOOM_CONFIG_MAX_WARNINGS][320];
    int nwarnings, nwarnings_dropped;
};

struct loom_config {
    /* the run itself */
    char deepspeed_config[512]; /* JSON config file, "" for none */
    int dry_run;                /* resolve and print the configuration, then exit */
    int print_config;           /* print every setting at start-up, not only those not at their defaults */
    /* model */
    char model[32]; /* a preset of a model family (model/family.h) */
    int num_layers, hidden_size, num_attention_heads, seq_length, max_position_embeddings, vocab_size;
    double norm_epsilon;                      /* LayerNorm's eps */
    enum loom_activation activation_function; /* the MLP's */
    int untie_embeddings_and_output_weights;  /* an LM head of its own, not the token embedding */
    /* Megatron's architecture settings (the Llama family's, presets set them) */
    enum loom_normalization normalization;
    enum loom_position_embedding position_embedding_type;
    int swiglu, disable_bias_linear, group_query_attention;
    int add_qkv_bias;     /* q, k and v's biases kept under disable_bias_linear */
    int num_query_groups; /* key/value heads under group_query_attention */
    int ffn_hidden_size;  /* the MLP's width; 0: the family's rule */
    int kv_channels;      /* an attention head's width; 0: hidden_size / num_attention_heads */
    double rotary_base;   /* RoPE's theta */
    /* mixture of experts (Megatron's): 0 experts is a dense MLP in every layer */
    int num_experts, moe_router_topk;
    int moe_ffn_hidden_size;                 /* each expert's width; 0: ffn_hidden_size */
    int moe_shared_expert_intermediate_size; /* the shared experts' width (always active); 0: none */
    char moe_layer_freq[LOOM_MOE_FREQ_TEXT]; /* Megatron's: "N" (layer l has experts when l % N == 0) or a
                                              * list expression of one 0 or 1 a layer ("[0]*1+[1]*3") */
    int moe_router_pre_softmax;              /* top-k of the softmax (else the softmax of the top k) */
    enum loom_moe_balance moe_router_load_balancing_type;
    double moe_aux_loss_coeff, moe_z_loss_coeff;
    double moe_expert_capacity_factor; /* each expert takes at most ceil(N k / E x this) rows; 0: dropless */
    enum loom_moe_drop_policy moe_token_drop_policy;
    int moe_pad_expert_input_to_capacity; /* each expert's rows padded to the capacity */
    int moe_per_layer_logging;            /* each MoE layer's statistics in the metrics and TensorBoard */
    int expert_model_parallel_size;       /* the experts split over this many data-parallel ranks */
    enum loom_moe_dispatcher moe_token_dispatcher_type;
    /* batch: global = micro x accumulation x dp */
    int micro_batch_size, global_batch_size, gradient_accumulation_steps;
    /* optimisation */
    int train_iters, lr_warmup_iters, lr_decay_iters;
    /* Megatron's samples-based schedule (0: not given): iterations = samples / global batch */
    int64_t train_samples, lr_warmup_samples, lr_decay_samples;
    /* Megatron's --rampup-batch-size START INCREMENT SAMPLES (optim/batch_rampup.h), as given, and read
     * (start 0: no rampup) */
    int nrampup_batch_size;
    char *rampup_batch_size[LOOM_MAX_DATA_PATHS];
    int64_t rampup_start, rampup_increment, rampup_samples;
    double lr_warmup_fraction; /* Megatron's: warmup = this x the decay iterations (0: not given) */
    double init_method_std;    /* weights drawn from N(0, std) (0: the family's, 0.02) */
    /* dropout's p while training: the attention and MLP outputs', attention's probabilities', the
     * embedding's (resolved: -1 takes the hidden's, as Megatron's embedding dropout does) */
    double hidden_dropout, attention_dropout, embedding_dropout;
    int no_load_optim;              /* a resume takes the weights and step, and starts the optimizer afresh */
    int exit_on_missing_checkpoint; /* --load == --save with no checkpoint yet: exit, not start afresh */
    int make_vocab_size_divisible_by; /* a vocabulary taken from the tokenizer is padded to this x TP */
    int tensorboard_log_interval;     /* TensorBoard's scalars every N steps (0: with the log lines) */
    int log_timers_to_tensorboard;
    double lr, min_lr, weight_decay, adam_beta1, adam_beta2, adam_eps, clip_grad;
    enum loom_lr_decay_style lr_decay_style;
    enum loom_lr_warmup_style lr_warmup_style;
    double lr_warmup_min_ratio, lr_cos_min_ratio; /* WarmupCosineLR */
    enum loom_optimizer optimizer;
    int adam_w_mode; /* 0: Adam with L2-coupled weight decay (not implemented) */
    int64_t seed;
    /* mixed precision */
    int fp16, bf16;
    double loss_scale; /* 0: dynamic */
    double initial_loss_scale, min_loss_scale;
    int loss_scale_window, hysteresis;
    enum loom_on_nonfinite on_nonfinite;
    enum loom_reduce_dtype grad_reduce_dtype;
    enum loom_fp8_mode fp8_format;
    int fp8_amax_history_len, fp8_margin;
    enum loom_fp8_amax_compute fp8_amax_compute_algo;
    /* block-sparse attention (DeepSpeed's sparse_attention block) */
    enum loom_sparse_attention_mode sparse_mode;
    int sparse_block, sparse_different_layout_per_head, sparse_num_local_blocks, sparse_num_global_blocks;
    int sparse_num_random_blocks; /* -1: the mode's (bigbird 1, variable 0) */
    int sparse_num_sliding_window_blocks, sparse_num_different_global_patterns;
    int sparse_horizontal_global_attention;
    enum loom_attention_direction sparse_attention;
    char sparse_local_window_blocks[128], sparse_global_block_indices[128],
        sparse_global_block_end_indices[128];
    int attention_window; /* --attention-window W: tokens; 0 none */
    enum loom_attention_backend attention_backend;
    int use_flash_attn; /* Megatron's older flag: the fused kernel (the default) */
    /* data */
    int ndata_paths, nvalid_paths; /* entries of the next two */
    char *data_paths[LOOM_MAX_DATA_PATHS];
    char *valid_data_paths[LOOM_MAX_DATA_PATHS];
    /* Megatron's per-split blends (--train-data-path is --data-path for
     * shards) and the split of --data-path's blend ("" Megatron's default) */
    int ntrain_paths, ntest_paths;
    char *train_data_paths[LOOM_MAX_DATA_PATHS];
    char *test_data_paths[LOOM_MAX_DATA_PATHS];
    char split[64];
    char data_cache_path[512]; /* Megatron datasets' index cache: "" none */
    enum loom_data_order data_order;
    /* packed documents (Megatron's): positions and attention restart after
     * each end-of-document token; its loss masked */
    int reset_position_ids, reset_attention_mask, eod_mask_loss;
    int eod_token_id; /* -1: the family's end-of-text token */
    char data_cache[512];
    int mock_data;       /* the built-in corpus, asked for (loom eval's; loom train's without --data-path) */
    char tokenizer[512]; /* --tokenizer: "" none */
    /* Megatron's names for it: --tokenizer-type with --vocab-file and
     * --merge-file (GPT2BPETokenizer) or --tokenizer-model
     * (HuggingFaceTokenizer); resolved into tokenizer (+ merge_file) */
    char tokenizer_type[64], vocab_file[512], merge_file[512], tokenizer_model[512];
    /* logging and evaluation */
    int log_interval, eval_interval, eval_iters;
    char metrics[512];
    char tensorboard_dir[512];
    char trace[512], trace_steps[32];
    int trace_first, trace_last; /* --trace-steps A:B (0 0: the run's first ten), by loom_config_resolve */
    /* what loom train's start-up settled (LOOM_DECIDED_*): --layout auto and
     * --offload auto are its decisions; the engine API refuses them unmade */
    unsigned decided;
    int evaluating; /* loom eval: nothing trains, so nothing drops (the dropout refusals do not apply) */
    /* checkpoints */
    char load[512], save[512];
    int save_interval, keep_last, finetune;
    /* graceful stop (also on SIGTERM and SIGINT): after a step that is a
     * multiple of exit_interval, or once exit_duration_in_mins have passed;
     * 0: never */
    int exit_interval;
    double exit_duration_in_mins;
    /* sampling (loom sample) */
    char prompt[1024];
    int max_new_tokens, top_k;
    double temperature;
    /* parallelism */
    int tensor_model_parallel_size, pipeline_model_parallel_size;
    int context_parallel_size;           /* each sequence split over this many ranks */
    enum loom_cp_comm_type cp_comm_type; /* how they meet in attention */
    int sequence_parallel; /* with tensor parallelism: the rows of the norm regions split over the tp group */
    int layout_invariant;  /* N > 0: every sum a layout splits in one order: N tensor-parallel pieces, a tree
                              of micro-batches */
    enum loom_pipeline_schedule pipeline_schedule;
    int num_layers_per_virtual_pipeline_stage; /* interleaved: layers per model chunk; 0: not given */
    /* Megatron's uneven ends: layers of the first and the last stage (0: balanced) */
    int decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers;
    int use_distributed_optimizer; /* Megatron's name for ZeRO-1 over the data-parallel group */
    double ddp_bucket_size;        /* MB */
    int no_overlap;
    enum loom_ddp_impl ddp_impl;
    double comm_timeout; /* seconds */
    int zero_stage;
    enum loom_fsdp_strategy fsdp_sharding_strategy;
    int64_t zero3_min_params;
    enum loom_offload offload_optimizer;
    char nvme_path[512];
    enum loom_offload offload_param; /* ZeRO-3's parameter and gradient shards */
    char param_nvme_path[512];       /* "" : nvme_path */
    int offload_auto;                /* --offload auto: placed by app/placement.c from mem_per_rank */
    int offload_direct_io;           /* the optimizer file's streaming with O_DIRECT */
    double mem_per_rank;             /* GB; 0: the machine's memory over its ranks */
    enum loom_plugin plugin;         /* --plugin NAME: its settings applied by loom_config_parse */
    int plugin_stage;                /* --plugin-stage: low_level_zero's ZeRO stage (1 or 2) */
    int layout_auto; /* --layout auto: the planner's fastest layout that fits (app/layout_auto.c) */
    double offload_buffer_size; /* MB */
    /* activation recomputation (Megatron's) */
    int recompute_activations; /* Megatron's shorthand for recompute_granularity selective */
    enum loom_recompute recompute_granularity;
    enum loom_recompute_method recompute_method;
    int recompute_num_layers; /* N; 0: not given */
    /* machine */
    int threads;
    char backend[32]; /* --backend: a registered backend's name (kernels/backend.h) */
    double peak_tflops;
    /* where each value came from, and the warnings (not a setting) */
    struct loom_config_record rec;
};

/* Fills cfg from defaults, the --model preset, the JSON file of
 * --deepspeed-config and the flags in argv (the arguments after the
 * subcommand), in that order of precedence. `--help` sets *help and returns
 * LOOM_OK without reading anything. Errors: LOOM_ERR_INPUT with one line
 * naming the flag, JSON key or file and the value. Warnings (unknown JSON
 * keys, keys accepted but ignored, flags overriding the file) are kept and
 * printed once when the ranks are known (loom_engine_init). */
int loom_config_parse(struct loom_config *cfg, int argc, char **argv, int *help);
/* Frees what parsing allocated (data paths). */
void loom_config_free(struct loom_config *cfg);

/* Where the value of the setting named `flag` ("--num-layers" or
 * "num-layers") came from. A name that is no setting is a bug: it aborts. */
enum loom_origin loom_config_origin(const struct loom_config *cfg, const char *flag);
/* Whether the user gave the setting: by a flag or in the JSON file (not a
 * default, a preset, or derived from other settings). */
int loom_config_given(const struct loom_config *cfg, const char *flag);

#endif
