/*
 * Test tool: the logits and mean loss of a decoder family's model loaded
 * from a Hugging Face directory (the family config.json names, read through
 * the registry as `loom eval --load` reads it), for comparison with
 * transformers (tests/test_families_hf.py).
 *
 *   hf_logits DIR TOKENS.i32 OUT.safetensors B T
 *
 * TOKENS.i32 holds B rows of T+1 int32 tokens: inputs are each row's first
 * T, targets its last T. OUT holds "loss" [1], "logits" [B,T,V] and
 * "grad.<name>" for every parameter.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "engine/checkpoint.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "model/family.h"

static int fail(void)
{
    fprintf(stderr, "hf_logits: %s\n", loom_error_message());
    return 2;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: hf_logits DIR TOKENS OUT B T\n");
        return 2;
    }
    const int B = atoi(argv[4]), T = atoi(argv[5]);
    const struct loom_model_family *f = loom_checkpoint_source_family(argv[1]);
    struct loom_config cfg;
    struct loom_model_shape shape;
    int help = 0;
    if (!f || !f->read_shape) {
        fprintf(stderr, "hf_logits: %s: no family's directory\n", argv[1]);
        return 2;
    }
    char *none[] = {NULL};
    if (loom_config_parse(&cfg, 0, none, &help) || f->read_shape(argv[1], &cfg, &shape) ||
        f->apply_shape(&shape, &cfg))
        return fail();
    cfg.seq_length = T;
    if (f->check(&cfg, T)) return fail();
    struct loom_model *base = f->create(&cfg, B, T, 0, 0, 0);
    loom_model_alloc_arenas(base, 1, LOOM_MODEL_PARAM_ARENA | LOOM_MODEL_GRAD_ARENA);
    if (f->load_weights(base, argv[1])) return fail();
    struct loom_decoder *m = loom_decoder_of(base);
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)B * (T + 1));
    int32_t *inp = malloc(sizeof(int32_t) * (size_t)B * T), *tgt = malloc(sizeof(int32_t) * (size_t)B * T);
    FILE *fp = fopen(argv[2], "rb");
    if (!fp || fread(rows, sizeof(int32_t), (size_t)B * (T + 1), fp) != (size_t)B * (T + 1)) {
        fprintf(stderr, "hf_logits: cannot read %s\n", argv[2]);
        return 2;
    }
    fclose(fp);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            inp[b * T + t] = rows[b * (T + 1) + t];
            tgt[b * T + t] = rows[b * (T + 1) + t + 1];
        }
    float loss = loom_decoder_forward(m, inp, tgt, B);
    const int V = m->spec.vocab;
    float *logits = malloc(sizeof(float) * (size_t)B * T * V);
    loom_decoder_logits(m, logits);
    loom_model_zero_grad(base);
    loom_decoder_backward(m, 1.0f);
    int n = 2;
    for (int i = 0; i < base->nblocks; i++) n += base->blocks[i].ntensors;
    struct loom_st_tensor_in *ts = calloc((size_t)n, sizeof *ts);
    char(*names)[128] = calloc((size_t)n, sizeof *names);
    ts[0] = (struct loom_st_tensor_in){
        .name = "loss", .dtype = LOOM_DTYPE_F32, .ndim = 1, .shape = {1}, .data = &loss};
    ts[1] = (struct loom_st_tensor_in){
        .name = "logits", .dtype = LOOM_DTYPE_F32, .ndim = 3, .shape = {B, T, V}, .data = logits};
    for (int i = 0, k = 2; i < base->nblocks; i++)
        for (int j = 0; j < base->blocks[i].ntensors; j++, k++) {
            const struct loom_tensor *t = &base->blocks[i].tensors[j];
            snprintf(names[k], sizeof names[k], "grad.%s", t->name);
            ts[k] = (struct loom_st_tensor_in){.name = names[k],
                                               .dtype = LOOM_DTYPE_F32,
                                               .ndim = t->ndim,
                                               .shape = {t->shape[0], t->shape[1]},
                                               .data = base->blocks[i].work_grads + t->offset};
        }
    if (loom_st_write(argv[3], ts, n, NULL, 0)) return fail();
    free(ts), free(names);
    printf("loss %.6f\n", loss);
    free(rows), free(inp), free(tgt), free(logits);
    f->destroy(base);
    return 0;
}
