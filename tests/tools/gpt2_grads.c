/*
 * Test tool: one forward and backward of GPT-2 from given weights and
 * tokens, writing the loss and every parameter gradient for comparison with
 * PyTorch (tests/test_model_torch.py, tests/test_act_dtype_torch.py) and
 * between recompute settings (tests/test_recompute.py).
 *
 *   gpt2_grads [OPTIONS] WEIGHTS.safetensors TOKENS.i32 OUT.safetensors L C NH T V B [maxT]
 *
 * OPTIONS (before the positional arguments), as the model takes them:
 *   --act-dtype fp32|bf16|fp16              activations held in (m->act_dtype)
 *   --recompute none|selective|full         with full: --recompute-method
 *   --recompute-method uniform|block        uniform|block and
 *   --recompute-num-layers N                --recompute-num-layers N
 *   --norm-eps X                            LayerNorm's eps (default 1e-5)
 *   --activation gelu_new|gelu              the MLP's GELU
 *   --untied 0|1                            an LM head of its own
 *   --tp T                                  under mpirun with T ranks: each rank is tensor-parallel
 *                                           rank r (loom_decoder_create) and writes OUT.rank<r>
 *                                           with its parts: the logits of its vocabulary, the
 *                                           gradients of its part of each tensor
 *   --sp 0|1                                with --tp: sequence parallelism
 *   --tp-invariant N                        the split sums in N pieces (loom_decoder_set_tp_invariant)
 *
 * TOKENS.i32 holds B rows of T+1 int32 tokens: inputs are each row's first
 * T, targets its last T. OUT holds "loss" [1], "logits" [B,T,V] and
 * "grad.<name>" for every parameter.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "comm/comm.h"
#include "io/safetensors.h"
#include "model/decoder_def.h"
#include "model/family.h"
#include "model/hf_decoder.h"
#include "parallel/kinds.h"

/* The index of name in the NULL-terminated list, or -1. */
static int pick(const char *name, const char *const *names)
{
    for (int i = 0; names[i]; i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

int main(int argc, char **argv)
{
    static const char *const dtypes[] = {"fp32", "bf16", "fp16", NULL};
    static const char *const granularities[] = {"none", "selective", "full", NULL};
    static const char *const methods[] = {"none", "uniform", "block", NULL};
    int act_dtype = 0, granularity = 0, method = 0, num_layers = 0, activation = 0, untied = 0;
    double eps = 1e-5; /* GPT-2's */
    int tp = 1, sp = 0, invariant = 0;
    int first = 1; /* the first positional argument */
    for (; first + 1 < argc && strncmp(argv[first], "--", 2) == 0; first += 2) {
        const char *opt = argv[first], *v = argv[first + 1];
        int bad = 0;
        if (strcmp(opt, "--act-dtype") == 0)
            bad = (act_dtype = pick(v, dtypes)) < 0;
        else if (strcmp(opt, "--recompute") == 0)
            bad = (granularity = pick(v, granularities)) < 0;
        else if (strcmp(opt, "--recompute-method") == 0)
            bad = (method = pick(v, methods)) < 0;
        else if (strcmp(opt, "--recompute-num-layers") == 0)
            num_layers = atoi(v);
        else if (strcmp(opt, "--norm-eps") == 0)
            eps = strtod(v, NULL);
        else if (strcmp(opt, "--activation") == 0)
            bad = (activation = pick(v, loom_activation_names)) < 0;
        else if (strcmp(opt, "--untied") == 0)
            untied = atoi(v);
        else if (strcmp(opt, "--tp") == 0)
            bad = (tp = atoi(v)) < 1;
        else if (strcmp(opt, "--sp") == 0)
            sp = atoi(v);
        else if (strcmp(opt, "--tp-invariant") == 0)
            bad = (invariant = atoi(v)) < 1;
        else
            bad = 1;
        if (bad) {
            fprintf(stderr, "gpt2_grads: bad option %s %s\n", opt, v);
            return 2;
        }
    }
    argc -= first - 1;
    argv += first - 1;
    if (argc != 10 && argc != 11) {
        fprintf(stderr, "usage: gpt2_grads [OPTIONS] WEIGHTS TOKENS OUT L C NH T V B [maxT]\n");
        return 2;
    }
    int maxT = argc == 11 ? atoi(argv[10]) : atoi(argv[7]);
    struct loom_config cfg; /* GPT-2's shape settings */
    memset(&cfg, 0, sizeof cfg);
    cfg.num_layers = atoi(argv[4]);
    cfg.hidden_size = atoi(argv[5]);
    cfg.num_attention_heads = atoi(argv[6]);
    cfg.max_position_embeddings = maxT;
    cfg.vocab_size = atoi(argv[8]);
    cfg.norm_epsilon = eps;
    cfg.activation_function = (enum loom_activation)activation;
    cfg.untie_embeddings_and_output_weights = untied;
    int T = atoi(argv[7]), B = atoi(argv[9]);
    struct loom_topology topo = {.tp = 1, .tp_rank = 0};
    if (tp > 1) {
        loom_comm_init(&argc, &argv);
        if (loom_comm_setup(&topo, tp, 1)) {
            fprintf(stderr, "gpt2_grads: %s\n", loom_error_message());
            return 2;
        }
    }
    const struct loom_decoder_spec spec = loom_decoder_def_spec(loom_gpt2_family.decoder, &cfg);
    const int lo = 0, hi = cfg.num_layers - 1;
    struct loom_decoder *m = loom_decoder_create(&spec, B, T, tp, topo.tp_rank, 1, &lo, &hi, 1, 1);
    if (sp) { /* the norms' partial gradients are summed by sequence parallelism's strategy */
        loom_decoder_set_sequence_parallel(m, 1);
        loom_model_push_strategy(&m->base, &loom_sequence_strategy, &m->base);
    }
    if (invariant) loom_decoder_set_tp_invariant(m, invariant);
    loom_model_alloc_arenas(&m->base, 1, LOOM_MODEL_PARAM_ARENA | LOOM_MODEL_GRAD_ARENA);
    m->act_dtype = (enum loom_dtype)act_dtype;
    loom_decoder_set_recompute(m, (enum loom_recompute)granularity, (enum loom_recompute_method)method,
                               num_layers);
    if (loom_hf_load(&m->base, argv[1])) {
        fprintf(stderr, "gpt2_grads: %s\n", loom_error_message());
        return 2;
    }
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)B * (T + 1));
    int32_t *inp = malloc(sizeof(int32_t) * (size_t)B * T), *tgt = malloc(sizeof(int32_t) * (size_t)B * T);
    FILE *f = fopen(argv[2], "rb");
    if (!f || fread(rows, sizeof(int32_t), (size_t)B * (T + 1), f) != (size_t)B * (T + 1)) {
        fprintf(stderr, "gpt2_grads: cannot read %s\n", argv[2]);
        return 2;
    }
    fclose(f);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            inp[b * T + t] = rows[b * (T + 1) + t];
            tgt[b * T + t] = rows[b * (T + 1) + t + 1];
        }
    loom_model_zero_grad(&m->base);
    float loss = loom_decoder_forward(m, inp, tgt, B);
    /* keep the logits before backward turns them into dlogits */
    size_t nlogits = (size_t)B * T * m->Vl; /* this rank's vocabulary */
    float *logits = malloc(sizeof(float) * nlogits);
    loom_decoder_logits(m, logits);
    loom_decoder_backward(m, 1.0f);

    int n = 2;
    for (int i = 0; i < m->base.nblocks; i++) n += m->base.blocks[i].ntensors;
    struct loom_st_tensor_in *ts = calloc((size_t)n, sizeof *ts);
    char(*names)[80] = calloc((size_t)n, sizeof *names);
    ts[0] = (struct loom_st_tensor_in){
        .name = "loss", .dtype = LOOM_DTYPE_F32, .ndim = 1, .shape = {1}, .data = &loss};
    ts[1] = (struct loom_st_tensor_in){
        .name = "logits", .dtype = LOOM_DTYPE_F32, .ndim = 3, .shape = {B, T, m->Vl}, .data = logits};
    int k = 2;
    for (int i = 0; i < m->base.nblocks; i++)
        for (int j = 0; j < m->base.blocks[i].ntensors; j++, k++) {
            const struct loom_tensor *t = &m->base.blocks[i].tensors[j];
            snprintf(names[k], sizeof names[k], "grad.%s", t->name);
            ts[k].name = names[k];
            ts[k].dtype = LOOM_DTYPE_F32;
            ts[k].ndim = t->ndim;
            ts[k].shape[0] = t->shape[0];
            ts[k].shape[1] = t->shape[1];
            ts[k].data = m->base.blocks[i].work_grads + t->offset;
        }
    char out[4200];
    if (tp > 1)
        snprintf(out, sizeof out, "%s.rank%d", argv[3], topo.tp_rank);
    else
        snprintf(out, sizeof out, "%s", argv[3]);
    if (loom_st_write(out, ts, n, NULL, 0)) {
        fprintf(stderr, "gpt2_grads: %s\n", loom_error_message());
        return 1;
    }
    printf("loss %.6f\n", loss);
    free(ts);
    free(names);
    free(rows);
    free(inp);
    free(tgt);
    free(logits);
    loom_decoder_free(m);
    if (tp > 1) loom_comm_finalize();
    return 0;
}
