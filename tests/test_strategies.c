/*
 * The data-parallel strategies (parallel/ddp.c, zero.c, precision.c) and
 * their stack (parallel/stack.c, model/model.c), in process, on a 5-block
 * MLP of the test's own (8 -> 16 -> 16 -> 12 -> 8 -> 1, ReLU; 733
 * parameters, so ZeRO pads its shards at 3 and 4 ranks). Run alone, or
 * under mpirun at 2, 3 and 4 ranks (tests/test_strategies.py); every rank
 * checks its own piece.
 *
 * 1. One step, then a second, through the public engine under: no strategy
 *    (DDP on more than one rank), DDP bucketed with 0.001 MB buckets (three
 *    buckets), the same with --no-overlap, DDP naive, ZeRO-1, ZeRO-2, ZeRO-3
 *    with a block per gather unit and with --zero3-min-params 300
 *    (multi-block units), and bf16 DDP (bucketed, naive), ZeRO-2 and
 *    ZeRO-3; each with gradient accumulation 1 and 2.
 * 2. After the first step, this rank's parameters (its ZeRO-3 shard, or all
 *    of them), its gradients (the ZeRO-2/3 shard, or all), its AdamW moments
 *    and (bf16) master weights equal the unsharded run's bit for bit; the
 *    shards' padding is zero. After the second step they agree within
 *    float32 (bf16: one bf16 step) rounding.
 * 3. DDP buckets, ZeRO partitions and ZeRO-3 gather units cover the model
 *    as documented (see check_buckets, check_partition, check_units).
 * 4. Hook order: a recording strategy at the bottom and the top of every
 *    engine's stack, and a stack built by hand (recorder, ZeRO-3, recorder,
 *    mixed precision, recorder) driven through the model and stack.h
 *    calls: in-bound hooks in stack order, out-bound ones in reverse, each
 *    block's pre_forward before its post_forward and pre_backward before
 *    its grads_ready, once per block per micro-batch; who provided each
 *    block's gradient view (grads_owner) and what each strategy holds
 *    (gathered parameters, working copies) at each point.
 *
 * The reference is the engine itself on a data-parallel world of one, in
 * this process: every rank trains the unsharded model on the whole global
 * batch (micro-batches of the same 4 rows, accumulation x dp of them).
 * loom_engine_init cannot make such an engine inside a multi-rank job (its
 * topology is the whole world), so the test sets the topology by hand
 * (engine_impl.h) and resolves the configuration for dp 1, before the comm
 * layer has made any group: until loom_comm_setup every collective is the
 * process's own (comm.c, local_only). The hand-built stack runs then too.
 *
 * Why bits can be compared: the ranks sum gradients in an order of MPI's
 * choosing, so in general only rounding-level agreement could be asked.
 * The first step here is exact arithmetic instead: inputs are multiples of
 * 1/2 in [-1, 1], targets multiples of 1/4, weights in {-1/4, 0, 1/4},
 * biases 0, so every value of the first forward and backward is an integer
 * times a power of two; the loss is 1.5 x the mean squared error, whose
 * derivative 3 (pred - y) / rows makes the engine's loss weight exact too
 * (at dp 3, float(1/3) x 3 rounds to exactly 1). exact_grads computes the
 * gradient in integers, independently of the engine, and checks that every
 * partial sum in any order stays below 2^24 units, so float32 sums are exact
 * whatever the order: any layout's gradient must then equal it bit for bit
 * (bf16: rounded once to nearest even), and AdamW, elementwise, gives the
 * same bits from the same gradient. The reference's first update is also
 * checked against AdamW's formula in double. The second step starts from
 * identical weights but its values are ordinary floats, so there the
 * comparison is within rounding. Clipping is off (a norm summed in another
 * order could change its coefficient's last bit).
 *
 * A single process runs without MPI (loom_init is called only under
 * mpirun), so the sanitizer build can check for leaks: Open MPI keeps
 * allocations until exit. Not here: fp16 and its loss scaler, 16-bit
 * gradient reduction (--grad-reduce-dtype), tied embeddings (GPT-2's
 * early wte bucket), offload, checkpoints: tests/test_ddp.py,
 * test_zero.py, test_mixed_precision.py, test_offload.py.
 */
#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/dtype.h"
#include "base/log.h"
#include "check.h"
#include "comm/comm.h"
#include "config/config.h"
#include "engine/engine_impl.h"
#include "kernels/pool.h"
#include "loom/engine.h"
#include "loom/loom.h"
#include "loom/model.h"
#include "parallel/ddp.h"
#include "parallel/precision.h"
#include "parallel/stack.h"

enum { NBLOCKS = 5, D = 8, MAX_WIDTH = 16, ROWS = 4, STEPS = 2, MAX_EVENTS = 4096 };
static const int width[NBLOCKS + 1] = {D, 16, 16, 12, 8, 1}; /* block l: width[l] -> width[l + 1] */

/* The settings every run shares (the AdamW constants repeated for adamw_formula). */
#define SEED 5
/* the engine's ZeRO strategy, or NULL */
#define ZERO(e) ((struct loom_zero *)(e)->state[LOOM_KIND_ZERO])
#define LR 0.01
#define WEIGHT_DECAY 0.1
#define BETA1 0.9
#define BETA2 0.95
#define ADAM_EPS 1e-8
/* clang-format off */
static const char *const common_flags[] = {
    "--train-iters", "2", "--lr", "0.01", "--lr-decay-style", "constant", "--lr-warmup-iters", "0",
    "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--adam-eps", "1e-8",
    "--clip-grad", "0", "--seed", "5", "--threads", "1", "--comm-timeout", "60", "--micro-batch-size", "4"};
/* clang-format on */

static int rank_, world_ = 1;
static const char *current = ""; /* the run being checked, for messages */

/* A check with a message: counted as check.h counts, printed with rank and run on failure. */
static void expect(int cond, const char *fmt, ...)
{
    check_count++;
    if (cond) return;
    check_failures++;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL [rank %d] %s: ", rank_, current);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ---- data and initial weights: integers times powers of two ------------- */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Example `row` (global index): x = xi / 2 with xi in [-2, 2], y = yq / 4 with yq in [-4, 4]. */
static void example_int(uint64_t row, int *xi, int *yq)
{
    uint64_t s = row * 0x2545f4914f6cdd1dull + 7;
    for (int d = 0; d < width[0]; d++) xi[d] = (int)(splitmix(&s) % 5) - 2;
    *yq = (int)(splitmix(&s) % 9) - 4;
}

/* Block l's weights are wi / 4 with wi drawn from this stream, in {-1, 0, 1}; biases 0. */
static uint64_t weight_stream(uint64_t seed, int l)
{
    return seed * 1000003u + (uint64_t)l + 1;
}
static int ternary(uint64_t *s)
{
    return (int)(splitmix(s) % 3) - 1;
}

/* bf16 rounded to nearest even, written out here (no NaN in this test). */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- the model: blocks of y = x W + b, ReLU between them ----------------- */

struct mlp {
    struct loom_model base;
    float *act[NBLOCKS + 1]; /* act[l] (ROWS, width[l]): block l's input; act[NBLOCKS]: the prediction */
    float *g, *gnext;        /* (ROWS, MAX_WIDTH): the gradient at a block's output, then at its input */
    const float *y;          /* (ROWS) the last forward's targets */
    int rows;
};

struct batch {
    const float *x, *y; /* (rows, width[0]), (rows) */
};

/* The loss is 1.5 x the mean squared error (see the top of the file). */
static void mlp_forward(struct loom_model *m, int first, int last, struct loom_micro *mb)
{
    struct mlp *net = m->user;
    const struct batch *b = mb->batch;
    LOOM_ASSERT(first == 0 && last == NBLOCKS - 1 && mb->rows <= ROWS); /* no pipeline stages */
    net->rows = mb->rows;
    net->y = b->y;
    memcpy(net->act[0], b->x, sizeof(float) * (size_t)mb->rows * (size_t)width[0]);
    for (int l = 0; l < NBLOCKS; l++) {
        loom_model_forward_begin(m, l);
        const struct loom_block *blk = &m->blocks[l];
        const float *w = loom_param(blk, 0), *bias = loom_param(blk, 1), *in = net->act[l];
        float *out = net->act[l + 1];
        const int n = width[l], k = width[l + 1];
        for (int r = 0; r < mb->rows; r++)
            for (int j = 0; j < k; j++) {
                double z = bias[j];
                for (int i = 0; i < n; i++) z += (double)in[r * n + i] * w[i * k + j];
                out[r * k + j] = l < NBLOCKS - 1 && z < 0 ? 0.0f : (float)z;
            }
        loom_model_forward_end(m, l);
    }
    double loss = 0;
    for (int r = 0; r < mb->rows; r++) {
        double e = (double)net->act[NBLOCKS][r] - b->y[r];
        loss += e * e;
    }
    mb->loss = 1.5 * loss / mb->rows;
}

static void mlp_backward(struct loom_model *m, int first, int last, struct loom_micro *mb, float loss_weight)
{
    (void)first, (void)last, (void)mb;
    struct mlp *net = m->user;
    const int rows = net->rows;
    float *g = net->g, *gnext = net->gnext;
    const float s = loss_weight * 3.0f; /* d(loss)/d(prediction) = 3 (pred - y) / rows */
    for (int r = 0; r < rows; r++) g[r] = s * (net->act[NBLOCKS][r] - net->y[r]) / (float)rows;
    for (int l = NBLOCKS - 1; l >= 0; l--) {
        loom_model_backward_begin(m, l);
        struct loom_block *blk = &m->blocks[l];
        const float *w = loom_param(blk, 0), *in = net->act[l];
        float *dw = loom_grad(blk, 0), *db = loom_grad(blk, 1);
        const int n = width[l], k = width[l + 1];
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < k; j++) {
                const float gj = g[r * k + j];
                db[j] += gj;
                for (int i = 0; i < n; i++) dw[i * k + j] += in[r * n + i] * gj;
            }
        if (l > 0) /* through the ReLU of the previous block's output */
            for (int r = 0; r < rows; r++)
                for (int i = 0; i < n; i++) {
                    double acc = 0;
                    for (int j = 0; j < k; j++) acc += (double)g[r * k + j] * w[i * k + j];
                    gnext[r * n + i] = in[r * n + i] > 0 ? (float)acc : 0.0f;
                }
        loom_model_grads_ready(m, l);
        float *t = g;
        g = gnext;
        gnext = t;
    }
}

