/*
 * The stage-local model interface, in one process: GPT-2's blocks split into
 * two ranges at every split point, two micro-batches in flight in two
 * activation slots, run in a one-forward-one-backward order (F0 F0' F1 B0'
 * F1' B0 B1' B1, where ' is the second range), must give every micro-batch's
 * loss and every parameter gradient BIT FOR BIT as the whole model run one
 * micro-batch after the other: the same kernels on the same inputs, with the
 * gradients accumulated in the same order. The boundary activations and
 * their gradients travel through caller-owned buffers, as a pipeline's
 * send/recv would carry them. Also: slot 1's forward leaves slot 0's saved
 * activations intact (its backward still matches), the announcements reach
 * a recording strategy once per block and micro-batch, and loom_model_eval
 * equals the forward's loss. All of it with the LM head tied to the
 * embedding (GPT-2's) and with a head of its own. Tolerance: none (exact),
 * because nothing in the arithmetic differs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/decoder_def.h"
#include "model/family.h"
#include "parallel/stack.h"

enum { L = 3, C = 32, NH = 4, MAXT = 16, V = 64, B = 2, T = 8, MICRO = 2 };

static int untied; /* the models made have an LM head of their own */

static struct loom_decoder *make_model(int slots)
{
    struct loom_config cfg; /* GPT-2's shape settings; the numerics its defaults */
    memset(&cfg, 0, sizeof cfg);
    cfg.num_layers = L;
    cfg.hidden_size = C;
    cfg.num_attention_heads = NH;
    cfg.max_position_embeddings = MAXT;
    cfg.vocab_size = V;
    cfg.norm_epsilon = 1e-5;
    cfg.activation_function = LOOM_ACTIVATION_GELU_NEW;
    cfg.untie_embeddings_and_output_weights = untied;
    const struct loom_decoder_spec spec = loom_decoder_def_spec(loom_gpt2_family.decoder, &cfg);
    struct loom_decoder *m = loom_decoder_create_whole(&spec, B, T);
    loom_model_alloc_arenas(&m->base, 1, LOOM_MODEL_PARAM_ARENA | LOOM_MODEL_GRAD_ARENA);
    loom_model_init_weights(&m->base, 7);
    if (slots > 1) m->base.ops->set_slots(&m->base, slots);
    return m;
}

/* Announcements seen per block: forward begin/end, backward begin, grads ready. */
struct counts {
    int fwd_begin[L + 2], fwd_end[L + 2], bwd_begin[L + 2], ready[L + 2];
};
static void c_pre_forward(void *ctx, int b)
{
    ((struct counts *)ctx)->fwd_begin[b]++;
}
static void c_post_forward(void *ctx, int b)
{
    ((struct counts *)ctx)->fwd_end[b]++;
}
static void c_pre_backward(void *ctx, int b)
{
    ((struct counts *)ctx)->bwd_begin[b]++;
}
static void c_grads_ready(void *ctx, int b)
{
    if (b >= 0) ((struct counts *)ctx)->ready[b]++;
}
static const struct loom_strategy counting = {.name = "count",
                                              .pre_forward = c_pre_forward,
                                              .post_forward = c_post_forward,
                                              .pre_backward = c_pre_backward,
                                              .grads_ready = c_grads_ready};

