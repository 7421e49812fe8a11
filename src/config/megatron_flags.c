/*
 * Megatron-LM's flags that name nothing loom has to set: CUDA kernel
 * fusions, overlaps loom always does, its logging services, its dataloader
 * and checkpoint formats. A script that sets them runs unchanged: each is
 * taken with one line saying why it has no effect here, or refused in one
 * line naming why when it asks for something loom does not build. The
 * flags loom honours are settings of their own (table.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "config/config_impl.h"
#include "loom/loom.h"

struct megatron_flag {
    const char *flag;
    int values;       /* values it takes: 0 (a switch), 1, or 3 (--rampup-batch-size) */
    const char *only; /* no effect with this value (compared as a number), refused with another; NULL: any */
    const char *why;  /* why it has no effect (or, refused, why not) */
    int refused;
    const char *off_why; /* with a value other than `only`: why it is refused */
};

/* The flags that are another name for one of loom's settings. */
struct megatron_alias {
    const char *flag;
    int values;     /* 0: sets `to` to `value`; 1: its value times `scale` */
    const char *to; /* loom's flag */
    const char *value;
    double scale;
};

static const struct megatron_alias aliases[] = {
    {"--use-torch-fsdp2", 0, "--fsdp-sharding-strategy", "FULL_SHARD", 0},
    {"--use-rotary-position-embeddings", 0, "--position-embedding-type", "rope", 0},
    {"--distributed-timeout-minutes", 1, "--comm-timeout", NULL, 60},
};

#define CUDA_FUSION "a CUDA kernel fusion: loom's CPU kernels are its own"

static const struct megatron_flag flags[] = {
    {"--use-mcore-models", 0, NULL,
     "loom's models are its own decoder, built from layer specs as Megatron-Core's", 0, NULL},
    {"--no-masked-softmax-fusion", 0, NULL, CUDA_FUSION, 0, NULL},
    {"--no-bias-dropout-fusion", 0, NULL, CUDA_FUSION, 0, NULL},
    {"--no-bias-gelu-fusion", 0, NULL, CUDA_FUSION, 0, NULL},
    {"--no-bias-swiglu-fusion", 0, NULL, CUDA_FUSION, 0, NULL},
    {"--no-rope-fusion", 0, NULL, CUDA_FUSION, 0, NULL},
    {"--no-gradient-accumulation-fusion", 0, NULL, CUDA_FUSION, 0, NULL},
    {"--cross-entropy-loss-fusion", 0, NULL, CUDA_FUSION, 0, NULL},
    {"--no-async-tensor-model-parallel-allreduce", 0, NULL,
     "a CUDA stream overlap: loom's tensor-parallel pairs "
     "run in the layer's order",
     0, NULL},
    {"--tp-comm-overlap", 0, NULL, "Transformer Engine's userbuffers overlap (CUDA)", 0, NULL},
    {"--attention-softmax-in-fp32", 0, NULL,
     "loom's attention keeps its softmax statistics in float32 always", 0, NULL},
    {"--overlap-grad-reduce", 0, NULL, "loom's DDP and ZeRO always reduce buckets during the backward", 0,
     NULL},
    {"--overlap-param-gather", 0, NULL, "ZeRO-3 always prefetches the next layers' parameters", 0, NULL},
    {"--moe-shared-expert-overlap", 0, NULL,
     "the shared experts always run while the all-to-all dispatcher's rows travel", 0, NULL},
    {"--use-contiguous-parameters-in-local-ddp", 0, NULL,
     "loom's parameters and gradients are one arena each", 0, NULL},
    {"--accumulate-allreduce-grads-in-fp32", 0, NULL,
     "gradients are reduced in float32 unless --grad-reduce-dtype "
     "says otherwise",
     0, NULL},
    {"--empty-unused-memory-level", 1, NULL,
     "PyTorch's CUDA caching allocator; loom's pool keeps what a step "
     "needs",
     0, NULL},
    {"--manual-gc", 0, NULL, "Python's garbage collector", 0, NULL},
    {"--manual-gc-interval", 1, NULL, "Python's garbage collector", 0, NULL},
    {"--distributed-backend", 1, NULL, "MPI carries every collective (NCCL and Gloo are PyTorch's)", 0, NULL},
    {"--num-workers", 1, NULL, "the data are mapped files read in the training process, no worker processes",
     0, NULL},
    {"--dataloader-type", 1, NULL,
     "loom reads the stream Megatron's dataset defines, each step's rows by step", 0, NULL},
    {"--no-create-attention-mask-in-dataloader", 0, NULL, "masks are computed in the attention kernel", 0,
     NULL},
    {"--wandb-project", 1, NULL,
     "Weights & Biases is not linked in: --tensorboard-dir and --metrics carry the "
     "figures",
     0, NULL},
    {"--wandb-exp-name", 1, NULL,
     "Weights & Biases is not linked in: --tensorboard-dir and --metrics carry the "
     "figures",
     0, NULL},
    {"--wandb-save-dir", 1, NULL,
     "Weights & Biases is not linked in: --tensorboard-dir and --metrics carry the "
     "figures",
     0, NULL},
    {"--transformer-impl", 1, NULL, "loom's kernels are its own (Transformer Engine is CUDA)", 0, NULL},
    {"--fp8-interval", 1, NULL, "deprecated in Transformer Engine; loom updates the fp8 scales every step", 0,
     NULL},
    {"--profile", 0, NULL, "--trace FILE writes the steps' timeline (Chrome's and Perfetto's format)", 0,
     NULL},
    {"--use-pytorch-profiler", 0, NULL,
     "--trace FILE writes the steps' timeline (Chrome's and Perfetto's format)", 0, NULL},
    {"--timing-log-level", 1, NULL, "--trace FILE writes the steps' timeline", 0, NULL},
    {"--log-params-norm", 0, NULL, "not logged; the gradient norm is on every step line", 0, NULL},
    {"--log-num-zeros-in-grad", 0, NULL, "not logged", 0, NULL},
    {"--log-validation-ppl-to-tensorboard", 0, NULL,
     "TensorBoard gets the validation loss; its perplexity is its "
     "exp",
     0, NULL},
    {"--log-memory-to-tensorboard", 0, NULL, "TensorBoard always gets memory/<category>-bytes", 0, NULL},
    {"--log-throughput", 0, NULL, "tokens/s and MFU are on every step line and in --metrics", 0, NULL},
    {"--use-checkpoint-args", 0, NULL, "loom's checkpoints carry the model's shape and --load reads it", 0,
     NULL},
    {"--ckpt-format", 1, NULL, "loom's checkpoints are its own, layout-free format (loom convert exports)", 0,
     NULL},
    {"--no-save-rng", 0, NULL,
     "loom's random draws are counted from the seed and step: there is no generator "
     "state to save",
     0, NULL},
    {"--no-load-rng", 0, NULL,
     "loom's random draws are counted from the seed and step: there is no generator "
     "state to load",
     0, NULL},
    {"--no-save-optim", 0, NULL,
     "loom's checkpoints keep the optimizer state (resumes are exact); it costs "
     "disk only",
     0, NULL},
    {"--moe-grouped-gemm", 0, NULL, "each local expert runs as one product on its rows", 0, NULL},
    {"--moe-router-dtype", 1, "fp32", "the router computes in float32", 0,
     "the router computes in float32 only"},
    {"--rotary-percent", 1, "1", "rotary embeddings cover the whole head", 0,
     "rotary embeddings over part of a head are not built (1.0 only)"},
    {"--no-position-embedding", 0, NULL, "--position-embedding-type decides (rope has no learned table)", 0,
     NULL},
    {"--apply-layernorm-1p", 0, NULL, "(1 + w) norms are the gemma family's (--model gemma-...)", 1, NULL},
    {"--qk-layernorm", 0, NULL, "query and key norms are not built", 1, NULL},
};