static void mlp_init_block(struct loom_model *m, int l, uint64_t seed)
{
    struct loom_block *blk = &m->blocks[l];
    uint64_t s = weight_stream(seed, l);
    float *w = loom_param(blk, 0);
    for (size_t i = 0; i < blk->tensors[0].numel; i++) w[i] = 0.25f * (float)ternary(&s);
    memset(loom_param(blk, 1), 0, sizeof(float) * blk->tensors[1].numel);
}

static const struct loom_model_ops mlp_ops = {
    .forward = mlp_forward, .backward = mlp_backward, .init_block = mlp_init_block};

static void mlp_build(struct mlp *net)
{
    memset(net, 0, sizeof *net);
    loom_model_init(&net->base, &mlp_ops, "test_mlp", NBLOCKS);
    net->base.user = net;
    for (int l = 0; l < NBLOCKS; l++) {
        char name[32];
        int64_t wshape[2] = {width[l], width[l + 1]}, bshape[1] = {width[l + 1]};
        snprintf(name, sizeof name, "layers.%d.weight", l);
        loom_block_add_tensor(&net->base.blocks[l], name, 2, wshape);
        snprintf(name, sizeof name, "layers.%d.bias", l);
        loom_block_add_tensor(&net->base.blocks[l], name, 1, bshape);
    }
    for (int l = 0; l <= NBLOCKS; l++) net->act[l] = calloc((size_t)ROWS * (size_t)width[l], sizeof(float));
    net->g = calloc((size_t)ROWS * MAX_WIDTH, sizeof(float));
    net->gnext = calloc((size_t)ROWS * MAX_WIDTH, sizeof(float));
    loom_model_layout_done(&net->base);
}

static void mlp_free(struct mlp *net)
{
    loom_model_release(&net->base);
    for (int l = 0; l <= NBLOCKS; l++) free(net->act[l]);
    free(net->g);
    free(net->gnext);
}

/* This rank's micro-batch of the step's global batch, as the engine assigns rows. */
struct data {
    int global; /* rows per step, all ranks */
    float x[ROWS * D], y[ROWS];
    struct batch b;
};

static void fill_rows(struct data *d, uint64_t first, int rows)
{
    for (int r = 0; r < rows; r++) {
        int xi[D], yq;
        example_int(first + (uint64_t)r, xi, &yq);
        for (int c = 0; c < width[0]; c++) d->x[r * width[0] + c] = 0.5f * (float)xi[c];
        d->y[r] = 0.25f * (float)yq;
    }
    d->b = (struct batch){d->x, d->y};
}

static int next_batch(void *ctx, struct loom_engine *e, int micro, const void **batch, int *rows)
{
    struct data *d = ctx;
    fill_rows(d,
              (uint64_t)loom_engine_steps_done(e) * (uint64_t)d->global +
                  (uint64_t)loom_engine_micro_batch_rows(e, micro),
              ROWS);
    *batch = &d->b;
    *rows = ROWS;
    return LOOM_OK;
}

/* ---- the first step's gradient, in integers ------------------------------ */

/* The gradient of the first step over rows [0, G) (dp x accumulation x
 * ROWS) as float32, computed exactly: activations of block l's input are
 * integers in units of 2^-(1+2l), the prediction in units of 2^-(1+2L), and
 * d(loss)/d(pred) = 3 e / G. Returns 0 (and says why) when some partial sum
 * of a gradient element, in any order, or some value on the way, could
 * need more than float32's 24 bits: the data would then not test bits.
 * *nonzero: the smallest fraction of nonzero gradient elements of a block;
 * *bits: the most bits any partial sum or value needs. */
static int exact_grads(const struct loom_model *m, int G, float *out, double *nonzero, int *bits)
{
    const int L = NBLOCKS;
    const size_t N = m->num_params;
    int *wi[NBLOCKS];
    for (int l = 0; l < L; l++) {
        wi[l] = malloc(sizeof(int) * (size_t)width[l] * (size_t)width[l + 1]);
        uint64_t s = weight_stream(SEED, l);
        for (int i = 0; i < width[l] * width[l + 1]; i++) wi[l][i] = ternary(&s);
    }
    int64_t *sum = calloc(N, sizeof(int64_t)), *mag = calloc(N, sizeof(int64_t));
    int64_t most = 0; /* the largest magnitude of any value on the way */
    /* 3 / G = f3 x 2^-p, G = 2^p or 3 x 2^p */
    const int f3 = G % 3 ? 3 : 1, pow2 = G % 3 ? G : G / 3;
    int p = 0;
    while (1 << p < pow2) p++;
    LOOM_ASSERT(pow2 == 1 << p);
    for (int row = 0; row < G; row++) {
        int64_t a[NBLOCKS + 1][MAX_WIDTH], g[MAX_WIDTH], gp[MAX_WIDTH];
        int xi[D], yq;
        example_int((uint64_t)row, xi, &yq);
        for (int i = 0; i < width[0]; i++) a[0][i] = xi[i];
        for (int l = 0; l < L; l++)
            for (int j = 0; j < width[l + 1]; j++) {
                int64_t z = 0;
                for (int i = 0; i < width[l]; i++) z += a[l][i] * wi[l][i * width[l + 1] + j];
                a[l + 1][j] = l < L - 1 && z < 0 ? 0 : z;
                most = llabs(z) > most ? llabs(z) : most;
            }
        g[0] = a[L][0] - (int64_t)yq * ((int64_t)1 << (2 * L - 1)); /* y = yq / 4 in units of 2^-(1+2L) */
        most = f3 * llabs(g[0]) > most ? f3 * llabs(g[0]) : most;
        for (int l = L - 1; l >= 0; l--) {
            const struct loom_block *blk = &m->blocks[l];
            const int n = width[l], k = width[l + 1];
            const size_t ow = blk->offset + blk->tensors[0].offset, ob = blk->offset + blk->tensors[1].offset;
            for (int j = 0; j < k; j++) {
                sum[ob + j] += g[j];
                mag[ob + j] += llabs(g[j]);
                for (int i = 0; i < n; i++) {
                    sum[ow + i * k + j] += a[l][i] * g[j];
                    mag[ow + i * k + j] += llabs(a[l][i] * g[j]);
                }
            }
            if (l == 0) break;
            for (int i = 0; i < n; i++) {
                int64_t acc = 0;
                for (int j = 0; j < k; j++) acc += g[j] * wi[l][i * k + j];
                gp[i] = a[l][i] > 0 ? acc : 0;
                most = f3 * llabs(gp[i]) > most ? f3 * llabs(gp[i]) : most;
            }
            memcpy(g, gp, sizeof g);
        }
    }
    int64_t worst = 0;
    *nonzero = 1;
    for (int l = 0; l < L; l++) {
        const struct loom_block *blk = &m->blocks[l];
        size_t nz = 0;
        /* units: the gradient at block l's output is in 3/G x 2^-(1+2L) x 4^-(L-1-l) */
        const int eg = (1 + 2 * L) + 2 * (L - 1 - l) + p;
        for (int t = 0; t < 2; t++) {
            const struct loom_tensor *ten = &blk->tensors[t];
            const int e = eg + (t == 0 ? 1 + 2 * l : 0); /* weights: times the input's unit */
            for (size_t i = 0; i < ten->numel; i++) {
                const size_t at = blk->offset + ten->offset + i;
                out[at] = (float)ldexp((double)(f3 * sum[at]), -e);
                worst = f3 * mag[at] > worst ? f3 * mag[at] : worst;
                nz += sum[at] != 0;
            }
        }
        *nonzero = fmin(*nonzero, (double)nz / (double)blk->numel);
    }
    const int64_t limit = (int64_t)1 << 24;
    const int ok = worst < limit && most < limit;
    *bits = 0;
    while (((int64_t)1 << *bits) <= (worst > most ? worst : most)) (*bits)++;
    if (!ok)
        fprintf(stderr,
                "exact_grads: G %d needs %lld units in a partial sum, %lld on the way (limit %lld): the "
                "test's data no longer makes float32 exact\n",
                G, (long long)worst, (long long)most, (long long)limit);
    for (int l = 0; l < L; l++) free(wi[l]);
    free(sum);
    free(mag);
    return ok;
}

