/*
 * Test tool: one forward and backward of a Llama model from given weights
 * (a safetensors file under Hugging Face's names) and tokens, writing the
 * loss, the logits and every parameter gradient for comparison with
 * transformers' LlamaForCausalLM (tests/test_llama_hf.py).
 *
 *   llama_grads WEIGHTS.safetensors TOKENS.i32 OUT.safetensors L C NH G F T V B THETA EPS UNTIED
 *
 * TOKENS.i32 holds B rows of T+1 int32 tokens: inputs are each row's first
 * T, targets its last T. OUT holds "loss" [1], "logits" [B,T,V] and
 * "grad.<name>" for every parameter.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "model/family.h"
#include "model/model_io.h"

int main(int argc, char **argv)
{
    if (argc != 15) {
        fprintf(stderr, "usage: llama_grads WEIGHTS TOKENS OUT L C NH G F T V B THETA EPS UNTIED\n");
        return 2;
    }
    struct loom_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.num_layers = atoi(argv[4]);
    cfg.hidden_size = atoi(argv[5]);
    cfg.num_attention_heads = atoi(argv[6]);
    cfg.num_query_groups = atoi(argv[7]);
    cfg.ffn_hidden_size = atoi(argv[8]);
    cfg.max_position_embeddings = atoi(argv[9]);
    cfg.vocab_size = atoi(argv[10]);
    cfg.rotary_base = strtod(argv[12], NULL);
    cfg.norm_epsilon = strtod(argv[13], NULL);
    cfg.untie_embeddings_and_output_weights = atoi(argv[14]);
    cfg.normalization = LOOM_NORM_RMSNORM;
    cfg.position_embedding_type = LOOM_POSITION_ROPE;
    cfg.swiglu = cfg.disable_bias_linear = cfg.group_query_attention = 1;
    const int T = atoi(argv[9]), B = atoi(argv[11]);
    if (loom_llama_family.check(&cfg, T)) {
        fprintf(stderr, "llama_grads: %s\n", loom_error_message());
        return 2;
    }
    struct loom_decoder *m = loom_decoder_of(loom_llama_family.create(&cfg, B, T, 0, 0, 0));
    loom_model_alloc_arenas(&m->base, 1, LOOM_MODEL_PARAM_ARENA | LOOM_MODEL_GRAD_ARENA);
    struct loom_st st;
    if (loom_st_open(&st, argv[1]) || loom_model_read_tensors(&m->base, &st, argv[1], NULL)) {
        fprintf(stderr, "llama_grads: %s\n", loom_error_message());
        return 2;
    }
    loom_st_close(&st);
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)B * (T + 1));
    int32_t *inp = malloc(sizeof(int32_t) * (size_t)B * T), *tgt = malloc(sizeof(int32_t) * (size_t)B * T);
    FILE *f = fopen(argv[2], "rb");
    if (!f || fread(rows, sizeof(int32_t), (size_t)B * (T + 1), f) != (size_t)B * (T + 1)) {
        fprintf(stderr, "llama_grads: cannot read %s\n", argv[2]);
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
    const size_t nlogits = (size_t)B * T * cfg.vocab_size;
    float *logits = malloc(sizeof(float) * nlogits);
    memcpy(logits, m->slots[0].logits,
           nlogits * sizeof(float)); /* before the backward turns them to dlogits */
    loom_decoder_backward(m, 1.0f);

    int n = 2;
    for (int i = 0; i < m->base.nblocks; i++) n += m->base.blocks[i].ntensors;
    struct loom_st_tensor_in *ts = calloc((size_t)n, sizeof *ts);
    char(*names)[96] = calloc((size_t)n, sizeof *names);
    ts[0] = (struct loom_st_tensor_in){
        .name = "loss", .dtype = LOOM_DTYPE_F32, .ndim = 1, .shape = {1}, .data = &loss};
    ts[1] = (struct loom_st_tensor_in){.name = "logits",
                                       .dtype = LOOM_DTYPE_F32,
                                       .ndim = 3,
                                       .shape = {B, T, cfg.vocab_size},
                                       .data = logits};
    int k = 2;
    for (int i = 0; i < m->base.nblocks; i++)
        for (int j = 0; j < m->base.blocks[i].ntensors; j++, k++) {
            const struct loom_tensor *t = &m->base.blocks[i].tensors[j];
            snprintf(names[k], sizeof names[k], "grad.%s", t->name);
            ts[k] = (struct loom_st_tensor_in){.name = names[k],
                                               .dtype = LOOM_DTYPE_F32,
                                               .ndim = t->ndim,
                                               .shape = {t->shape[0], t->shape[1]},
                                               .data = m->base.blocks[i].work_grads + t->offset};
        }
    if (loom_st_write(argv[3], ts, n, NULL, 0)) {
        fprintf(stderr, "llama_grads: %s\n", loom_error_message());
        return 1;
    }
    printf("loss %.6f\n", loss);
    free(ts), free(names), free(rows), free(inp), free(tgt), free(logits);
    loom_decoder_free(m);
    return 0;
}