/* v is want: as numbers when want is one (0 and 0.0 alike), else as text. */
static int same_value(const char *v, const char *want)
{
    char *ev, *ew;
    const double a = strtod(v, &ev), b = strtod(want, &ew);
    if (ew != want && !*ew) return ev != v && !*ev && a == b;
    return strcmp(v, want) == 0;
}

/* An alias: its setting set (the origin a flag's). 1, or -1 with the error set. */
static int set_alias(struct loom_config *cfg, const struct megatron_alias *x, const char *value)
{
    char text[64];
    if (x->values) {
        char *end;
        const double v = strtod(value, &end);
        if (end == value || *end || v <= 0) {
            loom_error_set(LOOM_ERR_INPUT, "%s: expected a positive number, got '%s'", x->flag, value);
            return -1;
        }
        snprintf(text, sizeof text, "%.17g", v * x->scale);
    } else {
        snprintf(text, sizeof text, "%s", x->value);
    }
    const struct setting *s = loom_setting_find(x->to, strlen(x->to));
    if (!s || loom_setting_set(cfg, s, text) != LOOM_OK) { /* said in the user's own flag */
        char why[512];
        snprintf(why, sizeof why, "%s", loom_error_message());
        loom_error_set(LOOM_ERR_INPUT, "%s %s: it is %s %s, and %s", x->flag, value ? value : "", x->to, text,
                       why);
        return -1;
    }
    cfg->rec.origin[s - loom_settings] = LOOM_ORIGIN_FLAG;
    return 1;
}

int loom_megatron_flag(struct loom_config *cfg, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *eq = strchr(a, '=');
    const size_t len = eq ? (size_t)(eq - a) : strlen(a);
    for (size_t k = 0; k < sizeof aliases / sizeof aliases[0]; k++) {
        const struct megatron_alias *x = &aliases[k];
        if (strlen(x->flag) != len || strncmp(x->flag, a, len) != 0) continue;
        if (x->values && !eq && (*i + 1 >= argc || strncmp(argv[*i + 1], "--", 2) == 0)) {
            loom_error_set(LOOM_ERR_INPUT, "%s needs a value", x->flag);
            return -1;
        }
        return set_alias(cfg, x, !x->values ? NULL : eq ? eq + 1 : argv[++*i]);
    }
    const struct megatron_flag *f = NULL;
    for (size_t k = 0; k < sizeof flags / sizeof flags[0] && !f; k++)
        if (strlen(flags[k].flag) == len && strncmp(flags[k].flag, a, len) == 0) f = &flags[k];
    if (!f) return 0;
    const char *value = eq ? eq + 1 : NULL;
    char shown[256] = ""; /* its values as given */
    if (eq) snprintf(shown, sizeof shown, " %s", value);
    for (int taken = 0; f->values && !eq && taken < f->values; taken++) {
        if (*i + 1 >= argc || strncmp(argv[*i + 1], "--", 2) == 0) {
            loom_error_set(LOOM_ERR_INPUT, "%s needs %d value%s (Megatron's flag)", f->flag, f->values,
                           f->values == 1 ? "" : "s");
            return -1;
        }
        value = argv[++*i];
        const size_t at = strlen(shown);
        snprintf(shown + at, sizeof shown - at, " %s", value);
    }
    const int off_value = f->only && value && !same_value(value, f->only);
    if (f->refused || off_value) {
        loom_error_set(LOOM_ERR_INPUT, "%s%s: %s", f->flag, shown, off_value ? f->off_why : f->why);
        return -1;
    }
    loom_config_warn(cfg, "%s%s: no effect here: %s", f->flag, shown, f->why);
    return 1;
}