/* AdamW's first update from the initial weights and gradient g, in double:
 * p (1 - lr wd) - lr m^/(sqrt(v^) + eps) with m^ = g and v^ = g^2. */
static void adamw_formula(struct loom_model *m, const float *g, float *want)
{
    for (int l = 0; l < m->nblocks; l++) {
        const struct loom_block *blk = &m->blocks[l];
        float *p0 = malloc(sizeof(float) * blk->numel);
        loom_model_init_block(m, l, SEED, p0);
        for (int t = 0; t < blk->ntensors; t++) {
            const struct loom_tensor *ten = &blk->tensors[t];
            const double wd = ten->ndim >= 2 ? WEIGHT_DECAY : 0;
            for (size_t i = 0; i < ten->numel; i++) {
                const size_t at = blk->offset + ten->offset + i;
                const double gi = g[at], m1 = (1 - BETA1) * gi, v1 = (1 - BETA2) * gi * gi;
                const double upd = m1 / (1 - BETA1) / (sqrt(v1 / (1 - BETA2)) + ADAM_EPS);
                want[at] = (float)(p0[ten->offset + i] * (1 - LR * wd) - LR * upd);
            }
        }
        free(p0);
    }
}

/* ---- comparisons ------------------------------------------------------------ */

static double value_at(const void *p, size_t i, enum loom_dtype dt)
{
    return dt == LOOM_DTYPE_F32 ? ((const float *)p)[i] : from_bf16(((const uint16_t *)p)[i]);
}

/* Bit for bit (tol < 0), or within tol relative to max(|want|, floor_frac x
 * the largest |want|) as check_close; prints the first mismatches and the max
 * error. Returns the max relative error. */
static double compare(const char *what, const void *got, const void *want, size_t n, enum loom_dtype dt,
                      double tol, double floor_frac)
{
    const size_t es = loom_dtype_size(dt);
    double scale = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(value_at(want, i, dt)));
    const double fl = fmax(floor_frac * scale, 1e-30);
    double max_err = 0;
    size_t bad = 0;
    int shown = 0;
    for (size_t i = 0; i < n; i++) {
        const double a = value_at(got, i, dt), b = value_at(want, i, dt);
        const double err = fabs(a - b) / fmax(fabs(b), fl);
        const int wrong = tol < 0 ? memcmp((const char *)got + i * es, (const char *)want + i * es, es) != 0
                                  : !(err <= tol);
        if (err > max_err || err != err) max_err = err;
        if (!wrong) continue;
        if (shown++ < 5) fprintf(stderr, "  [rank %d] %s[%zu]: got %.9g want %.9g\n", rank_, what, i, a, b);
        bad++;
    }
    check_count++;
    if (bad) {
        check_failures++;
        if (tol < 0)
            fprintf(stderr, "FAIL [rank %d] %s: %s: %zu of %zu differ in bits, max rel err %.3g\n", rank_,
                    current, what, bad, n, max_err);
        else
            fprintf(stderr, "FAIL [rank %d] %s: %s: %zu of %zu mismatch, max rel err %.3g > tol %.3g\n",
                    rank_, current, what, bad, n, max_err, tol);
    }
    return max_err;
}

static void expect_zero(const char *what, const void *p, size_t bytes)
{
    size_t nz = 0;
    for (size_t i = 0; i < bytes; i++) nz += ((const unsigned char *)p)[i] != 0;
    expect(nz == 0, "%s: %zu nonzero bytes of %zu", what, nz, bytes);
}

/* ---- the recorder: a strategy that logs its hooks -------------------------- */

enum hook {
    HOOK_BEGIN_STEP = 0,
    HOOK_BEGIN_BACKWARD = 1,
    HOOK_PRE_FORWARD = 2,
    HOOK_POST_FORWARD = 3,
    HOOK_PRE_BACKWARD = 4,
    HOOK_GRADS_READY = 5,
    HOOK_FINISH_BACKWARD = 6,
    HOOK_AFTER_STEP = 7,
    HOOK_COUNT
};
static const char *const hook_names[] = {"begin_step",   "begin_backward", "pre_forward",     "post_forward",
                                         "pre_backward", "grads_ready",    "finish_backward", "after_step"};
static_assert(sizeof hook_names / sizeof hook_names[0] == HOOK_COUNT, "hook_names");

/* On the way in (stack order) or out (reverse), as loom/strategy.h documents. */
static int inbound(enum hook h)
{
    return h == HOOK_BEGIN_STEP || h == HOOK_BEGIN_BACKWARD || h == HOOK_PRE_FORWARD ||
           h == HOOK_PRE_BACKWARD;
}

struct event {
    enum hook hook;
    int who;         /* the recorder: 0 the bottom of the stack, nrec - 1 the top */
    int block;       /* -1 for step-level hooks */
    int micro, last; /* begin_backward's arguments; -1 elsewhere */
};

/* The layout around the recorders, and their log. */
struct scene {
    struct loom_model *model;
    int stage, bf16, accumulation, overlap;
    struct loom_zero *zero;      /* NULL when absent */
    struct loom_ddp *ddp;        /* NULL when absent */
    struct loom_precision *prec; /* NULL when absent */
    int nrec;
    int last; /* the backward in progress is the step's last */
    int nev, overflow;
    struct event ev[MAX_EVENTS];
};

struct recorder {
    struct scene *sc;
    int who;
};

/* Who must provide a block's float32 gradient view in this backward. */
static int expected_owner(const struct scene *sc)
{
    const struct loom_model *m = sc->model;
    if (sc->stage >= 2) return loom_model_strategy_index(m, sc->zero);
    /* mixed precision without a float32 accumulator: DDP's float32 buckets,
     * in the backward that reduces; with accumulation the accumulator is
     * the model's grad_acc, which precision provides */
    if (sc->ddp && sc->bf16 && sc->accumulation == 1 && sc->last)
        return loom_model_strategy_index(m, sc->ddp);
    if (sc->prec) return loom_model_strategy_index(m, sc->prec);
    return LOOM_GRADS_ARENA;
}

static int last_of_unit(const struct loom_zero *z, int b)
{
    return b == z->model->nblocks - 1 || z->unit_of[b + 1] != z->unit_of[b];
}

static void record(struct recorder *r, enum hook h, int block, int micro, int last)
{
    struct scene *sc = r->sc;
    if (sc->nev == MAX_EVENTS) {
        sc->overflow = 1;
        return;
    }
    sc->ev[sc->nev++] = (struct event){h, r->who, block, micro, last};
}

/* What each position sees. The top runs after every strategy on the way in
 * and before them on the way out; the bottom the opposite. The middle one
 * (the hand-built stack only) sits between ZeRO-3 below and precision above. */
