/*
 * The settings table: each setting once, with its flag, its JSON path, type,
 * bounds, default and one line of help; the choice tables of its enums; and
 * the lookups by field, by flag and by nearest flag. Parsing (parse.c),
 * DeepSpeed JSON (json.c), derived values (resolve.c), --help and the
 * printed configuration (print.c) are all driven by these rows. Not here:
 * presets, which come from the model families (model/family.h).
 */
#include <assert.h>
#include <limits.h>
#include <string.h>

#include "base/log.h"
#include "config/config_impl.h"

/* Each choice table names its enum's values in order, NULL-terminated. */
#define CHOICES(name, count, ...)                                                                            \
    static const char *const name[] = {__VA_ARGS__, NULL};                                                   \
    static_assert(sizeof name / sizeof name[0] == (count) + 1, #name " must name every value")

CHOICES(decay_styles, LOOM_LR_DECAY_STYLE_COUNT, "constant", "linear", "cosine", "WarmupLR", "WarmupDecayLR",
        "WarmupCosineLR");
CHOICES(warmup_styles, LOOM_LR_WARMUP_STYLE_COUNT, "linear", "log");
CHOICES(optimizers, LOOM_OPTIMIZER_COUNT, "adamw", "adam");
CHOICES(fsdp_strategies, LOOM_FSDP_STRATEGY_COUNT, "none", "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD");
CHOICES(offload_devices, LOOM_OFFLOAD_COUNT, "none", "cpu", "nvme");
CHOICES(offload_modes, 2, "none", "auto");
CHOICES(nonfinite_actions, LOOM_ON_NONFINITE_COUNT, "abort", "skip");
CHOICES(reduce_dtypes, LOOM_REDUCE_DTYPE_COUNT, "fp32", "bf16", "fp16");
CHOICES(fp8_modes, LOOM_FP8_MODE_COUNT, "none", "e4m3", "hybrid");
CHOICES(fp8_amax_algos, LOOM_FP8_AMAX_COMPUTE_COUNT, "most_recent", "max");
CHOICES(plugins, LOOM_PLUGIN_COUNT, "none", "torch_ddp", "torch_fsdp", "low_level_zero", "gemini",
        "hybrid_parallel", "deepspeed", "megatron");
CHOICES(layout_modes, 2, "given", "auto");
CHOICES(sparse_modes, LOOM_SPARSE_ATTN_MODE_COUNT, "none", "dense", "fixed", "bigbird", "bslongformer",
        "variable");
CHOICES(attention_directions, LOOM_ATTN_DIRECTION_COUNT, "unidirectional", "bidirectional");
CHOICES(attention_backends, LOOM_ATTN_BACKEND_COUNT, "auto", "flash", "fused", "unfused", "local");
CHOICES(cp_comm_types, LOOM_CP_COMM_COUNT, "p2p", "all_gather", "a2a");
const char *const loom_moe_balance_names[LOOM_MOE_BALANCE_COUNT + 1] = {"aux_loss", "none", "hf_aux_loss",
                                                                        NULL};
#define moe_balances loom_moe_balance_names
CHOICES(moe_drop_policies, LOOM_MOE_DROP_COUNT, "probs", "position");
CHOICES(moe_dispatchers, LOOM_MOE_DISPATCH_COUNT, "alltoall", "allgather");
CHOICES(ddp_impls, LOOM_DDP_IMPL_COUNT, "bucketed", "naive");
CHOICES(data_orders, LOOM_DATA_ORDER_COUNT, "shuffled", "sequential");
CHOICES(recompute_granularities, LOOM_RECOMPUTE_COUNT, "none", "selective", "full");
/* public (loom/config.h): the names files record too */
const char *const loom_activation_names[LOOM_ACTIVATION_COUNT + 1] = {"gelu_new", "gelu", NULL};
CHOICES(recompute_methods, LOOM_RECOMPUTE_METHOD_COUNT, "none", "uniform", "block");
CHOICES(pipeline_schedules, LOOM_PIPELINE_SCHEDULE_COUNT, "1f1b", "gpipe", "interleaved");
CHOICES(normalizations, LOOM_NORMALIZATION_COUNT, "LayerNorm", "RMSNorm");
CHOICES(position_embeddings, LOOM_POSITION_EMBEDDING_COUNT, "learned_absolute", "rope");

#define F(field) offsetof(struct loom_config, field)
#define SIZE(field) sizeof(((struct loom_config *)0)->field)
/* 0, and a compile error unless an ENUM row's field is int-sized (rows store enums as int) */
#define INT_SIZED(field) (0 * sizeof(char[SIZE(field) == sizeof(int) ? 1 : -1]))
/* row(flag, json path, group, field, ..., help[, .conv = ..., .json_alt = ...]) */
#define ROW(flag_, json_, group_, type_, field, lo, hi, def_, choices_, help_, ...)                          \
    {                                                                                                        \
        .flag = flag_, .json = json_, .group = group_, .type = type_, .offset = F(field), .min = lo,         \
        .max = hi, .def = def_, .choices = choices_, .help = help_, __VA_ARGS__                              \
    }
#define INT(flag, json, group, field, lo, hi, def, help, ...)                                                \
    ROW(flag, json, group, T_INT, field, lo, hi, def, NULL, help, __VA_ARGS__)
#define I64(flag, json, group, field, lo, hi, def, help, ...)                                                \
    ROW(flag, json, group, T_INT64, field, lo, hi, def, NULL, help, __VA_ARGS__)
#define DBL(flag, json, group, field, lo, hi, def, help, ...)                                                \
    ROW(flag, json, group, T_DOUBLE, field, lo, hi, def, NULL, help, __VA_ARGS__)
#define STR(flag, json, group, field, def, help, ...)                                                        \
    ROW(flag, json, group, T_STRING, field, 0, 0, def, NULL, help, .size = SIZE(field), __VA_ARGS__)
#define BOOL(flag, json, group, field, def, help, ...)                                                       \
    ROW(flag, json, group, T_BOOL, field, 0, 1, def, NULL, help, __VA_ARGS__)
#define ENUM(flag, json, group, field, choices, def, help, ...)                                              \
    ROW(flag, json, group, T_ENUM, field, 0, 0, def, choices, help, .size = INT_SIZED(field), __VA_ARGS__)
#define PATHS(flag, json, group, field, count_field, help)                                                   \
    ROW(flag, json, group, T_PATHS, field, 0, 0, NULL, NULL, help, .count = F(count_field))
#define PRESET(flag, json, group, field, help)                                                               \
    ROW(flag, json, group, T_PRESET, field, 0, 0, NULL, NULL, help, .size = SIZE(field))

/* clang-format off */
const struct setting loom_settings[] = {
    STR("--deepspeed-config", NULL, "config", deepspeed_config, "",
        "DeepSpeed JSON config FILE (alias --deepspeed_config): the json: keys below; flags override it"),
    BOOL("--dry-run", NULL, "config", dry_run, "0",
         "resolve and print the configuration, then exit (loom train, loom eval)"),
    BOOL("--print-config", NULL, "config", print_config, "0",
         "print every setting at start-up (by default the settings not at their defaults; --dry-run and the "
         "metrics file's first row always hold every one)"),

    PRESET("--model", "model", "model", model, "preset of a model family:"),
    INT("--num-layers", "num_layers", "model", num_layers, 1, 1024, NULL, "transformer layers (L)"),
    INT("--hidden-size", "hidden_size", "model", hidden_size, 1, 65536, NULL, "channels (C)"),
    INT("--num-attention-heads", "num_attention_heads", "model", num_attention_heads, 1, 1024, NULL,
        "attention heads (NH)"),
    INT("--seq-length", "seq_length", "model", seq_length, 1, 1 << 20, NULL, "tokens per sequence (T)"),
    INT("--max-position-embeddings", "max_position_embeddings", "model", max_position_embeddings,
        1, 1 << 20, NULL, "rows of the position embedding"),
    INT("--vocab-size", "vocab_size", "model", vocab_size, 2, 1 << 24, NULL, "vocabulary size (V)"),
    DBL("--norm-epsilon", "norm_epsilon", "model", norm_epsilon, 0, 1, "1e-5",
        "LayerNorm's eps (Hugging Face's layer_norm_epsilon)"),
    ENUM("--activation-function", "activation_function", "model", activation_function, loom_activation_names, "gelu_new",
         "MLP activation: gelu_new (GELU, tanh approximation) or gelu (exact)"),
    BOOL("--untie-embeddings-and-output-weights", "untie_embeddings_and_output_weights", "model",
         untie_embeddings_and_output_weights, "0",
         "the LM head has its own weight (lm_head.weight), not the token embedding's"),
    ENUM("--normalization", "normalization", "model", normalization, normalizations, "LayerNorm",
         "LayerNorm (GPT-2) or RMSNorm (Llama)"),
    INT("--make-vocab-size-divisible-by", NULL, "model", make_vocab_size_divisible_by, 1, 1 << 20, "128",
        "with a tokenizer and no --vocab-size: the vocabulary is the tokenizer's padded to a multiple of this "
        "x the tensor-parallel size (Megatron's)"),
    DBL("--init-method-std", NULL, "model", init_method_std, 0, 10, "0",
        "weights drawn from N(0, std), the residual projections' scaled by 1/sqrt(2 layers) where the family "
        "does (0: the family's, 0.02)"),
    DBL("--hidden-dropout", "hidden_dropout", "model", hidden_dropout, 0, 1, "0",
        "dropout on the attention and MLP outputs before each residual add while training (Hugging Face's "
        "resid_pdrop; masks drawn from seed, step, layer and each element's global index: the same on every "
        "layout)"),
    DBL("--attention-dropout", "attention_dropout", "model", attention_dropout, 0, 1, "0",
        "dropout on attention's probabilities while training, inside the fused kernel (attn_pdrop)"),
    DBL("--embedding-dropout", "embedding_dropout", "model", embedding_dropout, -1, 1, "-1",
        "dropout on the embedding's output while training (embd_pdrop; -1: --hidden-dropout's, as Megatron)"),
    ENUM("--position-embedding-type", "position_embedding_type", "model", position_embedding_type,
         position_embeddings, "learned_absolute", "learned_absolute (GPT-2) or rope (Llama)"),
    BOOL("--swiglu", "swiglu", "model", swiglu, "0", "the MLP is SwiGLU's gated one (Llama)"),
    BOOL("--disable-bias-linear", "disable_bias_linear", "model", disable_bias_linear, "0",
         "no biases in the linear layers (Llama)"),
    BOOL("--add-qkv-bias", "add_qkv_bias", "model", add_qkv_bias, "0",
         "biases on the query, key and value projections, even with --disable-bias-linear (Qwen2)"),
    BOOL("--group-query-attention", "group_query_attention", "model", group_query_attention, "0",
         "grouped-query attention: --num-query-groups key/value heads"),
    INT("--num-query-groups", "num_query_groups", "model", num_query_groups, 0, 1024, "0",
        "key/value heads under --group-query-attention (0: not given)"),
    INT("--ffn-hidden-size", "ffn_hidden_size", "model", ffn_hidden_size, 0, 1 << 20, "0",
        "the MLP's width (0: the family's rule)"),
    INT("--kv-channels", "kv_channels", "model", kv_channels, 0, 1 << 16, "0",
        "each attention head's width (0: --hidden-size / --num-attention-heads)"),
    DBL("--rotary-base", "rotary_base", "model", rotary_base, 1, 1e12, "10000", "RoPE's base (theta)"),
    INT("--num-experts", "num_experts", "moe", num_experts, 0, 1024, "0",
        "mixture of experts: experts of each MoE layer's MLP (0: dense MLPs)"),
    INT("--moe-router-topk", "moe_router_topk", "moe", moe_router_topk, 1, 1 << 16, "2",
        "experts each token is routed to"),
    INT("--moe-ffn-hidden-size", "moe_ffn_hidden_size", "moe", moe_ffn_hidden_size, 0, 1 << 20, "0",
        "each expert's width (0: --ffn-hidden-size)"),
    INT("--moe-shared-expert-intermediate-size", "moe_shared_expert_intermediate_size", "moe",
        moe_shared_expert_intermediate_size, 0, 1 << 20, "0",
        "shared experts' width: an MLP every token goes through, added to the routed output (0: none)"),
    STR("--moe-layer-freq", "moe_layer_freq", "moe", moe_layer_freq, "1",
        "every N-th layer (from layer 0) is an MoE layer, the others dense; or a list of one 0 or 1 a layer "
        "(1: experts), Megatron's Python expression: \"[1,0,1,1]\", \"([0]*1+[1]*3)*2\"",
        .conv = J_INT_TEXT),
    BOOL("--moe-router-pre-softmax", "moe_router_pre_softmax", "moe", moe_router_pre_softmax, "0",
         "routing weights are the top k of the softmax over all experts (default: the softmax over the "
         "top k logits, Mixtral's renormalised top k)"),
    ENUM("--moe-router-load-balancing-type", "moe_router_load_balancing_type", "moe",
         moe_router_load_balancing_type, moe_balances, "aux_loss",
         "aux_loss (Megatron's: each MoE layer's Switch loss over the micro-batch), hf_aux_loss (Hugging "
         "Face's: one over all layers' router logits, what MixtralForCausalLM adds) or none"),
    DBL("--moe-aux-loss-coeff", "moe_aux_loss_coeff", "moe", moe_aux_loss_coeff, 0, 1e6, "0",
        "the load-balancing loss's weight"),
    DBL("--moe-z-loss-coeff", "moe_z_loss_coeff", "moe", moe_z_loss_coeff, 0, 1e6, "0",
        "the router's z-loss weight (mean squared log-sum-exp of its logits; 0: off)"),
    DBL("--moe-expert-capacity-factor", "moe_expert_capacity_factor", "moe", moe_expert_capacity_factor, 0, 1e6,
        "0", "each expert takes at most ceil(tokens x top-k / experts x F) of a micro-batch's rows, the rest "
             "dropped (0: dropless)"),
    ENUM("--moe-token-drop-policy", "moe_token_drop_policy", "moe", moe_token_drop_policy, moe_drop_policies,
         "probs", "which rows an expert over its capacity keeps: probs (the largest routing weights) or "
                  "position (the first)"),
    BOOL("--moe-per-layer-logging", "moe_per_layer_logging", "moe", moe_per_layer_logging, "0",
         "each MoE layer's balancing loss, z-loss and tokens per expert's cv in the metrics (moe.layers) and "
         "TensorBoard (moe/load_balancing_loss_layer_N, ...)"),
    BOOL("--moe-pad-expert-input-to-capacity", "moe_pad_expert_input_to_capacity", "moe",
         moe_pad_expert_input_to_capacity, "0", "each expert computes exactly its capacity of rows (zeros pad it)"),

    INT("--micro-batch-size", "train_micro_batch_size_per_gpu", "batch", micro_batch_size, 0, 1 << 20, "0",
        "sequences per micro-batch per rank (0: derived)", .joint = 1),
    INT("--global-batch-size", "train_batch_size", "batch", global_batch_size, 0, 1 << 24, "0",
        "sequences per step, all ranks (0: derived)", .joint = 1),
    INT("--gradient-accumulation-steps", "gradient_accumulation_steps", "batch",
        gradient_accumulation_steps, 0, 1 << 20, "0", "micro-batches per step per rank (0: derived)",
        .joint = 1),

    INT("--train-iters", "train_iters", "training", train_iters, 1, INT_MAX, NULL, "optimizer steps"),
    ENUM("--optimizer", "optimizer.type", "training", optimizer, optimizers, "adamw",
         "adamw or adam, both the decoupled AdamW update (DeepSpeed's Adam and Megatron's adam are AdamW)"),
    BOOL("--adam-w-mode", "optimizer.params.adam_w_mode", "training", adam_w_mode, "1",
         "false: Adam with L2-coupled weight decay, not implemented (accepted with --weight-decay 0)"),
    DBL("--lr", "optimizer.params.lr", "training", lr, 0, 10, NULL,
        "peak learning rate (json: the scheduler's warmup_max_lr wins, as in DeepSpeed)",
        .json_alt = "scheduler.params.warmup_max_lr"),
    DBL("--min-lr", "scheduler.params.warmup_min_lr", "training", min_lr, 0, 10, "0",
        "learning rate at the end of decay; WarmupLR and WarmupDecayLR also start their warmup there"),
    INT("--lr-warmup-iters", "scheduler.params.warmup_num_steps", "training", lr_warmup_iters, 0, INT_MAX,
        NULL, "warmup steps (DeepSpeed's schedulers: at least 2)"),
    INT("--lr-decay-iters", "scheduler.params.total_num_steps", "training", lr_decay_iters, 0, INT_MAX, "0",
        "step where decay reaches its floor (0: --train-iters)"),
    PATHS("--rampup-batch-size", NULL, "training", rampup_batch_size, nrampup_batch_size,
          "START INCREMENT SAMPLES: the global batch starts at START sequences and grows by INCREMENT until "
          "SAMPLES are consumed, then is --global-batch-size (Megatron's; with --train-samples)"),
    I64("--train-samples", NULL, "training", train_samples, 0, 9e15, "0",
        "Megatron's samples-based length: --train-iters = samples / global batch (0: not given)"),
    I64("--lr-warmup-samples", NULL, "training", lr_warmup_samples, 0, 9e15, "0",
        "Megatron's: --lr-warmup-iters = samples / global batch (0: not given)"),
    I64("--lr-decay-samples", NULL, "training", lr_decay_samples, 0, 9e15, "0",
        "Megatron's: --lr-decay-iters = samples / global batch (0: not given)"),
    DBL("--lr-warmup-fraction", NULL, "training", lr_warmup_fraction, 0, 1, "0",
        "Megatron's: warmup = this fraction of the decay iterations (0: not given)"),
    ENUM("--lr-decay-style", "scheduler.type", "training", lr_decay_style, decay_styles, "cosine",
         "constant, linear, cosine (Megatron's) or WarmupLR, WarmupDecayLR, WarmupCosineLR (DeepSpeed's)"),
    ENUM("--lr-warmup-style", "scheduler.params.warmup_type", "training", lr_warmup_style, warmup_styles,
         "linear", "linear or log (DeepSpeed's schedulers only; log unless given, as in DeepSpeed)"),
    DBL("--lr-warmup-min-ratio", "scheduler.params.warmup_min_ratio", "training", lr_warmup_min_ratio, 0, 1,
        "0", "WarmupCosineLR: warmup starts at this fraction of --lr"),
    DBL("--lr-cos-min-ratio", "scheduler.params.cos_min_ratio", "training", lr_cos_min_ratio, 0, 1,
        "0.0001", "WarmupCosineLR: cosine ends at this fraction of --lr"),
    DBL("--weight-decay", "optimizer.params.weight_decay", "training", weight_decay, 0, 10, "0.1",
        "decoupled weight decay (2-D tensors only)"),
    /* below 1 as the float the update takes: a beta that rounds to 1.0f divides by zero */
    DBL("--adam-beta1", "optimizer.params.betas[0]", "training", adam_beta1, 0, 0.999999, "0.9",
        "AdamW beta1"),
    DBL("--adam-beta2", "optimizer.params.betas[1]", "training", adam_beta2, 0, 0.99999994, "0.95",
        "AdamW beta2"),
    DBL("--adam-eps", "optimizer.params.eps", "training", adam_eps, 0, 1, "1e-8", "AdamW epsilon"),
    DBL("--clip-grad", "gradient_clipping", "training", clip_grad, 0, 1e9, "1.0",
        "global gradient-norm clip (0: off)"),
    I64("--seed", "seed", "training", seed, 0, 9.2e18, "1234", "seed of initialisation and data order"),

    ENUM("--sparse-attention-mode", "sparse_attention.mode", "attention", sparse_mode, sparse_modes, "none",
         "block-sparse attention (DeepSpeed's sparse_attention): dense, fixed, bigbird, bslongformer, variable; "
         "none: the dense causal kernel"),
    INT("--sparse-block", "sparse_attention.block", "attention", sparse_block, 1, 4096, "16",
        "tokens per side of a sparsity block (divides --seq-length)"),
    BOOL("--sparse-different-layout-per-head", "sparse_attention.different_layout_per_head", "attention",
         sparse_different_layout_per_head, "0", "a layout per head (fixed's global patterns, random blocks)"),
    INT("--sparse-num-local-blocks", "sparse_attention.num_local_blocks", "attention", sparse_num_local_blocks, 0,
        1 << 20, "4", "fixed: blocks of a local window"),
    INT("--sparse-num-global-blocks", "sparse_attention.num_global_blocks", "attention", sparse_num_global_blocks,
        0, 1 << 20, "1", "fixed, bigbird: global blocks"),
    INT("--sparse-num-random-blocks", "sparse_attention.num_random_blocks", "attention", sparse_num_random_blocks,
        -1, 1 << 20, "-1", "bigbird, variable: random key blocks per row (-1: the mode's, bigbird 1, variable 0)"),
    INT("--sparse-num-sliding-window-blocks", "sparse_attention.num_sliding_window_blocks", "attention",
        sparse_num_sliding_window_blocks, 0, 1 << 20, "3", "bigbird, bslongformer: sliding window blocks"),
    INT("--sparse-num-different-global-patterns", "sparse_attention.num_different_global_patterns", "attention",
        sparse_num_different_global_patterns, 1, 1 << 20, "1", "fixed: global patterns across heads"),
    BOOL("--sparse-horizontal-global-attention", "sparse_attention.horizontal_global_attention", "attention",
         sparse_horizontal_global_attention, "0", "global blocks attend to every block (bidirectional only)"),
    ENUM("--sparse-attention-direction", "sparse_attention.attention", "attention", sparse_attention,
         attention_directions, "unidirectional",
         "unidirectional (causal; loom's models are causal language models) or bidirectional"),
    STR("--sparse-local-window-blocks", "sparse_attention.local_window_blocks", "attention",
        sparse_local_window_blocks, "4", "variable: local window sizes in blocks, comma-separated (JSON: a list)",
        .conv = J_INT_LIST),
    STR("--sparse-global-block-indices", "sparse_attention.global_block_indices", "attention",
        sparse_global_block_indices, "0", "variable, bslongformer: global blocks, comma-separated (JSON: a list)",
        .conv = J_INT_LIST),
    STR("--sparse-global-block-end-indices", "sparse_attention.global_block_end_indices", "attention",
        sparse_global_block_end_indices, "", "variable, bslongformer: ends of global ranges (JSON: a list or null)",
        .conv = J_INT_LIST),
    INT("--attention-window", "attention_window", "attention", attention_window, 0, 1 << 30, "0",
        "sliding-window attention: each token attends to the W tokens up to itself (0: off)"),
    ENUM("--attention-backend", NULL, "attention", attention_backend, attention_backends, "auto",
         "attention kernel (Megatron's): auto, flash and fused run the fused kernel (O(T) memory, no "
         "probabilities stored); unfused and local the (T,T) kernels that store them"),
    BOOL("--use-flash-attn", NULL, "attention", use_flash_attn, "0",
         "the fused attention kernel (Megatron's older flag; the default)"),

    BOOL("--fp16", "fp16.enabled", "precision", fp16, "0",
         "fp16 mixed precision, dynamic loss scaling (fp32 master weights and optimizer state)"),
    BOOL("--bf16", "bf16.enabled", "precision", bf16, "0",
         "bf16 mixed precision (fp32 master weights and optimizer state)", .json_alt = "bfloat16.enabled"),
    ENUM("--grad-reduce-dtype", "communication_data_type", "precision", grad_reduce_dtype, reduce_dtypes,
         "fp32", "dtype of the gradient sum across ranks: fp32, or the compute dtype (half the bytes)"),
    ENUM("--fp8-format", "fp8.format", "precision", fp8_format, fp8_modes, "none",
         "fp8 products in the transformer layers' linear layers (Transformer Engine's delayed scaling; needs "
         "--bf16): e4m3 everywhere, or hybrid (E5M2 for gradients)"),
    INT("--fp8-amax-history-len", "fp8.amax_history_len", "precision", fp8_amax_history_len, 1, 65536, "1",
        "steps of amax history each fp8 scale is computed from"),
    ENUM("--fp8-amax-compute-algo", "fp8.amax_compute_algo", "precision", fp8_amax_compute_algo,
         fp8_amax_algos, "most_recent", "the amax a scale uses: the newest in the history, or its max"),
    INT("--fp8-margin", "fp8.margin", "precision", fp8_margin, 0, 64, "0",
        "fp8 scale margin: scales are divided by 2^margin"),
    ENUM("--on-nonfinite", "on_nonfinite", "precision", on_nonfinite, nonfinite_actions, "abort",
         "a non-finite loss or gradient (bf16, fp32): abort, or skip the step (fp16's loss scaler skips)"),
    DBL("--loss-scale", "fp16.loss_scale", "precision", loss_scale, 0, 1e38, "0",
        "static loss scale (0: dynamic)"),
    DBL("--initial-loss-scale", "fp16.initial_scale_power", "precision", initial_loss_scale, 1, 0x1p127,
        "4294967296", "initial dynamic loss scale (json: the power P of 2^P)", .conv = J_POW2),
    DBL("--min-loss-scale", "fp16.min_loss_scale", "precision", min_loss_scale, 0, 1e38, "1",
        "dynamic loss scale floor"),
    INT("--loss-scale-window", "fp16.loss_scale_window", "precision", loss_scale_window, 1, INT_MAX, "1000",
        "steps without overflow before the loss scale grows"),
    INT("--hysteresis", "fp16.hysteresis", "precision", hysteresis, 1, INT_MAX, "2",
        "overflows tolerated before the loss scale shrinks"),

    PATHS("--data-path", "data_path", "data", data_paths, ndata_paths,
          "training token shards (files or globs), or Megatron datasets: PREFIX ... or a weighted blend "
          "W1 PREFIX1 W2 PREFIX2 ..., cut by --split (default: the built-in corpus)"),
    PATHS("--train-data-path", "train_data_path", "data", train_data_paths, ntrain_paths,
          "Megatron's per-split blend for training (PREFIX ... or W PREFIX ...); for shards, --data-path"),
    PATHS("--valid-data-path", "valid_data_path", "data", valid_data_paths, nvalid_paths,
          "validation token shards, or Megatron's per-split blend for validation"),
    PATHS("--test-data-path", "test_data_path", "data", test_data_paths, ntest_paths,
          "Megatron's per-split blend for the test loss printed after training"),
    STR("--data-cache-path", "data_cache_path", "data", data_cache_path, "",
        "where Megatron datasets' indices are kept (.npy, as Megatron's) and mapped by later runs and other "
        "ranks (default: built in memory)"),
    STR("--split", "split", "data", split, "",
        "train,valid,test weights cutting --data-path's Megatron datasets (default 969,30,1 as Megatron's)"),
    BOOL("--mock-data", "mock_data", "data", mock_data, "0",
         "the built-in corpus (a synthetic one with a known entropy floor, generated once; Megatron's mock "
         "data): loom train's default without --data-path; loom eval scores it only when given"),
    STR("--tokenizer", "tokenizer", "data", tokenizer, "",
        "tokenizer.json, a SentencePiece tokenizer.model, or a directory with one of them or GPT-2's vocab.json "
        "+ merges.txt: its ids must fit the model's vocabulary; saved in every checkpoint; loom sample encodes "
        "the prompt and decodes with it"),
    STR("--tokenizer-type", "tokenizer_type", "data", tokenizer_type, "",
        "Megatron's: GPT2BPETokenizer (--vocab-file, --merge-file), HuggingFaceTokenizer, Llama2Tokenizer, "
        "SentencePieceTokenizer (--tokenizer-model: a tokenizer.json, a tokenizer.model or a directory), "
        "NullTokenizer (none: ids as they are)"),
    STR("--vocab-file", "vocab_file", "data", vocab_file, "", "GPT2BPETokenizer's vocab.json"),
    STR("--merge-file", "merge_file", "data", merge_file, "", "GPT2BPETokenizer's merges.txt"),
    STR("--tokenizer-model", "tokenizer_model", "data", tokenizer_model, "",
        "HuggingFaceTokenizer's tokenizer.json or directory; the SentencePiece types' tokenizer.model"),
    ENUM("--data-order", "data_order", "data", data_order, data_orders, "shuffled",
         "shuffled (from seed and step) or sequential (llm.c order)"),
    STR("--data-cache", "data_cache", "data", data_cache, "",
        "where the built-in corpus is generated (default ~/.cache/loom)"),
    BOOL("--reset-position-ids", NULL, "data", reset_position_ids, "0",
         "packed documents: positions restart at 0 after each end-of-document token"),
    BOOL("--reset-attention-mask", NULL, "data", reset_attention_mask, "0",
         "packed documents: a token attends only within its document (ends at each end-of-document token)"),
    BOOL("--eod-mask-loss", NULL, "data", eod_mask_loss, "0",
         "packed documents: no loss where the input token is the end-of-document token"),
    INT("--eod-token-id", NULL, "data", eod_token_id, -1, INT_MAX, "-1",
        "the end-of-document token (-1: the model family's end of text, GPT-2's <|endoftext|>)"),

    INT("--log-interval", "steps_per_print", "logging", log_interval, 1, INT_MAX, NULL,
        "steps between log lines"),
    INT("--eval-interval", "eval_interval", "logging", eval_interval, 0, INT_MAX, NULL,
        "steps between evaluations (0: only at the end)"),
    INT("--eval-iters", "eval_iters", "logging", eval_iters, 0, INT_MAX, "10", "batches per evaluation"),
    STR("--metrics", "metrics", "logging", metrics, "", "append one JSON line per logged step to FILE"),
    STR("--tensorboard-dir", "tensorboard_dir", "logging", tensorboard_dir, "",
        "write TensorBoard event files to DIR (the --metrics figures and the validation loss)"),
    INT("--tensorboard-log-interval", NULL, "logging", tensorboard_log_interval, 0, INT_MAX, "0",
        "TensorBoard's step scalars every N steps (Megatron's; 0: with the log lines)"),
    BOOL("--log-timers-to-tensorboard", NULL, "logging", log_timers_to_tensorboard, "0",
         "TensorBoard also gets the step's timers: the exposed communication wait and, pipelined, the bubble"),
    STR("--trace", "trace", "logging", trace, "",
        "write a Chrome trace (Perfetto, chrome://tracing) of every rank's steps to FILE"),
    STR("--trace-steps", "trace_steps", "logging", trace_steps, "",
        "steps A:B to trace (default: the first ten this run takes)"),

    STR("--load", "load", "checkpoint", load, "",
        "resume from checkpoint DIR (latest or an iter_NNNNNNN), or start from weights FILE.safetensors"),
    BOOL("--finetune", "finetune", "checkpoint", finetune, "0",
         "with --load: take the weights only; step 0, fresh optimizer state"),
    BOOL("--exit-on-missing-checkpoint", NULL, "checkpoint", exit_on_missing_checkpoint, "0",
         "a --load that is also --save and holds no checkpoint yet exits (default: training starts from the "
         "beginning, as Megatron's; a --load elsewhere without one always exits)"),
    BOOL("--no-load-optim", NULL, "checkpoint", no_load_optim, "0",
         "with --load (Megatron's): the weights and the step, the optimizer (and fp16's loss scale) afresh"),
    STR("--save", "save", "checkpoint", save, "",
        "write checkpoints to DIR/iter_NNNNNNN (at --save-interval and at the end)"),
    INT("--save-interval", "save_interval", "checkpoint", save_interval, 0, INT_MAX, "0",
        "steps between checkpoints (0: only at the end)"),
    INT("--exit-interval", NULL, "checkpoint", exit_interval, 0, INT_MAX, "0",
        "stop after a step that is a multiple of N, saving a checkpoint (Megatron; 0: never)"),
    DBL("--exit-duration-in-mins", NULL, "checkpoint", exit_duration_in_mins, 0, 1e9, "0",
        "stop at the first step boundary after this many minutes of training, saving a checkpoint (0: never)"),
    INT("--keep-last", "keep_last", "checkpoint", keep_last, 0, INT_MAX, "0",
        "keep only the K newest checkpoints (0: all)"),

    STR("--prompt", "prompt", "sampling", prompt, "", "text to continue (loom sample)"),
    INT("--max-new-tokens", "max_new_tokens", "sampling", max_new_tokens, 0, 1 << 20, "64",
        "tokens to generate (loom sample)"),
    DBL("--temperature", "temperature", "sampling", temperature, 0, 100, "1.0",
        "softmax temperature, 0 for greedy (loom sample)"),
    INT("--top-k", "top_k", "sampling", top_k, 0, 1 << 24, "0",
        "sample among the k most likely tokens (0: all)"),

    INT("--tensor-model-parallel-size", "tensor_model_parallel_size", "parallelism",
        tensor_model_parallel_size, 1, 4096, "1", "tensor-parallel group size"),
    INT("--expert-model-parallel-size", "expert_model_parallel_size", "parallelism",
        expert_model_parallel_size, 1, 4096, "1",
        "expert parallelism: each MoE layer's experts split over N data-parallel ranks"),
    ENUM("--moe-token-dispatcher-type", "moe_token_dispatcher_type", "parallelism", moe_token_dispatcher_type,
         moe_dispatchers, "alltoall",
         "expert parallelism's token moves: alltoall (each rank's rows to their experts' ranks and back) or "
         "allgather (every rank's rows gathered, the outputs reduce-scattered)"),
    INT("--context-parallel-size", "context_parallel_size", "parallelism", context_parallel_size, 1, 4096, "1",
        "context parallelism: each sequence split over N ranks (2N chunks, rank r holding r and 2N-1-r)"),
    ENUM("--cp-comm-type", "cp_comm_type", "parallelism", cp_comm_type, cp_comm_types, "p2p",
         "context parallelism's attention: p2p (key/value blocks around a ring), all_gather (keys and "
         "values gathered per layer) or a2a (DeepSpeed-Ulysses: all-to-all to head parts; heads divisible "
         "by N)"),
    BOOL("--sequence-parallel", "sequence_parallel", "parallelism", sequence_parallel, "0",
         "Megatron's sequence parallelism: norms and residuals split along the sequence in the tp group"),
    INT("--layout-invariant", "layout_invariant", "parallelism", layout_invariant, 0, 4096, "0",
        "take every sum tensor parallelism splits in N fixed pieces, exactly: runs at any "
        "--tensor-model-parallel-size dividing N give the same bits (0: off)"),
    INT("--pipeline-model-parallel-size", "pipeline_model_parallel_size", "parallelism",
        pipeline_model_parallel_size, 1, 4096, "1", "pipeline stages"),
    ENUM("--pipeline-schedule", "pipeline_schedule", "parallelism", pipeline_schedule, pipeline_schedules,
         "1f1b", "1f1b, gpipe (all forwards, then all backwards) or interleaved (virtual stages)"),
    INT("--num-layers-per-virtual-pipeline-stage", "num_layers_per_virtual_pipeline_stage", "parallelism",
        num_layers_per_virtual_pipeline_stage, 0, 1 << 20, "0",
        "interleaved schedule: layers per model chunk (0: not given)"),
    INT("--decoder-first-pipeline-num-layers", "decoder_first_pipeline_num_layers", "parallelism",
        decoder_first_pipeline_num_layers, 0, 1 << 20, "0", "layers on the first pipeline stage (0: balanced)"),
    INT("--decoder-last-pipeline-num-layers", "decoder_last_pipeline_num_layers", "parallelism",
        decoder_last_pipeline_num_layers, 0, 1 << 20, "0", "layers on the last pipeline stage (0: balanced)"),
    BOOL("--use-distributed-optimizer", "use_distributed_optimizer", "parallelism", use_distributed_optimizer,
         "0", "Megatron's distributed optimizer: ZeRO-1 (optimizer state sharded over the data-parallel group)"),
    DBL("--ddp-bucket-size", "zero_optimization.reduce_bucket_size", "parallelism", ddp_bucket_size,
        0.001, 1e6, "25", "MB of gradients per DDP all-reduce bucket (json: fp32 elements, 4 bytes each)",
        .conv = J_ELEMENTS_MB),
    BOOL("--no-overlap", "zero_optimization.overlap_comm", "parallelism", no_overlap, "0",
         "reduce gradients after the backward, not during it (json: overlap_comm is the inverse)",
         .conv = J_NOT),
    ENUM("--ddp-impl", "ddp_impl", "parallelism", ddp_impl, ddp_impls, "bucketed",
         "bucketed (overlapped) or naive (one all-reduce, the reference)"),
    INT("--zero-stage", "zero_optimization.stage", "parallelism", zero_stage, 0, 3, "0",
        "ZeRO stage: 0 DDP, 1 shard optimizer state, 2 and gradients, 3 and parameters"),
    ENUM("--fsdp-sharding-strategy", "fsdp_sharding_strategy", "parallelism", fsdp_sharding_strategy,
         fsdp_strategies, "none", "FSDP's names: FULL_SHARD (stage 3), SHARD_GRAD_OP (2), NO_SHARD (0)"),
    I64("--zero3-min-params", "zero3_min_params", "parallelism", zero3_min_params, 0, 9e15, "0",
        "stage 3 gathers consecutive blocks until they hold N parameters (0: one block)"),
    ENUM("--offload-optimizer", "zero_optimization.offload_optimizer.device", "parallelism",
         offload_optimizer, offload_devices, "none",
         "where the optimizer state lives: none, cpu (no-op on the CPU backend), nvme"),
    STR("--nvme-path", "zero_optimization.offload_optimizer.nvme_path", "parallelism", nvme_path, "",
        "directory for --offload-optimizer nvme"),
    ENUM("--offload-param", "zero_optimization.offload_param.device", "parallelism", offload_param,
         offload_devices, "none",
         "ZeRO-3: where each rank's parameter and gradient shards live: none, cpu (no-op on the CPU backend), "
         "nvme (a file in --nvme-path, paged in by the gather unit; needs --offload-optimizer nvme)"),
    STR("--offload-param-nvme-path", "zero_optimization.offload_param.nvme_path", "parallelism", param_nvme_path,
        "", "directory for --offload-param nvme (default: --nvme-path)"),
    ENUM("--offload", "offload", "parallelism", offload_auto, offload_modes, "none",
         "auto: offload (optimizer state, then ZeRO-3's shards) only what --mem-per-rank needs, placed at start-up "
         "by the trainer's own memory count and checked against the first step's peak RSS (needs --nvme-path)"),
    ENUM("--plugin", "plugin", "parallelism", plugin, plugins, "none",
         "one word for the layout, ColossalAI's and Accelerate's names: torch_ddp, torch_fsdp, low_level_zero "
         "(--plugin-stage 1|2), gemini (ZeRO-3, --offload auto), hybrid_parallel (--tp --pp --zero-stage), "
         "deepspeed (the JSON decides), megatron (the flags decide)"),
    INT("--plugin-stage", "plugin_stage", "parallelism", plugin_stage, 1, 2, "1",
        "low_level_zero's ZeRO stage (ColossalAI's LowLevelZeroPlugin(stage=))"),
    ENUM("--layout", "layout", "parallelism", layout_auto, layout_modes, "given",
         "auto: the fastest layout the planner finds that fits --mem-per-rank (or the machine's memory) on "
         "the ranks started; the settings given stay"),
    DBL("--mem-per-rank", "mem_per_rank", "parallelism", mem_per_rank, 0, 1e6, "0",
        "GB of memory a rank may hold, for --offload auto (0: the machine's memory over its ranks)"),
    BOOL("--offload-direct-io", "offload_direct_io", "parallelism", offload_direct_io, "0",
         "nvme offload's streaming with O_DIRECT where the file system allows it (default: through the page cache, "
         "measured faster on this machine even when memory is short: bench/README)"),
    DBL("--offload-buffer-size", "offload_buffer_size", "parallelism", offload_buffer_size, 0.001, 1e6, "64",
        "MB of optimizer state resident while streaming from nvme"),
    DBL("--comm-timeout", "comm_timeout", "parallelism", comm_timeout, 0.1, 1e7, "600",
        "seconds before a stuck collective aborts the job"),

    BOOL("--recompute-activations", "recompute_activations", "recompute", recompute_activations, "0",
         "Megatron's shorthand for --recompute-granularity selective"),
    ENUM("--recompute-granularity", "recompute_granularity", "recompute", recompute_granularity,
         recompute_granularities, "none",
         "selective: recompute attention probabilities; full: rerun a recomputed layer's forward"),
    ENUM("--recompute-method", "recompute_method", "recompute", recompute_method, recompute_methods, "none",
         "which layers full recomputation covers: uniform (all, in chunks of N) or block (the first N)"),
    INT("--recompute-num-layers", "activation_checkpointing.number_checkpoints", "recompute",
        recompute_num_layers, 0, 1 << 20, "0",
        "N: layers per chunk (uniform) or layers recomputed (block); 0: not given"),

    INT("--threads", "threads", "machine", threads, 0, 4096, "0",
        "threads for kernels and BLAS (0: all cores)"),
    STR("--backend", "backend", "machine", backend, "cpu",
        "the kernel backend: cpu; guarded (the CPU's kernels on memory only they can reach, for tests)"),
    DBL("--peak-tflops", "peak_tflops", "machine", peak_tflops, 0, 1e6, "0",
        "peak FLOP/s for MFU, in TFLOP/s (0: calibrate)"),
};
/* clang-format on */
#define NSETTINGS ((int)(sizeof loom_settings / sizeof loom_settings[0]))
static_assert(NSETTINGS <= LOOM_CONFIG_MAX_SETTINGS, "raise LOOM_CONFIG_MAX_SETTINGS (loom/config.h)");
const int loom_nsettings = NSETTINGS;

/* Other spellings of a flag. */
static const struct {
    const char *alias, *flag;
} flag_aliases[] = {
    {"--deepspeed_config", "--deepspeed-config"},
    /* ColossalAI's HybridParallelPlugin(tp_size, pp_size) */
    {"--tp", "--tensor-model-parallel-size"},
    {"--tp-size", "--tensor-model-parallel-size"},
    {"--pp", "--pipeline-model-parallel-size"},
    {"--pp-size", "--pipeline-model-parallel-size"},
};

int loom_setting_index(size_t offset)
{
    for (int i = 0; i < NSETTINGS; i++)
        if (loom_settings[i].offset == offset) return i;
    LOOM_ASSERT(0);
    return -1;
}

const struct setting *loom_setting_find(const char *flag, size_t len)
{
    for (size_t a = 0; a < sizeof flag_aliases / sizeof flag_aliases[0]; a++)
        if (strlen(flag_aliases[a].alias) == len && strncmp(flag_aliases[a].alias, flag, len) == 0) {
            flag = flag_aliases[a].flag;
            len = strlen(flag);
        }
    for (int i = 0; i < NSETTINGS; i++)
        if (strlen(loom_settings[i].flag) == len && strncmp(loom_settings[i].flag, flag, len) == 0)
            return &loom_settings[i];
    return NULL;
}

int loom_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            d[i][j] = c;
        }
    return d[la][lb];
}

const char *loom_setting_nearest(const char *flag)
{
    const char *best = NULL;
    int best_d = 1 << 30;
    for (int i = 0; i < NSETTINGS; i++) {
        int d = loom_edit_distance(flag, loom_settings[i].flag);
        if (d < best_d) best_d = d, best = loom_settings[i].flag;
    }
    return best_d <= 4 || (best && strstr(best, flag + 2)) ? best : NULL;
}
