/*
 * Optimizer pieces: the learning-rate schedules at their landmarks
 * (Megatron's shapes, and DeepSpeed's WarmupLR, WarmupDecayLR and
 * WarmupCosineLR against their formulas written out independently), the clip
 * coefficient, and the gradient norm over blocks.
 */
#include <math.h>

#include "check.h"
#include "kernels/backend.h"
#include "loom/config.h"
#include "optim/adamw.h"
#include "optim/lr.h"

/* The schedules are a few double operations (and a log or a cos, within an
 * ulp in any libm) on both sides: they differ by a few 2^-53 = 1.1e-16 at
 * most, so 1e-12 (absolute below 1) and 1e-13 relative leave 1000x; a wrong
 * schedule step differs by 1e-3 of the rate or more. */
static int near(double a, double b)
{
    return fabs(a - b) <= 1e-12 * fmax(1.0, fabs(b));
}
/* relative, for rates of order 1e-3 */
static int same(double a, double b)
{
    return fabs(a - b) <= 1e-13 * fmax(1e-300, fabs(b));
}

#define CHECK_LR(got, want)                                                                                  \
    do {                                                                                                     \
        double g_ = (got), w_ = (want);                                                                      \
        if (!same(g_, w_)) fprintf(stderr, "  %s = %.17g, want %.17g\n", #got, g_, w_);                      \
        CHECK(same(g_, w_));                                                                                 \
    } while (0)

/* DeepSpeed's schedulers (deepspeed/runtime/lr_schedules.py), with it = last_batch_iteration. */
static void test_deepspeed_schedules(void)
{
    /* WarmupLR, log warmup (DeepSpeed's default): min + (max - min) * ln(it + 1) / ln(W), then max */
    struct loom_lr_schedule s = {.max_lr = 1e-3,
                                 .min_lr = 1e-5,
                                 .warmup_iters = 10,
                                 .decay_iters = 100,
                                 .style = LOOM_LR_WARMUP_LR,
                                 .warmup_style = LOOM_LR_WARMUP_LOG};
    CHECK_LR(loom_lr_deepspeed(&s, 0), 1e-5);
    CHECK_LR(loom_lr_deepspeed(&s, 4), 1e-5 + 9.9e-4 * (log(5.0) / log(10.0)));
    CHECK_LR(loom_lr_deepspeed(&s, 9), 1e-3);
    CHECK_LR(loom_lr_deepspeed(&s, 500), 1e-3); /* no decay */
    /* the optimizer's k-th step uses iteration k-2; the first, the value set at construction */
    CHECK_LR(loom_lr_at(&s, 1), 1e-5);
    CHECK_LR(loom_lr_at(&s, 2), 1e-5);
    CHECK_LR(loom_lr_at(&s, 6), loom_lr_deepspeed(&s, 4));
    CHECK_LR(loom_lr_at(&s, 11), 1e-3);
    /* linear warmup: min + (max - min) * it / W; W below 2 counts as 2 */
    s.warmup_style = LOOM_LR_WARMUP_LINEAR;
    CHECK_LR(loom_lr_deepspeed(&s, 3), 1e-5 + 9.9e-4 * 0.3);
    s.warmup_iters = 0;
    CHECK_LR(loom_lr_deepspeed(&s, 1), 1e-5 + 9.9e-4 * 0.5);
    CHECK_LR(loom_lr_deepspeed(&s, 2), 1e-3);

    /* WarmupDecayLR: the warmup, then min + (max - min) * (total - it) / (total - W), never below min */
    struct loom_lr_schedule d = {.max_lr = 1e-3,
                                 .min_lr = 0,
                                 .warmup_iters = 100,
                                 .decay_iters = 1000,
                                 .style = LOOM_LR_WARMUP_DECAY_LR,
                                 .warmup_style = LOOM_LR_WARMUP_LINEAR};
    CHECK_LR(loom_lr_deepspeed(&d, 50), 5e-4);
    CHECK_LR(loom_lr_deepspeed(&d, 100), 1e-3);
    CHECK_LR(loom_lr_deepspeed(&d, 550), 5e-4);
    CHECK_LR(loom_lr_deepspeed(&d, 999), 1e-3 / 900);
    CHECK(loom_lr_deepspeed(&d, 1000) == 0.0);
    CHECK(loom_lr_deepspeed(&d, 1500) == 0.0);
    d.min_lr = 1e-4;
    CHECK_LR(loom_lr_deepspeed(&d, 775), 1e-4 + 9e-4 * 0.25);
    CHECK_LR(loom_lr_deepspeed(&d, 2000), 1e-4);
    d.warmup_style = LOOM_LR_WARMUP_LOG;
    CHECK_LR(loom_lr_deepspeed(&d, 9), 1e-4 + 9e-4 * (log(10.0) / log(100.0)));

    /* WarmupCosineLR: ratios of the optimizer's lr. Warmup from warmup_min_ratio to 1, then
     * cos_min + (1 - cos_min) * (1 + cos(pi * (it - W + 1) / (total - W))) / 2 */
    struct loom_lr_schedule c = {.max_lr = 3e-4,
                                 .warmup_iters = 50,
                                 .decay_iters = 1200,
                                 .style = LOOM_LR_WARMUP_COSINE_LR,
                                 .warmup_style = LOOM_LR_WARMUP_LOG,
                                 .warmup_min_ratio = 0.01,
                                 .cos_min_ratio = 0.1};
    CHECK_LR(loom_lr_deepspeed(&c, 0), 3e-4 * 0.01);
    CHECK_LR(loom_lr_deepspeed(&c, 24), 3e-4 * (0.01 + 0.99 * log(25.0) / log(50.0)));
    CHECK_LR(loom_lr_deepspeed(&c, 49), 3e-4);
    CHECK_LR(loom_lr_deepspeed(&c, 50), 3e-4 * (0.1 + 0.9 * (1 + cos(M_PI / 1150)) / 2));
    CHECK_LR(loom_lr_deepspeed(&c, 624), 3e-4 * (0.1 + 0.9 * 0.5));
    CHECK_LR(loom_lr_deepspeed(&c, 1199), 3e-4 * 0.1);
    CHECK_LR(loom_lr_deepspeed(&c, 1199 + 575),
             3e-4 * 0.55);           /* past total_num_steps the cosine rises again */
    CHECK(loom_lr_at(&c, 1) == 0.0); /* DeepSpeed's first step: lr 0 */
    CHECK_LR(loom_lr_at(&c, 2), 3e-6);
    c.warmup_style = LOOM_LR_WARMUP_LINEAR;
    CHECK_LR(loom_lr_deepspeed(&c, 10), 3e-4 * (0.01 + 0.99 * 0.2));
}

int main(void)
{
    struct loom_lr_schedule s = {
        .max_lr = 1e-3, .min_lr = 1e-4, .warmup_iters = 10, .decay_iters = 110, .style = LOOM_LR_COSINE};
    CHECK(near(loom_lr_at(&s, 1), 1e-4));    /* warmup: 1/10 of the peak */
    CHECK(near(loom_lr_at(&s, 10), 1e-3));   /* end of warmup: the peak */
    CHECK(near(loom_lr_at(&s, 60), 5.5e-4)); /* half way: cosine midpoint */
    CHECK(near(loom_lr_at(&s, 110), 1e-4));  /* decay end */
    CHECK(near(loom_lr_at(&s, 500), 1e-4));  /* after: min */
    s.style = LOOM_LR_LINEAR;
    CHECK(near(loom_lr_at(&s, 35), 1e-3 - 0.25 * 9e-4));
    s.style = LOOM_LR_CONSTANT;
    CHECK(near(loom_lr_at(&s, 100), 1e-3));
    s.warmup_iters = 0;
    s.style = LOOM_LR_COSINE;
    CHECK(near(loom_lr_at(&s, 0), 1e-3));
    test_deepspeed_schedules();

    CHECK(loom_clip_coef(10.0, 0.0) == 1.0f);
    CHECK(loom_clip_coef(0.5, 1.0) == 1.0f);
    /* a float: half an ulp of 0.25 is 7.5e-9 */
    CHECK(fabs(loom_clip_coef(4.0, 1.0) - 1.0 / (4.0 + 1e-6)) < 1e-7);

    float g1[3] = {3, 0, 0}, g2[2] = {0, 4};
    struct loom_block blocks[2] = {{.numel = 3, .work_grads = g1}, {.numel = 2, .work_grads = g2}};
    CHECK(fabs(loom_grad_norm(loom_backend_cpu(), blocks, 2) - 5.0) < 1e-12); /* sqrt(25): exact in double */
    return check_summary("test_optim");
}