static void rec_pre_forward(void *ctx, int b)
{
    struct recorder *r = ctx;
    struct scene *sc = r->sc;
    const struct loom_block *blk = &sc->model->blocks[b];
    record(r, HOOK_PRE_FORWARD, b, -1, -1);
    if (r->who == sc->nrec - 1) {
        expect(blk->params.data && blk->work_params, "top pre_forward(%d): parameters %p, working view %p", b,
               blk->params.data, (void *)blk->work_params);
        if (sc->stage == 3 && b > 0 && sc->zero->unit_of[b] == sc->zero->unit_of[b - 1]) {
            const struct loom_block *prev = &sc->model->blocks[b - 1];
            expect((const char *)blk->params.data ==
                       (const char *)prev->params.data + prev->numel * loom_dtype_size(sc->model->dtype),
                   "top pre_forward(%d): not gathered right after block %d in its unit", b, b - 1);
        }
    } else if (r->who > 0) {
        expect(
            blk->params.data && !blk->work_params,
            "middle pre_forward(%d): want ZeRO-3's gather done and no working copy yet (params %p, work %p)",
            b, blk->params.data, (void *)blk->work_params);
    }
}

static void rec_post_forward(void *ctx, int b)
{
    struct recorder *r = ctx;
    struct scene *sc = r->sc;
    const struct loom_block *blk = &sc->model->blocks[b];
    record(r, HOOK_POST_FORWARD, b, -1, -1);
    if (r->who > 0 && r->who < sc->nrec - 1)
        expect(blk->params.data && !blk->work_params,
               "middle post_forward(%d): want the working copy given back, the unit still held", b);
    if (r->who != 0) return;
    if (sc->prec) expect(!blk->work_params, "bottom post_forward(%d): a working copy is still held", b);
    /* (the unit of block 0 stays gathered to the step: see zero.c's pinned unit) */
    if (sc->stage == 3 && last_of_unit(sc->zero, b) && sc->zero->unit_of[b] != sc->zero->unit_of[0])
        for (int i = b; i >= 0 && sc->zero->unit_of[i] == sc->zero->unit_of[b]; i--)
            expect(!sc->model->blocks[i].params.data, "bottom post_forward(%d): block %d's unit not released",
                   b, i);
}

static void rec_pre_backward(void *ctx, int b)
{
    struct recorder *r = ctx;
    struct scene *sc = r->sc;
    const struct loom_model *m = sc->model;
    const struct loom_block *blk = &m->blocks[b];
    record(r, HOOK_PRE_BACKWARD, b, -1, -1);
    if (r->who == sc->nrec - 1) {
        const int want = expected_owner(sc);
        expect(blk->work_params && blk->work_grads && blk->grads_owner == want,
               "top pre_backward(%d): working views %p %p, grads_owner %d, want %d", b,
               (void *)blk->work_params, (void *)blk->work_grads, blk->grads_owner, want);
        if (want == LOOM_GRADS_ARENA)
            expect(blk->work_grads == (float *)m->grads.data + blk->offset,
                   "top pre_backward(%d): the arena's gradient view is not the arena's slice", b);
        if (sc->prec && want == loom_model_strategy_index(m, sc->prec) && m->grad_acc.data)
            expect(blk->work_grads == (float *)m->grad_acc.data + blk->offset,
                   "top pre_backward(%d): precision's view is not the float32 accumulator's slice", b);
    } else if (r->who > 0) {
        const int want = loom_model_strategy_index(m, sc->zero);
        expect(blk->work_grads && blk->grads_owner == want && !blk->work_params,
               "middle pre_backward(%d): want ZeRO's gradient buffer (owner %d, got %d) and no working copy "
               "yet (%p)",
               b, want, blk->grads_owner, (void *)blk->work_params);
    }
}

static void rec_grads_ready(void *ctx, int b)
{
    struct recorder *r = ctx;
    struct scene *sc = r->sc;
    const struct loom_model *m = sc->model;
    const struct loom_block *blk = &m->blocks[b];
    record(r, HOOK_GRADS_READY, b, -1, -1);
    const int want = expected_owner(sc);
    if (r->who == sc->nrec - 1)
        expect(blk->work_grads && blk->grads_owner == want, "top grads_ready(%d): grads_owner %d, want %d", b,
               blk->grads_owner, want);
    else if (r->who > 0)
        expect(blk->work_grads && blk->grads_owner == want && !blk->work_params,
               "middle grads_ready(%d): want ZeRO's buffer still there, precision's copy given back", b);
    else if (sc->prec && want == loom_model_strategy_index(m, sc->prec))
        expect(!blk->work_grads && blk->grads_owner == LOOM_GRADS_NONE,
               "bottom grads_ready(%d): precision kept its gradient view (owner %d)", b, blk->grads_owner);
    if (r->who != 0) return;
    /* the reductions start as soon as their gradients are complete, not before */
    if (sc->ddp && !sc->ddp->naive)
        for (int k = 0; k < sc->ddp->nbuckets; k++) {
            const struct loom_ddp_bucket *bk = &sc->ddp->buckets[k];
            const int done = bk->first_block >= b; /* the backward runs from the last block down */
            expect(!!bk->handle == (sc->overlap && sc->last && done),
                   "bottom grads_ready(%d): bucket %d (blocks %d-%d) %s", b, k, bk->first_block,
                   bk->last_block, bk->handle ? "already posted" : "not posted");
        }
    if (sc->stage >= 2)
        expect(sc->zero->norder > 0 && sc->zero->order[sc->zero->norder - 1] == b,
               "bottom grads_ready(%d): its reduce-scatter is not the last posted", b);
}

static void rec_begin_step(void *ctx)
{
    record(ctx, HOOK_BEGIN_STEP, -1, -1, -1);
}

static void rec_begin_backward(void *ctx, int micro, int last)
{
    struct recorder *r = ctx;
    r->sc->last = last;
    record(r, HOOK_BEGIN_BACKWARD, -1, micro, last);
}

static void rec_finish_backward(void *ctx)
{
    record(ctx, HOOK_FINISH_BACKWARD, -1, -1, -1);
}

/* At the bottom, after the step: nothing transient is left. */
static void rec_after_step(void *ctx)
{
    struct recorder *r = ctx;
    struct scene *sc = r->sc;
    const struct loom_model *m = sc->model;
    record(r, HOOK_AFTER_STEP, -1, -1, -1);
    if (r->who != 0) return;
    const int arena = expected_owner(sc) == LOOM_GRADS_ARENA;
    for (int b = 0; b < m->nblocks; b++) {
        const struct loom_block *blk = &m->blocks[b];
        if (sc->prec) expect(!blk->work_params, "after the step: block %d keeps a working copy", b);
        if (sc->stage == 3) expect(!blk->params.data, "after the step: block %d keeps its gathered unit", b);
        if (arena)
            expect(blk->work_grads == (float *)m->grads.data + blk->offset &&
                       blk->grads_owner == LOOM_GRADS_ARENA,
                   "after the step: block %d's gradient view left the arena", b);
        else
            expect(!blk->work_grads && blk->grads_owner == LOOM_GRADS_NONE,
                   "after the step: block %d's gradient view still provided (owner %d)", b, blk->grads_owner);
    }
}

static const struct loom_strategy recorder_strategy = {.name = "record",
                                                       .begin_step = rec_begin_step,
                                                       .begin_backward = rec_begin_backward,
                                                       .pre_forward = rec_pre_forward,
                                                       .post_forward = rec_post_forward,
                                                       .pre_backward = rec_pre_backward,
                                                       .grads_ready = rec_grads_ready,
                                                       .finish_backward = rec_finish_backward,
                                                       .after_step = rec_after_step};

static int push_event(struct event *list, int n, enum hook h, int who, int block, int micro, int last)
{
    if (n < MAX_EVENTS) list[n] = (struct event){h, who, block, micro, last};
    return n + 1;
}

/* One hook through every recorder: in stack order or in reverse. */
static int push_hook(struct event *list, int n, int nrec, enum hook h, int block, int micro, int last)
{
    for (int k = 0; k < nrec; k++)
        n = push_event(list, n, h, inbound(h) ? k : nrec - 1 - k, block, micro, last);
    return n;
}

static void format_event(char *buf, size_t size, const struct event *e)
{
    snprintf(buf, size, "%s(block %d, micro %d, last %d) at recorder %d", hook_names[e->hook], e->block,
             e->micro, e->last, e->who);
}