static void run(void)
{
    int32_t tokens[MICRO][B * T], targets[MICRO][B * T];
    for (int k = 0; k < MICRO; k++)
        for (int i = 0; i < B * T; i++) {
            tokens[k][i] = (i * 7 + k * 13 + 3) % V;
            targets[k][i] = (i * 5 + k * 11 + 1) % V;
        }
    struct loom_lm_batch batch[MICRO];
    for (int k = 0; k < MICRO; k++) batch[k] = (struct loom_lm_batch){tokens[k], targets[k]};
    const float weight = 1.0f / MICRO;

    /* the reference: the whole model, one micro-batch after the other */
    struct loom_decoder *ref = make_model(1);
    struct loom_model *r = &ref->base;
    const int n = r->nblocks;
    double ref_loss[MICRO];
    loom_model_zero_grad(r);
    for (int k = 0; k < MICRO; k++) {
        struct loom_micro mb = {.slot = 0, .batch = &batch[k], .rows = B};
        r->ops->forward(r, 0, n - 1, &mb);
        ref_loss[k] = mb.loss;
        CHECK(loom_model_eval(r, &batch[k], B) == (float)mb.loss); /* eval is the forward */
        r->ops->forward(r, 0, n - 1, &mb);
        r->ops->backward(r, 0, n - 1, &mb, weight);
    }
    const size_t NC = (size_t)B * T * C;
    CHECK(r->ops->boundary_numel(r, B) == NC);

    for (int split = 0; split < n - 1; split++) { /* ranges [0, split] and [split + 1, n - 1] */
        struct loom_decoder *g = make_model(MICRO);
        struct loom_model *m = &g->base;
        struct counts seen = {0};
        loom_model_push_strategy(m, &counting, &seen);
        loom_model_zero_grad(m);
        float *act[MICRO], *dact[MICRO];
        struct loom_micro first[MICRO], second[MICRO];
        for (int k = 0; k < MICRO; k++) {
            act[k] = calloc(NC, sizeof(float));
            dact[k] = calloc(NC, sizeof(float));
            first[k] = (struct loom_micro){.slot = k, .batch = &batch[k], .rows = B, .output = act[k]};
            second[k] = (struct loom_micro){.slot = k, .batch = &batch[k], .rows = B, .input = act[k]};
        }
        const int a0 = 0, a1 = split, b0 = split + 1, b1 = n - 1;
        /* warmup: both micro-batches forward through the first range */
        m->ops->forward(m, a0, a1, &first[0]);
        m->ops->forward(m, b0, b1, &second[0]);
        m->ops->forward(m, a0, a1, &first[1]);
        /* steady state: one backward, one forward */
        second[0].dinput = dact[0];
        m->ops->backward(m, b0, b1, &second[0], weight);
        m->ops->forward(m, b0, b1, &second[1]);
        first[0].doutput = dact[0];
        m->ops->backward(m, a0, a1, &first[0], weight);
        /* cooldown */
        second[1].dinput = dact[1];
        m->ops->backward(m, b0, b1, &second[1], weight);
        first[1].doutput = dact[1];
        m->ops->backward(m, a0, a1, &first[1], weight);

        char name[64];
        for (int k = 0; k < MICRO; k++) {
            snprintf(name, sizeof name, "%s, split %d: micro-batch %d loss", untied ? "untied" : "tied",
                     split, k);
            if (second[k].loss != ref_loss[k]) {
                fprintf(stderr, "FAIL %s: %.17g != %.17g\n", name, second[k].loss, ref_loss[k]);
                check_failures++;
            }
            check_count++;
        }
        for (int b = 0; b < n; b++) {
            snprintf(name, sizeof name, "%s, split %d: block %d gradients", untied ? "untied" : "tied", split,
                     b);
            check_close(name, m->blocks[b].work_grads, r->blocks[b].work_grads, m->blocks[b].numel, 0, 1);
            /* every block announced once per micro-batch, the tied embedding
             * twice: the second range holds the head, whose LM head reads its table */
            CHECK(seen.fwd_begin[b] == (b == g->emb && !untied ? 2 : 1) * MICRO);
            CHECK(seen.fwd_end[b] == seen.fwd_begin[b]);
            CHECK(seen.bwd_begin[b] == MICRO);
            CHECK(seen.ready[b] == MICRO);
        }
        for (int k = 0; k < MICRO; k++) {
            free(act[k]);
            free(dact[k]);
        }
        loom_decoder_free(g);
    }
    loom_decoder_free(ref);
}

int main(void)
{
    for (untied = 0; untied <= 1; untied++) run();
    return check_summary("test_stage_local");
}
