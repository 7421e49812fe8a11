/*
 * A built-in model family in a loop of your own: the model `loom train`
 * would build from --model (gpt2-tiny by default; any preset and shape
 * flag), trained by the engine on data this program makes up: sequences in
 * which each token follows from the one before (t' = 5t + 3 mod V, from a
 * start drawn per row), so the loss falls fast. It uses only loom's public
 * headers (loom/families.h makes the model), and the layout is the
 * configuration's, as for loom train:
 *
 *     build/examples/family_loop --train-iters 20
 *     mpirun -np 2 build/examples/family_loop --zero-stage 2 --metrics run.jsonl
 *     loom launch --nproc_per_node=2 build/examples/family_loop --tensor-model-parallel-size 2
 *
 * --metrics, --tensorboard-dir, --trace and --save work as under loom
 * train (the engine writes them for a program of its own). Each step
 * prints "step N loss L" (rank 0).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/engine.h"
#include "loom/families.h"
#include "loom/loom.h"
#include "loom/model.h"

struct data {
    const struct loom_config *cfg;
    int32_t *inputs, *targets; /* (B, T) each */
    struct loom_lm_batch b;
};

/* Row `row` of the endless data set: the same on every rank and layout. */
static void example(uint64_t row, int T, int V, int32_t *in, int32_t *out)
{
    uint64_t t = (row * 0x9e3779b97f4a7c15ull >> 17) % (uint64_t)V;
    for (int i = 0; i <= T; i++) {
        if (i < T) in[i] = (int32_t)t;
        if (i > 0) out[i - 1] = (int32_t)t;
        t = (5 * t + 3) % (uint64_t)V;
    }
}

/* This rank's micro-batch: rows of the step's global batch, as the engine says. */
static int next_batch(void *ctx, struct loom_engine *e, int micro, const void **batch, int *rows)
{
    struct data *d = ctx;
    const int B = d->cfg->micro_batch_size, T = d->cfg->seq_length;
    const uint64_t first = (uint64_t)loom_engine_steps_done(e) * (uint64_t)d->cfg->global_batch_size +
                           (uint64_t)loom_engine_micro_batch_rows(e, micro);
    for (int r = 0; r < B; r++)
        example(first + (uint64_t)r, T, d->cfg->vocab_size, d->inputs + (size_t)r * T,
                d->targets + (size_t)r * T);
    d->b = (struct loom_lm_batch){d->inputs, d->targets};
    *batch = &d->b;
    *rows = B;
    return LOOM_OK;
}

int main(int argc, char **argv)
{
    loom_init(&argc, &argv);
    struct loom_config cfg;
    int help, rc;
    if ((rc = loom_config_parse(&cfg, argc - 1, argv + 1, &help)) || help) {
        if (rc)
            fprintf(stderr, "family_loop: error: %s\n", loom_error_message());
        else
            printf("usage: family_loop [loom train flags: --model, shape, layout, --metrics, ...]\n");
        loom_config_free(&cfg);
        loom_finalize();
        return rc;
    }
    struct loom_engine *e = NULL;
    struct loom_model *model = NULL;
    if ((rc = loom_engine_init(&e, &cfg)) == LOOM_OK &&
        (rc = loom_family_model_create(e, &cfg, &model)) == LOOM_OK)
        rc = loom_engine_initialize(e, model);
    const size_t n = (size_t)cfg.micro_batch_size * (size_t)cfg.seq_length;
    struct data d = {&cfg, calloc(n + 1, sizeof(int32_t)), calloc(n + 1, sizeof(int32_t)), {0}};
    while (rc == LOOM_OK && loom_engine_steps_done(e) < cfg.train_iters) {
        struct loom_step_result res;
        rc = loom_engine_train_batch(e, next_batch, &d, &res);
        if (rc == LOOM_OK && loom_engine_dp_rank(e) == 0)
            printf("step %lld loss %.6f\n", (long long)res.step, res.loss);
    }
    if (rc == LOOM_OK && *cfg.save) rc = loom_engine_save(e);
    if (rc && loom_error_is_set()) fprintf(stderr, "family_loop: error: %s\n", loom_error_message());
    free(d.inputs);
    free(d.targets);
    loom_engine_free(e);
    loom_family_model_free(model);
    loom_config_free(&cfg);
    loom_finalize();
    return rc;
}