/* The step's log against the documented order, then the rules one by one. */
static void check_sequence(const struct scene *sc, const char *what)
{
    const int A = sc->accumulation, R = sc->nrec;
    expect(!sc->overflow, "%s: more than %d hook events", what, MAX_EVENTS);
    /* the whole sequence for this model, whose blocks run 0..L-1 forward and back */
    struct event *want = malloc(sizeof *want * MAX_EVENTS);
    int n = push_hook(want, 0, R, HOOK_BEGIN_STEP, -1, -1, -1);
    for (int a = 0; a < A; a++) {
        for (int b = 0; b < NBLOCKS; b++) {
            n = push_hook(want, n, R, HOOK_PRE_FORWARD, b, -1, -1);
            n = push_hook(want, n, R, HOOK_POST_FORWARD, b, -1, -1);
        }
        n = push_hook(want, n, R, HOOK_BEGIN_BACKWARD, -1, a, a == A - 1);
        for (int b = NBLOCKS - 1; b >= 0; b--) {
            n = push_hook(want, n, R, HOOK_PRE_BACKWARD, b, -1, -1);
            n = push_hook(want, n, R, HOOK_GRADS_READY, b, -1, -1);
        }
    }
    n = push_hook(want, n, R, HOOK_FINISH_BACKWARD, -1, -1, -1);
    n = push_hook(want, n, R, HOOK_AFTER_STEP, -1, -1, -1);
    int first = -1;
    for (int i = 0; i < n && i < sc->nev && first < 0; i++) {
        const struct event *x = &want[i], *y = &sc->ev[i];
        if (x->hook != y->hook || x->who != y->who || x->block != y->block || x->micro != y->micro ||
            x->last != y->last)
            first = i;
    }
    if (first < 0 && n != sc->nev) first = n < sc->nev ? n : sc->nev;
    char g[128] = "(none)", w[128] = "(none)";
    if (first >= 0 && first < sc->nev) format_event(g, sizeof g, &sc->ev[first]);
    if (first >= 0 && first < n) format_event(w, sizeof w, &want[first]);
    expect(first < 0, "%s: hook %d of %d (%d expected) is %s, want %s", what, first, sc->nev, n, g, w);
    free(want);

    /* the rules one by one, whatever the blocks' order: each hook passes
     * through the recorders in stack order on the way in, in reverse on the
     * way out */
    int bad_order = 0;
    for (int i = 0; i < sc->nev; i++) {
        const struct event *e = &sc->ev[i], *f = i + 1 < sc->nev ? &sc->ev[i + 1] : NULL;
        const int next = inbound(e->hook) ? e->who + 1 : e->who - 1;
        if (next >= 0 && next < R)
            bad_order += !f || f->hook != e->hook || f->who != next || f->block != e->block;
    }
    expect(bad_order == 0, "%s: %d hooks not passed on in stack order (way in) or reverse (way out)", what,
           bad_order);
    /* and each recorder sees, per micro-batch, every block's pre_forward
     * then its post_forward once, then every block's pre_backward then its
     * grads_ready once */
    for (int r = 0; r < R; r++) {
        int in[NBLOCKS] = {0}, out[NBLOCKS] = {0}, backward = 0, backwards = 0, bad_pair = 0, bad_count = 0;
        for (int i = 0; i < sc->nev; i++) {
            const struct event *e = &sc->ev[i];
            if (e->who != r) continue;
            const int fwd = e->hook == HOOK_PRE_FORWARD || e->hook == HOOK_POST_FORWARD;
            const int bwd = e->hook == HOOK_PRE_BACKWARD || e->hook == HOOK_GRADS_READY;
            /* a forward ends at begin_backward, a backward at the next forward or finish_backward */
            if (e->hook == HOOK_BEGIN_BACKWARD || (backward && (fwd || e->hook == HOOK_FINISH_BACKWARD))) {
                for (int b = 0; b < NBLOCKS; b++) {
                    bad_count += in[b] != 1 || out[b] != 1;
                    in[b] = out[b] = 0;
                }
                backward = e->hook == HOOK_BEGIN_BACKWARD;
                backwards += backward;
            }
            if (fwd || bwd) {
                bad_pair += bwd != backward;
                if (e->hook == HOOK_PRE_FORWARD || e->hook == HOOK_PRE_BACKWARD)
                    in[e->block]++;
                else /* post_forward after its pre_forward, grads_ready after its pre_backward */
                    bad_pair += ++out[e->block] != in[e->block];
            }
        }
        expect(backwards == A, "%s: recorder %d saw %d backwards, want %d", what, r, backwards, A);
        expect(bad_pair == 0, "%s: recorder %d: %d block hooks out of place", what, r, bad_pair);
        expect(bad_count == 0, "%s: recorder %d: %d (block, micro-batch, direction) not seen exactly once",
               what, r, bad_count);
    }
}

/* ---- layouts: buckets, shards, units ----------------------------------------- */

/* DDP's buckets: every block in exactly one, in reverse block order (the
 * first bucket ends at the last block), each bucket's count its blocks'
 * parameters, each at least the cap but the last, closed as soon as it
 * reaches the cap (DDP's bucket_cap_mb). Returns the bucket count. */
static int check_buckets(const struct loom_ddp *d, const struct loom_model *m, double bucket_mb, char *desc,
                         size_t size)
{
    const size_t cap = (size_t)(bucket_mb * 1e6 / sizeof(float));
    int next = m->nblocks - 1;
    desc[0] = 0;
    for (int i = 0; i < d->nbuckets; i++) {
        const struct loom_ddp_bucket *b = &d->buckets[i];
        expect(b->last_block == next && b->first_block <= b->last_block,
               "bucket %d covers blocks [%d, %d], want it to end at block %d", i, b->first_block,
               b->last_block, next);
        size_t count = 0;
        for (int k = b->first_block; k <= b->last_block && k >= 0; k++) {
            count += m->blocks[k].numel;
            expect(d->bucket_of[k] == i, "block %d: bucket_of %d, want %d", k, d->bucket_of[k], i);
        }
        expect(b->f32.numel == count, "bucket %d: %zu elements, its blocks hold %zu", i, b->f32.numel, count);
        expect(i == d->nbuckets - 1 || count >= cap, "bucket %d: %zu elements, below the cap %zu", i, count,
               cap);
        expect(count - m->blocks[b->first_block].numel < cap,
               "bucket %d: %zu elements without block %d, >= cap %zu", i,
               count - m->blocks[b->first_block].numel, b->first_block, cap);
        if (m->dtype == LOOM_DTYPE_F32)
            expect(b->f32.data == (float *)m->grads.data + m->blocks[b->first_block].offset,
                   "bucket %d does not reduce the gradient arena in place", i);
        size_t l = strlen(desc);
        snprintf(desc + l, size - l, "%s[%d-%d] %zu", i ? ", " : "", b->last_block, b->first_block, count);
        next = b->first_block - 1;
    }
    expect(next == -1, "the buckets end at block %d, want 0", next + 1);
    return d->nbuckets;
}

/* ZeRO's partition: equal shards, rank r's [begin, end) = [r S, min((r+1) S,
 * N)), together exactly [0, N), padding (fewer than dp elements) only in the
 * last; the same as the engine's and the strategy's. */
static void check_partition(const struct loom_engine *e, char *desc, size_t size)
{
    const struct loom_model *m = e->model;
    const int dp = loom_engine_dp_size(e);
    const struct loom_partition p = e->part, zp = ZERO(e)->part;
    expect(p.shard == zp.shard && p.begin == zp.begin && p.end == zp.end,
           "the engine's partition [%zu, %zu) of %zu and ZeRO's [%zu, %zu) of %zu differ", p.begin, p.end,
           p.shard, zp.begin, zp.end, zp.shard);
    uint64_t mine[3] = {p.shard, p.begin, p.end}, *all = calloc(3 * (size_t)dp, sizeof(uint64_t));
    loom_comm_wait(loom_comm_allgather(LOOM_GROUP_DP, loom_buf_of(mine, 3, LOOM_DTYPE_U64),
                                       loom_buf_of(all, 3 * (size_t)dp, LOOM_DTYPE_U64)));
    const size_t N = m->num_params;
    size_t covered = 0;
    for (int r = 0; r < dp; r++) {
        const uint64_t shard = all[3 * r], begin = all[3 * r + 1], end = all[3 * r + 2];
        const uint64_t want_end = (r + 1) * shard < N ? (r + 1) * shard : N;
        expect(shard == all[0], "rank %d's shard %llu, rank 0's %llu", r, (unsigned long long)shard,
               (unsigned long long)all[0]);
        expect(begin == covered && begin == r * shard && end == want_end,
               "rank %d holds [%llu, %llu), want [%llu, %llu)", r, (unsigned long long)begin,
               (unsigned long long)end, (unsigned long long)covered, (unsigned long long)want_end);
        expect(r == dp - 1 || end - begin == shard, "rank %d (not the last) has %llu padding", r,
               (unsigned long long)(shard - (end - begin)));
        covered = end;
    }
    expect(covered == N, "the shards cover [0, %zu), want [0, %zu)", covered, N);
    expect(all[0] * (size_t)dp == m->arena_numel && m->arena_numel - N < (size_t)dp,
           "shards of %llu x %d ranks for an arena of %zu, %zu parameters", (unsigned long long)all[0], dp,
           m->arena_numel, N);
    snprintf(desc, size, "shards of %zu, padding %zu", p.shard, m->arena_numel - N);
    free(all);
}

