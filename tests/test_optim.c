/*
 * Optimizer pieces: the learning-rate schedule at its landmarks, the clip
 * coefficient, and the gradient norm over blocks.
 */
#include <math.h>

#include "check.h"
#include "loom/config.h"
#include "optim/adamw.h"
#include "optim/lr.h"

static int near(double a, double b) { return fabs(a - b) <= 1e-12 * fmax(1.0, fabs(b)); }

int main(void)
{
    struct loom_lr_schedule s = {1e-3, 1e-4, 10, 110, LOOM_LR_COSINE};
    CHECK(near(loom_lr_at(&s, 1), 1e-4));   /* warmup: 1/10 of the peak */
    CHECK(near(loom_lr_at(&s, 10), 1e-3));  /* end of warmup: the peak */
    CHECK(near(loom_lr_at(&s, 60), 5.5e-4)); /* half way: cosine midpoint */
    CHECK(near(loom_lr_at(&s, 110), 1e-4)); /* decay end */
    CHECK(near(loom_lr_at(&s, 500), 1e-4)); /* after: min */
    s.style = LOOM_LR_LINEAR;
    CHECK(near(loom_lr_at(&s, 35), 1e-3 - 0.25 * 9e-4));
    s.style = LOOM_LR_CONSTANT;
    CHECK(near(loom_lr_at(&s, 100), 1e-3));
    s.warmup_iters = 0;
    s.style = LOOM_LR_COSINE;
    CHECK(near(loom_lr_at(&s, 0), 1e-3));

    CHECK(loom_clip_coef(10.0, 0.0) == 1.0f);
    CHECK(loom_clip_coef(0.5, 1.0) == 1.0f);
    CHECK(fabs(loom_clip_coef(4.0, 1.0) - 1.0 / (4.0 + 1e-6)) < 1e-7);

    float g1[3] = {3, 0, 0}, g2[2] = {0, 4};
    struct loom_block blocks[2] = {{.numel = 3, .grads = g1}, {.numel = 2, .grads = g2}};
    CHECK(fabs(loom_grad_norm(blocks, 2) - 5.0) < 1e-12);
    return check_summary("test_optim");
}
