/*
 * The one configuration structure. Every field is described once in the
 * settings table (src/engine/config.c): its flag, type, bounds, default and
 * help; parsing, validation, --help and the printed configuration all come
 * from that table. Precedence: defaults < preset (--model) < flags.
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

#define LOOM_MAX_DATA_PATHS 64

struct loom_config {
    /* the run itself */
    char deepspeed_config[512]; /* JSON config file, "" for none */
    int dry_run;                /* resolve and print the configuration, then exit */
    /* model */
    char model[32]; /* preset name, "" for none */
    int num_layers, hidden_size, num_attention_heads, seq_length, max_position_embeddings, vocab_size;
    /* batch: global = micro x accumulation x dp */
    int micro_batch_size, global_batch_size, gradient_accumulation_steps;
    /* optimisation */
    int train_iters, lr_warmup_iters, lr_decay_iters;
    double lr, min_lr, weight_decay, adam_beta1, adam_beta2, adam_eps, clip_grad;
    int lr_decay_style;                           /* enum loom_lr_decay_style */
    int lr_warmup_style;                          /* enum loom_lr_warmup_style */
    double lr_warmup_min_ratio, lr_cos_min_ratio; /* WarmupCosineLR */
    int optimizer;                                /* enum loom_optimizer */
    int adam_w_mode;                              /* 0: Adam with L2-coupled weight decay (not implemented) */
    int64_t seed;
    /* precision (mixed precision is not in the trainer yet) */
    int fp16, bf16;
    double loss_scale; /* 0: dynamic */
    double initial_loss_scale, min_loss_scale;
    int loss_scale_window, hysteresis;
    int on_nonfinite;      /* 0 abort, 1 skip */
    int grad_reduce_dtype; /* 0 fp32, 1 bf16, 2 fp16 (enum loom_dtype) */
    /* data */
    int ndata_paths, nvalid_paths;
    char *data_paths[LOOM_MAX_DATA_PATHS];
    char *valid_data_paths[LOOM_MAX_DATA_PATHS];
    int data_order; /* 0 shuffled, 1 sequential (enum loom_data_order) */
    char data_cache[512];
    /* logging and evaluation */
    int log_interval, eval_interval, eval_iters;
    char metrics[512];
    /* checkpoints */
    char load[512], save[512];
    int save_interval, keep_last, finetune;
    /* sampling (loom sample) */
    char prompt[1024];
    int max_new_tokens, top_k;
    double temperature;
    /* parallelism */
    int tensor_model_parallel_size, pipeline_model_parallel_size;
    double ddp_bucket_size; /* MB */
    int no_overlap;
    int ddp_impl;        /* 0 bucketed, 1 naive */
    double comm_timeout; /* seconds */
    int zero_stage;
    int fsdp_sharding_strategy; /* 0 unset, 1 FULL_SHARD, 2 SHARD_GRAD_OP, 3 NO_SHARD */
    int64_t zero3_min_params;
    int offload_optimizer; /* 0 none, 1 cpu, 2 nvme */
    char nvme_path[512];
    double offload_buffer_size; /* MB */
    /* activation recomputation (Megatron's) */
    int recompute_activations; /* Megatron's shorthand for recompute_granularity selective */
    int recompute_granularity; /* 0 none, 1 selective, 2 full (enum loom_recompute in model/gpt2.h) */
    int recompute_method;      /* 0 none, 1 uniform, 2 block (enum loom_recompute_method) */
    int recompute_num_layers;  /* N; 0: not given */
    /* machine */
    int threads;
    double peak_tflops;
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

#endif