/* ZeRO-3's gather units: consecutive blocks, in order, covering the model;
 * one block each without --zero3-min-params, else each closed as soon as it
 * holds min_params (all but the last hold at least that many). */
static void check_units(const struct loom_zero *z, const struct loom_model *m, int64_t min_params, char *desc,
                        size_t size)
{
    const int *u = z->unit_of;
    expect(u[0] == 0 && u[m->nblocks - 1] == z->nunits - 1, "units run %d..%d, want 0..%d", u[0],
           u[m->nblocks - 1], z->nunits - 1);
    desc[0] = 0;
    for (int b = 0, first = 0; b < m->nblocks; b++) {
        if (b > 0)
            expect(u[b] == u[b - 1] || u[b] == u[b - 1] + 1, "block %d in unit %d after %d", b, u[b],
                   u[b - 1]);
        if (!last_of_unit(z, b)) continue;
        int64_t held = 0;
        for (int k = first; k <= b; k++) held += (int64_t)m->blocks[k].numel;
        const int64_t without_last = held - (int64_t)m->blocks[b].numel;
        if (min_params == 0)
            expect(first == b, "unit %d holds blocks %d..%d, want one block per unit", u[b], first, b);
        else
            expect((b == m->nblocks - 1 || held >= min_params) && (first == b || without_last < min_params),
                   "unit %d holds blocks %d..%d (%lld parameters) for --zero3-min-params %lld", u[b], first,
                   b, (long long)held, (long long)min_params);
        size_t l = strlen(desc);
        snprintf(desc + l, size - l, "%s[%d-%d] %lld", first ? ", " : "", first, b, (long long)held);
        first = b + 1;
    }
}

/* ---- the reference: the engine on a data-parallel world of one -------------- */

struct snapshot {
    void *params, *grads;  /* (num_params) in dtype */
    float *m, *v, *master; /* (num_params); master under mixed precision only */
    double loss, norm;
};

static void snapshot_free(struct snapshot *s)
{
    free(s->params);
    free(s->grads);
    free(s->m);
    free(s->v);
    free(s->master);
}

static void *copy_of(const void *p, size_t bytes)
{
    void *c = malloc(bytes ? bytes : 1);
    if (bytes) memcpy(c, p, bytes);
    return c;
}

/* argv from the shared flags, the layout's and the accumulation. */
static int parse(struct loom_config *cfg, const char *const *flags, int nflags, int accumulation)
{
    const char *argv[64];
    char acc[16];
    int argc = 0;
    for (size_t i = 0; i < sizeof common_flags / sizeof common_flags[0]; i++) argv[argc++] = common_flags[i];
    for (int i = 0; i < nflags; i++) argv[argc++] = flags[i];
    snprintf(acc, sizeof acc, "%d", accumulation);
    argv[argc++] = "--gradient-accumulation-steps";
    argv[argc++] = acc;
    int help = 0;
    int rc = loom_config_parse(cfg, argc, (char **)argv, &help);
    expect(rc == LOOM_OK, "configuration: %s", loom_error_message());
    return rc;
}

/* Trains the reference for (bf16, accumulation A per rank) two steps into
 * snap[]; checks its first gradient against exact_grads and its first
 * update against AdamW's formula. */
static void reference(int bf16, int A, struct snapshot snap[STEPS])
{
    char name[96];
    snprintf(name, sizeof name, "reference%s, accumulation %d x %d", bf16 ? " bf16" : "", A, world_);
    current = name;
    const char *flags[] = {"--bf16"};
    struct loom_config cfg;
    struct mlp net;
    mlp_build(&net);
    struct loom_model *m = &net.base;
    struct loom_engine *e = calloc(1, sizeof *e);
    e->cfg = &cfg;
    e->topo = (struct loom_topology){.world = 1, .dp = 1, .tp = 1, .pp = 1, .cp = 1};
    int rc = parse(&cfg, flags, bf16, A * world_);
    if (rc == LOOM_OK) rc = loom_kinds_resolve(&cfg, 1);
    if (rc == LOOM_OK) rc = loom_engine_initialize(e, m);
    expect(rc == LOOM_OK, "engine: %s", loom_error_message());
    const size_t N = m->num_params, es = loom_dtype_size(bf16 ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F32);
    char stack[128];
    loom_stack_format(m, stack, sizeof stack);
    expect(strcmp(stack, bf16 ? "precision" : "none") == 0, "stack %s", stack);
    struct data d = {.global = cfg.global_batch_size};
    expect(d.global == ROWS * A * world_, "global batch %d, want %d", d.global, ROWS * A * world_);
    for (int step = 0; step < STEPS && rc == LOOM_OK; step++) {
        struct loom_step_result res;
        rc = loom_engine_train_batch(e, next_batch, &d, &res);
        expect(rc == LOOM_OK, "step %d: %s", step + 1, loom_error_message());
        struct snapshot *s = &snap[step];
        s->params = copy_of(m->params.data, N * es);
        s->grads = copy_of(m->grads.data, N * es);
        s->m = copy_of(e->opt.m, N * sizeof(float));
        s->v = copy_of(e->opt.v, N * sizeof(float));
        s->master = bf16 ? copy_of(e->opt.master, N * sizeof(float)) : NULL;
        s->loss = res.loss;
        s->norm = res.grad_norm;
        if (step > 0) continue;
        /* the first gradient, exactly; then the first update by the formula */
        float *g = calloc(N, sizeof(float)), *want = calloc(N, sizeof(float));
        double nonzero = 0;
        int bits = 0;
        expect(exact_grads(m, d.global, g, &nonzero, &bits), "exact_grads: the data is not exact in float32");
        expect(nonzero > 0.15, "only %.0f%% of a block's first gradient is nonzero", 100 * nonzero);
        if (bf16) {
            uint16_t *g16 = malloc(N * sizeof(uint16_t)), *p16 = malloc(N * sizeof(uint16_t));
            for (size_t i = 0; i < N; i++) g16[i] = to_bf16(g[i]), g[i] = from_bf16(g16[i]);
            compare("first gradient (bf16) against exact_grads", s->grads, g16, N, LOOM_DTYPE_BF16, -1, 0);
            adamw_formula(m, g, want);
            compare("master weights against AdamW's formula", s->master, want, N, LOOM_DTYPE_F32, 1e-6, 1e-2);
            for (size_t i = 0; i < N; i++) p16[i] = to_bf16(s->master[i]);
            compare("bf16 parameters against the rounded master weights", s->params, p16, N, LOOM_DTYPE_BF16,
                    -1, 0);
            free(g16);
            free(p16);
        } else {
            compare("first gradient against exact_grads", s->grads, g, N, LOOM_DTYPE_F32, -1, 0);
            adamw_formula(m, g, want);
            /* AdamW's first update in float against the double formula: a
             * handful of roundings per element (~10 u), 1e-6 = 17 u of the
             * larger values; measured 1.9e-7 */
            compare("parameters against AdamW's formula", s->params, want, N, LOOM_DTYPE_F32, 1e-6, 1e-2);
        }
        if (rank_ == 0 && !bf16)
            printf("reference, accumulation %d x %d (global batch %d): first gradient exact (%d of float32's "
                   "24 bits), at least %.0f%% of each block's nonzero\n",
                   A, world_, d.global, bits, 100 * nonzero);
        free(g);
        free(want);
    }
    loom_engine_free(e);
    mlp_free(&net);
    loom_config_free(&cfg);
}

/* ---- a stack built by hand: recorder > zero-3 > recorder > precision > recorder */

/* bf16 parameters, ZeRO-3 over a data-parallel world of one (before the
 * comm layer's groups exist), one micro-batch of ROWS rows through the
 * model and the stack.h calls, no optimizer: the middle recorder sees
 * ZeRO-3's gather and gradient buffer but never precision's copies. The
 * gradient shard is the exact one, rounded once. */
