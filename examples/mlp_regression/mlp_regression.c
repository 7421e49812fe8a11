/*
 * A model of your own under loom's engine: a 3-layer MLP regressor (D -> H ->
 * H -> 1, tanh) trained with mean squared error on data this program makes
 * up: y = sin(x . w) + 0.1 * cos(3 x0) for x drawn from N(0, 1). It uses only
 * loom's public headers. The same program trains with one process, DDP or
 * ZeRO-1/2/3, with the layout chosen by the configuration alone:
 *
 *     build/examples/mlp_regression --train-iters 50 --global-batch-size 16
 *     mpirun -np 2 build/examples/mlp_regression --train-iters 50 --global-batch-size 16 --zero-stage 3
 *     mpirun -np 2 build/examples/mlp_regression --deepspeed-config ds_config.json
 *
 * or with one word, ColossalAI's and Accelerate's strategy names:
 *
 *     mpirun -np 2 build/examples/mlp_regression --global-batch-size 16 --plugin torch_ddp
 *     mpirun -np 2 build/examples/mlp_regression --global-batch-size 16 --plugin torch_fsdp
 *     mpirun -np 2 build/examples/mlp_regression --global-batch-size 16 --plugin low_level_zero
 * --plugin-stage 2 mpirun -np 2 build/examples/mlp_regression --global-batch-size 16 --plugin megatron
 * --use-distributed-optimizer mpirun -np 2 build/examples/mlp_regression --plugin deepspeed
 * --deepspeed-config ds_config.json
 *
 * (gemini and --layout auto are loom train's: they count a model family's
 * memory, and the engine refuses them here with a line saying so). Tensor
 * and pipeline parallelism ask more of a model than this one gives (split
 * tensors; boundary_numel, set_slots and a stage's blocks only, see
 * loom/model.h): the engine refuses them with a line naming what is missing.
 *
 * Every loom setting is accepted (flags or DeepSpeed JSON); the model's own
 * sizes are the constants below. Each step prints "step N loss L" with L to
 * 17 digits (rank 0).
 *
 * How a model talks to the engine (loom/model.h): it is described as blocks
 * of named tensors; the engine allocates their flat buffers for the layout
 * (under ZeRO-3 a block's parameters exist only between
 * loom_model_forward_begin and _end, and from loom_model_backward_begin to
 * loom_model_grads_ready). Forward runs a range of blocks (here always all
 * of them: this model keeps one micro-batch's activations, one slot) and
 * leaves the micro-batch's mean loss in mb->loss; backward accumulates (+=)
 * loss_weight x its gradient.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/engine.h"
#include "loom/loom.h"
#include "loom/model.h"

enum { D = 8, H = 32, NLAYERS = 3 };

/* ---- data: row i of the endless data set, the same on every rank ------- */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double normal(uint64_t *s)
{
    double u1 = ((double)(splitmix(s) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = (double)(splitmix(s) >> 11) / 9007199254740992.0;
    return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Example `row` (global index): x (D) and its target y. */
static void example(uint64_t row, float *x, float *y)
{
    uint64_t s = row * 0x2545f4914f6cdd1dull + 7;
    double dot = 0;
    for (int d = 0; d < D; d++) {
        x[d] = (float)normal(&s);
        dot += x[d] * (0.5 - 0.1 * d);
    }
    *y = (float)(sin(dot) + 0.1 * cos(3 * x[0]));
}

struct batch {
    const float *x, *y; /* (rows, D), (rows) */
};

/* ---- the model ---------------------------------------------------------- */

struct mlp {
    struct loom_model base;
    int max_rows;
    float *in[NLAYERS];  /* each layer's input, (rows, width) */
    float *out[NLAYERS]; /* each layer's output after tanh (the last: the prediction) */
    float *dout, *din;   /* (rows, H) scratch */
    const float *y;
    int rows;
};

static const int width_in[NLAYERS] = {D, H, H}, width_out[NLAYERS] = {H, H, 1};

static void forward(struct loom_model *m, int first, int last, struct loom_micro *mb)
{
    struct mlp *net = m->user;
    const struct batch *b = mb->batch;
    const int rows = mb->rows;
    if (first != 0 || last != NLAYERS - 1) abort(); /* no pipeline stages for this model */
    net->rows = rows;
    net->y = b->y;
    memcpy(net->in[0], b->x, sizeof(float) * (size_t)rows * D);
    for (int l = 0; l < NLAYERS; l++) {
        loom_model_forward_begin(m, l);
        const float *w = loom_param(&m->blocks[l], 0), *bias = loom_param(&m->blocks[l], 1);
        const int n = width_in[l], k = width_out[l];
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < k; j++) {
                double acc = bias[j];
                for (int i = 0; i < n; i++) acc += net->in[l][r * n + i] * w[i * k + j];
                net->out[l][r * k + j] = l < NLAYERS - 1 ? (float)tanh(acc) : (float)acc;
            }
        loom_model_forward_end(m, l);
        if (l + 1 < NLAYERS) memcpy(net->in[l + 1], net->out[l], sizeof(float) * (size_t)rows * k);
    }
    double loss = 0;
    for (int r = 0; r < rows; r++) {
        double e = net->out[NLAYERS - 1][r] - b->y[r];
        loss += e * e;
    }
    mb->loss = (float)(loss / rows);
}

static void backward(struct loom_model *m, int first, int last, struct loom_micro *mb, float loss_weight)
{
    (void)first, (void)last, (void)mb; /* one range: the whole model, one slot */
    struct mlp *net = m->user;
    const int rows = net->rows;
    /* d(mean squared error)/d(prediction) */
    for (int r = 0; r < rows; r++)
        net->dout[r] = loss_weight * 2.0f * (net->out[NLAYERS - 1][r] - net->y[r]) / (float)rows;
    for (int l = NLAYERS - 1; l >= 0; l--) {
        loom_model_backward_begin(m, l);
        struct loom_block *blk = &m->blocks[l];
        const float *w = loom_param(blk, 0);
        float *dw = loom_grad(blk, 0), *db = loom_grad(blk, 1);
        const int n = width_in[l], k = width_out[l];
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < k; j++) {
                float g = net->dout[r * k + j];
                db[j] += g;
                for (int i = 0; i < n; i++) dw[i * k + j] += net->in[l][r * n + i] * g;
            }
        if (l > 0) { /* through this layer's input, the previous layer's tanh output */
            for (int r = 0; r < rows; r++)
                for (int i = 0; i < n; i++) {
                    double acc = 0;
                    for (int j = 0; j < k; j++) acc += net->dout[r * k + j] * w[i * k + j];
                    float t = net->in[l][r * n + i];
                    net->din[r * n + i] = (float)acc * (1 - t * t);
                }
            memcpy(net->dout, net->din, sizeof(float) * (size_t)rows * n);
        }
        loom_model_grads_ready(m, l);
    }
}

/* Weights uniform in +-1/sqrt(fan_in), biases 0, from (seed, block) alone. */
static void init_block(struct loom_model *m, int l, uint64_t seed)
{
    struct loom_block *blk = &m->blocks[l];
    uint64_t s = seed * 1000003u + (uint64_t)l;
    float *w = loom_param(blk, 0), *b = loom_param(blk, 1);
    const double a = 1.0 / sqrt((double)width_in[l]);
    for (size_t i = 0; i < blk->tensors[0].numel; i++)
        w[i] = (float)(a * (2.0 * (double)(splitmix(&s) >> 11) / 9007199254740992.0 - 1.0));
    memset(b, 0, sizeof(float) * blk->tensors[1].numel);
}

static const struct loom_model_ops mlp_ops = {
    .forward = forward, .backward = backward, .init_block = init_block};

static void mlp_build(struct mlp *net, int max_rows)
{
    loom_model_init(&net->base, &mlp_ops, "mlp_regression", NLAYERS);
    net->base.user = net;
    net->max_rows = max_rows;
    for (int l = 0; l < NLAYERS; l++) {
        char name[32];
        int64_t wshape[2] = {width_in[l], width_out[l]}, bshape[1] = {width_out[l]};
        snprintf(name, sizeof name, "layers.%d.weight", l);
        loom_block_add_tensor(&net->base.blocks[l], name, 2, wshape);
        snprintf(name, sizeof name, "layers.%d.bias", l);
        loom_block_add_tensor(&net->base.blocks[l], name, 1, bshape);
        net->in[l] = calloc((size_t)max_rows * width_in[l], sizeof(float));
        net->out[l] = calloc((size_t)max_rows * width_out[l], sizeof(float));
    }
    loom_model_layout_done(&net->base);
    net->dout = calloc((size_t)max_rows * H, sizeof(float));
    net->din = calloc((size_t)max_rows * H, sizeof(float));
}

static void mlp_free(struct mlp *net)
{
    loom_model_release(&net->base);
    for (int l = 0; l < NLAYERS; l++) {
        free(net->in[l]);
        free(net->out[l]);
    }
    free(net->dout);
    free(net->din);
}

/* ---- the loop ----------------------------------------------------------- */

struct data {
    struct loom_config *cfg;
    float *x, *y;
    struct batch b;
};

/* This rank's micro-batch: rows of the step's global batch, as the engine says. */
static int next_batch(void *ctx, struct loom_engine *e, int micro, const void **batch, int *rows)
{
    struct data *d = ctx;
    const int B = d->cfg->micro_batch_size;
    const uint64_t first = (uint64_t)loom_engine_steps_done(e) * (uint64_t)d->cfg->global_batch_size +
                           (uint64_t)loom_engine_micro_batch_rows(e, micro);
    for (int r = 0; r < B; r++) example(first + (uint64_t)r, d->x + (size_t)r * D, d->y + r);
    d->b = (struct batch){d->x, d->y};
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
            fprintf(stderr, "mlp_regression: error: %s\n", loom_error_message());
        else
            printf(
                "usage: mlp_regression [loom train flags, e.g. --zero-stage N, --deepspeed-config FILE]\n");
        loom_config_free(&cfg);
        loom_finalize();
        return rc;
    }
    struct loom_engine *e = NULL;
    struct mlp net;
    memset(&net, 0, sizeof net);
    if ((rc = loom_engine_init(&e, &cfg)) == LOOM_OK) {
        mlp_build(&net, cfg.micro_batch_size);
        rc = loom_engine_initialize(e, &net.base);
    }
    struct data d = {&cfg,
                     calloc((size_t)cfg.micro_batch_size * D + 1, sizeof(float)),
                     calloc((size_t)cfg.micro_batch_size + 1, sizeof(float)),
                     {0}};
    while (rc == LOOM_OK && loom_engine_steps_done(e) < cfg.train_iters) {
        struct loom_step_result res;
        rc = loom_engine_train_batch(e, next_batch, &d, &res);
        if (rc == LOOM_OK && loom_engine_dp_rank(e) == 0)
            printf("step %lld loss %.17g grad_norm %.17g\n", (long long)res.step, res.loss, res.grad_norm);
    }
    if (rc == LOOM_OK && *cfg.save) rc = loom_engine_save(e);
    if (rc && loom_error_is_set()) fprintf(stderr, "mlp_regression: error: %s\n", loom_error_message());
    free(d.x);
    free(d.y);
    loom_engine_free(e);
    mlp_free(&net);
    loom_config_free(&cfg);
    loom_finalize();
    return rc;
}