static void hand_built_stack(void)
{
    current = "hand-built stack";
    struct mlp net;
    mlp_build(&net);
    struct loom_model *m = &net.base;
    m->dtype = LOOM_DTYPE_BF16;
    loom_model_alloc_arenas(m, loom_zero_arena_multiple(3, 1), LOOM_MODEL_PARAM_ARENA);
    loom_model_init_weights(m, SEED);
    struct scene *sc = calloc(1, sizeof *sc);
    *sc = (struct scene){.model = m, .stage = 3, .bf16 = 1, .accumulation = 1, .nrec = 3};
    struct recorder rec[3] = {{sc, 0}, {sc, 1}, {sc, 2}};
    struct loom_zero z;
    struct loom_precision p;
    loom_model_push_strategy(m, &recorder_strategy, &rec[0]);
    loom_zero_init(&z, 3, 1, 0, m, 0, LOOM_DTYPE_F32, 0, NULL, 1, 0);
    loom_model_push_strategy(m, &recorder_strategy, &rec[1]);
    loom_precision_init(&p, m);
    loom_model_push_strategy(m, &recorder_strategy, &rec[2]);
    sc->zero = &z;
    sc->prec = &p;
    char stack[128];
    loom_stack_format(m, stack, sizeof stack);
    expect(strcmp(stack, "record > zero-3 > record > precision > record") == 0, "stack %s", stack);
    expect(z.index == 1 && p.index == 3 && loom_model_strategy_index(m, &z) == 1 &&
               loom_model_strategy_index(m, &p) == 3,
           "stack indices: zero %d, precision %d", z.index, p.index);

    struct data d;
    fill_rows(&d, 0, ROWS);
    struct loom_micro mb = {.slot = 0, .batch = &d.b, .rows = ROWS};
    loom_model_zero_grad(m);
    loom_stack_begin_step(m);
    m->ops->forward(m, 0, NBLOCKS - 1, &mb);
    loom_stack_begin_backward(m, 0, 1);
    m->ops->backward(m, 0, NBLOCKS - 1, &mb, 1.0f);
    loom_stack_finish_backward(m);
    loom_stack_after_step(m);
    check_sequence(sc, "hand-built stack");

    const size_t N = m->num_params;
    float *g = calloc(N, sizeof(float));
    uint16_t *g16 = malloc(N * sizeof(uint16_t));
    double nonzero = 0;
    int bits = 0;
    expect(exact_grads(m, ROWS, g, &nonzero, &bits), "exact_grads: the data is not exact in float32");
    for (size_t i = 0; i < N; i++) g16[i] = to_bf16(g[i]);
    compare("hand-built stack: ZeRO-3 gradient shard (bf16) against exact_grads", z.grad_shard.data, g16, N,
            LOOM_DTYPE_BF16, -1, 0);
    if (rank_ == 0) printf("hand-built stack (%s): %d hooks in order, gradient exact\n", stack, sc->nev);
    free(g);
    free(g16);
    loom_precision_free(&p);
    loom_zero_free(&z);
    m->stack.n = 0;
    loom_pool_drain();
    mlp_free(&net);
    free(sc);
}

/* ---- the layouts under test ---------------------------------------------------- */

struct layout {
    const char *name;
    const char *flags[6]; /* NULL-terminated */
};

static const struct layout layouts[] = {
    {"no strategy (DDP, one bucket, on more ranks)", {NULL}},
    {"ddp, 0.001 MB buckets", {"--ddp-bucket-size", "0.001", NULL}},
    {"ddp, 0.001 MB buckets after the backward", {"--ddp-bucket-size", "0.001", "--no-overlap", NULL}},
    {"ddp naive", {"--ddp-impl", "naive", NULL}},
    {"zero-1", {"--zero-stage", "1", "--ddp-bucket-size", "0.001", NULL}},
    {"zero-2", {"--zero-stage", "2", NULL}},
    {"zero-3, a block per unit", {"--zero-stage", "3", NULL}},
    {"zero-3, units of 300 parameters", {"--zero-stage", "3", "--zero3-min-params", "300", NULL}},
    {"bf16 ddp, 0.001 MB buckets", {"--bf16", "--ddp-bucket-size", "0.001", NULL}},
    {"bf16 ddp naive", {"--bf16", "--ddp-impl", "naive", NULL}},
    {"bf16 zero-2", {"--bf16", "--zero-stage", "2", NULL}},
    {"bf16 zero-3, a block per unit", {"--bf16", "--zero-stage", "3", NULL}},
    {"bf16 zero-3, units of 300 parameters",
     {"--bf16", "--zero-stage", "3", "--zero3-min-params", "300", NULL}},
};

/* Tolerances after the second step (the first is bit for bit): float32
 * rounding of sums in another order (a gradient element sums the batch's
 * and the micro-batches' contributions, a few dozen terms: about u sqrt(K)
 * of the scale; measured on 1 to 4 ranks: parameters 4.6e-7, gradients
 * 3.9e-6 at most, 25x under TOL_F32), and in bf16 two steps of the 16-bit
 * values (2 x 2^-7 = 1.6e-2: a sum in another order can round one step
 * off, and the update from it one more; measured 0, every layout's bf16
 * sums being the reference's); the AdamW moments, from those gradients,
 * ten times looser (Adam divides by the root of v: a gradient element near
 * zero moves m / sqrt(v) by more than its own relative error; measured
 * 2.7e-5, 37x under). */
#define TOL_F32 1e-4
#define TOL_BF16 1.6e-2

/* This rank's piece after a step against the reference's same piece:
 * errs[] gets the max relative errors of parameters, gradients and
 * optimizer state. */
static void compare_step(struct loom_engine *e, const struct snapshot *ref, int step,
                         const struct loom_step_result *res, double errs[3])
{
    const struct loom_model *m = e->model;
    const struct loom_partition p = e->part;
    const enum loom_dtype dt = m->dtype;
    if (!ref->params) {
        expect(0, "step %d: no reference to compare with", step + 1);
        return;
    }
    const size_t N = m->num_params, n = p.end - p.begin, es = loom_dtype_size(dt);
    const struct loom_zero *z = ZERO(e);
    const int sharded_params = z && z->stage == 3, sharded_grads = z && z->stage >= 2;
    const double tol = step == 0 ? -1 : dt == LOOM_DTYPE_F32 ? TOL_F32 : TOL_BF16;
    const double floor_frac = 1e-2; /* of the largest value: below it the error is absolute */
    char what[128];
    snprintf(what, sizeof what, "step %d: %s", step + 1, sharded_params ? "parameter shard" : "parameters");
    errs[0] = sharded_params ? compare(what, loom_zero_params(z).data,
                                       (const char *)ref->params + p.begin * es, n, dt, tol, floor_frac)
                             : compare(what, m->params.data, ref->params, N, dt, tol, floor_frac);
    if (sharded_params)
        expect_zero("parameter shard padding", (const char *)z->param_shard.data + n * es,
                    (p.shard - n) * es);
    /* ZeRO-1's reduce-scatter sums each rank's shard of the arena only */
    const int scattered = z && z->stage == 1 && z->scattered;
    snprintf(what, sizeof what, "step %d: %s", step + 1,
             sharded_grads ? "gradient shard"
             : scattered   ? "gradients of the shard"
                           : "gradients");
    errs[1] = sharded_grads ? compare(what, loom_zero_grads(z).data, (const char *)ref->grads + p.begin * es,
                                      n, dt, tol, floor_frac)
              : scattered   ? compare(what, (const char *)m->grads.data + p.begin * es,
                                      (const char *)ref->grads + p.begin * es, n, dt, tol, floor_frac)
                            : compare(what, m->grads.data, ref->grads, N, dt, tol, floor_frac);
    if (sharded_grads)
        expect_zero("gradient shard padding", (const char *)z->grad_shard.data + n * es, (p.shard - n) * es);
    const double tol_state = step == 0 ? -1 : 10 * (dt == LOOM_DTYPE_F32 ? TOL_F32 : TOL_BF16);
    snprintf(what, sizeof what, "step %d: AdamW m", step + 1);
    errs[2] = compare(what, e->opt.m, ref->m + p.begin, n, LOOM_DTYPE_F32, tol_state, floor_frac);
    snprintf(what, sizeof what, "step %d: AdamW v", step + 1);
    errs[2] =
        fmax(errs[2], compare(what, e->opt.v, ref->v + p.begin, n, LOOM_DTYPE_F32, tol_state, floor_frac));
    if (dt != LOOM_DTYPE_F32) {
        snprintf(what, sizeof what, "step %d: master weights", step + 1);
        errs[2] = fmax(errs[2], compare(what, e->opt.master, ref->master + p.begin, n, LOOM_DTYPE_F32,
                                        step == 0 ? -1 : TOL_F32, floor_frac));
    }
    /* the same micro-batch losses (identical weights), summed in another
     * order in double: a few double roundings, 2^-53 each (measured 0) */
    expect(fabs(res->loss - ref->loss) <= 1e-12 * fabs(ref->loss), "step %d: loss %.17g, reference %.17g",
           step + 1, res->loss, ref->loss);
    /* the norm: step 1's gradients are the same bits (double sums of squares
     * in another order, 1e-12); after, the norm of gradients that differ by
     * float32 reordering (TOL_F32's) or bf16 steps, their errors of random
     * sign averaging out over the model (measured 1.1e-7 in float32, 8.8x
     * under 1e-6; 0 in bf16) */
    const double ntol = step == 0 ? 1e-12 : dt == LOOM_DTYPE_F32 ? 1e-6 : 1e-2;
    expect(fabs(res->grad_norm - ref->norm) <= ntol * ref->norm,
           "step %d: gradient norm %.17g, reference %.17g", step + 1, res->grad_norm, ref->norm);
}

static void run_layout(const struct layout *lay, int A, struct snapshot ref[2][2][STEPS], struct scene *sc)
{
    char name[128];
    snprintf(name, sizeof name, "%s, accumulation %d", lay->name, A);
    current = name;
    int nflags = 0;
    while (lay->flags[nflags]) nflags++;
    struct loom_config cfg;
    struct loom_engine *e = NULL;
    struct mlp net;
    mlp_build(&net);
    struct loom_model *m = &net.base;
    memset(sc, 0, sizeof *sc);
    struct recorder bottom = {sc, 0}, top = {sc, 1};
    int rc = parse(&cfg, lay->flags, nflags, A);
    if (rc == LOOM_OK) rc = loom_engine_init(&e, &cfg);
    loom_model_push_strategy(m, &recorder_strategy, &bottom); /* below the engine's stack */
    if (rc == LOOM_OK) rc = loom_engine_initialize(e, m);
    expect(rc == LOOM_OK, "engine: %s", loom_error_message());
    double worst[2][3] = {{0}}; /* steps x (parameters, gradients, state) */
    char layout_desc[192] = "";
    if (rc == LOOM_OK) {
        loom_model_push_strategy(m, &recorder_strategy, &top); /* above it */
        const int dp = loom_engine_dp_size(e), stage = cfg.zero_stage;
        *sc = (struct scene){.model = m,
                             .stage = stage,
                             .bf16 = cfg.bf16,
                             .accumulation = A,
                             .overlap = !cfg.no_overlap,
                             .zero = ZERO(e),
                             .ddp = e->state[LOOM_KIND_DATA],
                             .prec = e->state[LOOM_KIND_PRECISION],
                             .nrec = 2};
        /* the stack the layout asks for (build_stack), between the recorders */
        char stack[128], want[128] = "record";
        loom_stack_format(m, stack, sizeof stack);
        if (dp > 1 && stage < 2) strcat(want, " > ddp");
        if (stage) snprintf(want + strlen(want), sizeof want - strlen(want), " > zero-%d", stage);
        if (cfg.bf16) strcat(want, " > precision");
        strcat(want, " > record");
        expect(strcmp(stack, want) == 0, "stack %s, want %s", stack, want);
        expect(!sc->zero || sc->zero->index == loom_model_strategy_index(m, sc->zero), "zero's index %d",
               sc->zero ? sc->zero->index : -1);
        expect(!sc->ddp || sc->ddp->index == loom_model_strategy_index(m, sc->ddp), "ddp's index");
        expect(!sc->prec || sc->prec->index == loom_model_strategy_index(m, sc->prec), "precision's index");
        if (sc->ddp && !sc->ddp->naive) {
            char b[128];
            int nb = check_buckets(sc->ddp, m, cfg.ddp_bucket_size, b, sizeof b);
            snprintf(layout_desc, sizeof layout_desc, "; %d bucket%s %s", nb, nb > 1 ? "s" : "", b);
        }
        if (sc->zero) {
            char b[128];
            check_partition(e, b, sizeof b);
            size_t l = strlen(layout_desc);
            snprintf(layout_desc + l, sizeof layout_desc - l, "; %s", b);
        }
        if (sc->zero && stage == 3) {
            char b[128];
            check_units(sc->zero, m, cfg.zero3_min_params, b, sizeof b);
            size_t l = strlen(layout_desc);
            snprintf(layout_desc + l, sizeof layout_desc - l, "; %d units %s", sc->zero->nunits, b);
        }
        struct data d = {.global = cfg.global_batch_size};
        for (int step = 0; step < STEPS && rc == LOOM_OK; step++) {
            sc->nev = 0;
            struct loom_step_result res;
            rc = loom_engine_train_batch(e, next_batch, &d, &res);
            expect(rc == LOOM_OK, "step %d: %s", step + 1, loom_error_message());
            char what[32];
            snprintf(what, sizeof what, "step %d hooks", step + 1);
            check_sequence(sc, what);
            compare_step(e, &ref[cfg.bf16][A - 1][step], step, &res, worst[step]);
        }
    }
    loom_engine_free(e);
    mlp_free(&net);
    loom_config_free(&cfg);
    /* one line for the run: the worst of all ranks */
    if (world_ > 1)
        loom_comm_allreduce_sync(LOOM_GROUP_WORLD, loom_buf_of(worst, 6, LOOM_DTYPE_F64), LOOM_OP_MAX);
    if (rank_ == 0)
        printf("%-56s step 1 %s; step 2 max rel err params %.1e grads %.1e state %.1e%s\n", name,
               worst[0][0] + worst[0][1] + worst[0][2] == 0 ? "bit-identical" : "DIFFERS", worst[1][0],
               worst[1][1], worst[1][2], layout_desc);
}

/* A batch that fails on one rank (its last dp rank, at micro-batch 1):
 * every rank's train_batch returns that status at once, before the next
 * collective, so no rank waits for the others until the deadline. */
static int failing_batch(void *ctx, struct loom_engine *e, int micro, const void **batch, int *rows)
{
    if (micro == 1 && loom_engine_dp_rank(e) == loom_engine_dp_size(e) - 1)
        return loom_error_set(LOOM_ERR_INPUT, "no rows for micro-batch %d", micro);
    return next_batch(ctx, e, micro, batch, rows);
}

static void batch_failure(const struct layout *lay)
{
    char name[128];
    snprintf(name, sizeof name, "%s: a batch failing on one rank", lay->name);
    current = name;
    int nflags = 0;
    while (lay->flags[nflags]) nflags++;
    struct loom_config cfg;
    struct loom_engine *e = NULL;
    struct mlp net;
    mlp_build(&net);
    int rc = parse(&cfg, lay->flags, nflags, 2);
    if (rc == LOOM_OK) rc = loom_engine_init(&e, &cfg);
    if (rc == LOOM_OK) rc = loom_engine_initialize(e, &net.base);
    expect(rc == LOOM_OK, "engine: %s", loom_error_message());
    if (rc == LOOM_OK) {
        struct data d = {.global = cfg.global_batch_size};
        struct loom_step_result res;
        rc = loom_engine_train_batch(e, failing_batch, &d, &res);
        expect(rc == LOOM_ERR_INPUT, "train_batch returned %d on rank %d, want %d on every rank", rc, rank_,
               LOOM_ERR_INPUT);
    }
    loom_engine_free(e);
    mlp_free(&net);
    loom_config_free(&cfg);
    if (rank_ == 0) printf("%-56s every rank stops with the error\n", name);
}

/* Under mpirun (Open MPI or a PMI launcher), loom_init joins the job; alone,
 * the process runs without MPI. */
static int launched_by_mpirun(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

int main(int argc, char **argv)
{
    const int mpi = launched_by_mpirun();
    if (mpi) loom_init(&argc, &argv);
    rank_ = loom_comm_world_rank();
    world_ = loom_comm_world_size();

    /* before any engine: the comm layer has no groups, each rank is alone */
    hand_built_stack();
    static struct snapshot ref[2][2][STEPS]; /* [bf16][accumulation - 1][step] */
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int A = 1; A <= 2; A++) reference(bf16, A, ref[bf16][A - 1]);

    struct scene *sc = calloc(1, sizeof *sc);
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        for (int A = 1; A <= 2; A++) run_layout(&layouts[i], A, ref, sc);
    free(sc);
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) batch_failure(&layouts[i]);
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int A = 0; A < 2; A++)
            for (int s = 0; s < STEPS; s++) snapshot_free(&ref[bf16][A][s]);

    /* every rank exits with the verdict of all */
    uint64_t failed = (uint64_t)check_failures;
    if (world_ > 1)
        loom_comm_allreduce_sync(LOOM_GROUP_WORLD, loom_buf_of(&failed, 1, LOOM_DTYPE_U64), LOOM_OP_SUM);
    char title[64];
    snprintf(title, sizeof title, "test_strategies [rank %d of %d]", rank_, world_);
    int rc = check_summary(title);
    if (mpi) loom_finalize();
    return rc || failed ? 1 : 0;
}
