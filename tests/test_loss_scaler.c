/*
 * The loss scaler against DeepSpeed's rules (optim/loss_scaler.h), one
 * scripted scenario per rule; then against DeepSpeed's own bookkeeping
 * (iteration counter, last overflowing iteration), restated below, on
 * random scripts over a grid of knobs; checkpoint restore. The overflow
 * check itself is a kernel (tests/test_kernels.c).
 *
 * Scripts have one character per optimizer step: 'x' a step whose
 * gradients overflowed, '.' a clean one.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "check.h"
#include "loom/loom.h"
#include "optim/loss_scaler.h"

static struct loom_loss_scaler make(int power, int64_t window, int hysteresis, int consecutive,
                                    double min_scale, int raise_at_min)
{
    struct loom_loss_scaler_config cfg;
    loom_loss_scaler_defaults(&cfg);
    cfg.initial_scale_power = power;
    cfg.loss_scale_window = window;
    cfg.hysteresis = hysteresis;
    cfg.consecutive_hysteresis = consecutive;
    cfg.min_loss_scale = min_scale;
    cfg.raise_error_at_min_scale = raise_at_min;
    struct loom_loss_scaler s;
    CHECK(loom_loss_scaler_init(&s, &cfg) == LOOM_OK);
    return s;
}

/* Plays the script; every overflow must be skipped and every clean step
 * applied, and after step i the scale must be want[i]. */
static void play(struct loom_loss_scaler *s, const char *script, const double *want, int line)
{
    for (int i = 0; script[i]; i++) {
        int overflow = script[i] == 'x';
        enum loom_scaler_verdict v = loom_loss_scaler_update(s, overflow);
        int ok = v == (overflow ? LOOM_SCALER_SKIP : LOOM_SCALER_STEP) && s->st.scale == want[i];
        check_count++;
        if (!ok) {
            check_failures++;
            fprintf(stderr, "FAIL line %d, step %d of \"%s\": verdict %d, scale %g, want scale %g\n", line, i,
                    script, (int)v, s->st.scale, want[i]);
            return;
        }
    }
}
#define PLAY(s, script, ...) play(s, script, (const double[]){__VA_ARGS__}, __LINE__)

static void test_defaults_are_deepspeeds(void)
{
    struct loom_loss_scaler_config c;
    loom_loss_scaler_defaults(&c);
    CHECK(c.loss_scale == 0 && c.initial_scale_power == 16 && c.loss_scale_window == 1000);
    CHECK(c.hysteresis == 2 && c.consecutive_hysteresis == 0 && c.min_loss_scale == 1);
    CHECK(c.raise_error_at_min_scale == 1);
    struct loom_loss_scaler s;
    CHECK(loom_loss_scaler_init(&s, &c) == LOOM_OK);
    CHECK(s.st.scale == 65536 && s.st.hysteresis == 2 && s.st.steps == 0 && s.st.skipped_steps == 0);
}

/* Forced overflows at a huge initial scale: without hysteresis each one
 * halves the scale and skips its step. */
static void test_overflows_halve_then_window_doubles(void)
{
    struct loom_loss_scaler s = make(32, 3, 1, 0, 1, 1);
    PLAY(&s, "xxxx", 0x1p31, 0x1p30, 0x1p29, 0x1p28);
    CHECK(s.st.skipped_steps == 4 && s.st.steps == 4);
    /* The first doubling comes on the clean step with `window` clean steps
     * before it, i.e. the (window + 1)-th; later ones every window steps. */
    PLAY(&s, "....", 0x1p28, 0x1p28, 0x1p28, 0x1p29);
    PLAY(&s, "...", 0x1p29, 0x1p29, 0x1p30);
    PLAY(&s, "...", 0x1p30, 0x1p30, 0x1p31);
    CHECK(s.st.skipped_steps == 4 && s.st.steps == 14);
    /* An overflow restarts the count: window + 1 clean steps again. */
    PLAY(&s, "..x", 0x1p31, 0x1p31, 0x1p30);
    PLAY(&s, "....", 0x1p30, 0x1p30, 0x1p30, 0x1p31);
}

/* The same from the start: the count starts at the first step. */
static void test_window_from_the_start(void)
{
    struct loom_loss_scaler s = make(10, 2, 2, 0, 1, 1);
    PLAY(&s, "......", 0x1p10, 0x1p10, 0x1p11, 0x1p11, 0x1p12, 0x1p12);
    s = make(10, 1, 2, 0, 1, 1); /* window 1: every clean step after the first */
    PLAY(&s, "....", 0x1p10, 0x1p11, 0x1p12, 0x1p13);
}

/* Hysteresis n: the first n - 1 overflows only use it up; then each
 * overflow halves, until growth refills it. Clean steps do not (without
 * consecutive_hysteresis), so overflows far apart still add up. */
static void test_hysteresis(void)
{
    struct loom_loss_scaler s = make(10, 4, 3, 0, 1, 1);
    PLAY(&s, "xx", 0x1p10, 0x1p10);
    CHECK(s.st.hysteresis == 1 && s.st.skipped_steps == 2);
    PLAY(&s, "xx", 0x1p9, 0x1p8);
    CHECK(s.st.hysteresis == 1); /* halving does not refill it */
    PLAY(&s, "...x", 0x1p8, 0x1p8, 0x1p8, 0x1p7);
    PLAY(&s, ".....", 0x1p7, 0x1p7, 0x1p7, 0x1p7, 0x1p8);
    CHECK(s.st.hysteresis == 3); /* growth refilled it */
    PLAY(&s, "x..x..x", 0x1p8, 0x1p8, 0x1p8, 0x1p8, 0x1p8, 0x1p8, 0x1p7);
    /* An overflow taken by hysteresis restarts the window as well. */
    s = make(10, 2, 2, 0, 1, 1);
    PLAY(&s, "..x...", 0x1p10, 0x1p10, 0x1p10, 0x1p10, 0x1p10, 0x1p11);
}

/* consecutive_hysteresis: every clean step refills it, so only an unbroken
 * run of `hysteresis` overflows halves the scale. */
static void test_consecutive_hysteresis(void)
{
    struct loom_loss_scaler s = make(10, 100, 2, 1, 1, 1);
    PLAY(&s, "x.x.x.x.", 0x1p10, 0x1p10, 0x1p10, 0x1p10, 0x1p10, 0x1p10, 0x1p10, 0x1p10);
    PLAY(&s, "xx", 0x1p10, 0x1p9);
    PLAY(&s, "x", 0x1p8); /* still used up */
    PLAY(&s, ".xx", 0x1p8, 0x1p8, 0x1p7);
    CHECK(s.st.skipped_steps == 9);
}

/* The floor: the scale never halves below min_loss_scale; an overflow that
 * would halve it there ends the run (raise_error_at_min_scale), reported by
 * the verdict with the state untouched. Hysteresis still comes first. */
static void test_min_loss_scale(void)
{
    struct loom_loss_scaler s = make(2, 1000, 1, 0, 1, 0);
    PLAY(&s, "xxxx", 2, 1, 1, 1);
    CHECK(s.st.skipped_steps == 4);

    s = make(2, 1000, 1, 0, 1, 1);
    PLAY(&s, "xx", 2, 1);
    struct loom_loss_scaler_state before = s.st;
    CHECK(loom_loss_scaler_update(&s, 1) == LOOM_SCALER_SKIP_AT_MIN);
    CHECK(memcmp(&s.st, &before, sizeof before) == 0);

    s = make(0, 1000, 2, 0, 1, 1); /* starts at the floor with hysteresis 2 */
    PLAY(&s, "x", 1);
    CHECK(loom_loss_scaler_update(&s, 1) == LOOM_SCALER_SKIP_AT_MIN);

    s = make(3, 2, 1, 0, 3, 1); /* a floor that is no power of two */
    PLAY(&s, "xx", 4, 3);
    CHECK(loom_loss_scaler_update(&s, 1) == LOOM_SCALER_SKIP_AT_MIN);
    PLAY(&s, "...", 3, 3, 6); /* growth leaves the floor as usual */
}

/* A static scale (loss_scale > 0) never changes; overflows still skip. */
static void test_static_scale(void)
{
    struct loom_loss_scaler_config cfg;
    loom_loss_scaler_defaults(&cfg);
    cfg.loss_scale = 128;
    cfg.loss_scale_window = 2;
    cfg.hysteresis = 1;
    struct loom_loss_scaler s;
    CHECK(loom_loss_scaler_init(&s, &cfg) == LOOM_OK);
    PLAY(&s, "xx....x", 128, 128, 128, 128, 128, 128, 128);
    int applied = 0;
    for (int i = 0; i < 5000; i++) applied += loom_loss_scaler_update(&s, 0) == LOOM_SCALER_STEP;
    CHECK(applied == 5000);
    CHECK(s.st.scale == 128 && s.st.steps == 5007 && s.st.skipped_steps == 3);
}

static void test_bad_config(void)
{
    struct loom_loss_scaler_config good, c;
    struct loom_loss_scaler s;
    loom_loss_scaler_defaults(&good);
#define REJECTS(field, value, key)                                                                           \
    do {                                                                                                     \
        c = good;                                                                                            \
        c.field = value;                                                                                     \
        CHECK(loom_loss_scaler_init(&s, &c) == LOOM_ERR_INPUT);                                              \
        CHECK(strstr(loom_error_message(), key) != NULL);                                                    \
    } while (0)
    REJECTS(loss_scale, -1, "fp16.loss_scale");
    REJECTS(loss_scale, NAN, "fp16.loss_scale");
    REJECTS(loss_scale, INFINITY, "fp16.loss_scale");
    REJECTS(initial_scale_power, 128, "fp16.initial_scale_power: 128");
    REJECTS(initial_scale_power, -127, "fp16.initial_scale_power: -127");
    REJECTS(loss_scale_window, 0, "fp16.loss_scale_window: 0");
    REJECTS(hysteresis, 0, "fp16.hysteresis: 0");
    REJECTS(min_loss_scale, 0, "fp16.min_loss_scale: 0");
    REJECTS(min_loss_scale, NAN, "fp16.min_loss_scale");
#undef REJECTS
    c = good;
    c.initial_scale_power = 127;
    CHECK(loom_loss_scaler_init(&s, &c) == LOOM_OK && s.st.scale == 0x1p127);
}

/* DeepSpeed's bookkeeping, restated: iterations count from 0, the last
 * overflowing one is remembered (-1 before any), and the stable interval
 * is the clean iterations between it and the current one. */
struct ds_model {
    double cur_scale;
    int64_t cur_iter, last_overflow_iter;
    int cur_hysteresis, raised;
};

static void ds_update(struct ds_model *m, const struct loom_loss_scaler_config *c, int overflow)
{
    if (overflow) {
        if (c->hysteresis != 1 && m->cur_hysteresis != 1) {
            m->cur_hysteresis -= 1;
        } else if (m->cur_scale == c->min_loss_scale && c->raise_error_at_min_scale) {
            m->raised = 1; /* the exception: nothing else happens */
            return;
        } else {
            m->cur_scale = fmax(m->cur_scale / 2, c->min_loss_scale);
        }
        m->last_overflow_iter = m->cur_iter;
    } else {
        if (c->consecutive_hysteresis) m->cur_hysteresis = c->hysteresis;
        int64_t stable_interval = m->cur_iter - m->last_overflow_iter - 1;
        if (stable_interval > 0 && stable_interval % c->loss_scale_window == 0) {
            if (!c->consecutive_hysteresis) m->cur_hysteresis = c->hysteresis;
            m->cur_scale *= 2;
        }
    }
    m->cur_iter += 1;
}

/* Bursty random scripts over a grid of knobs: same scale, hysteresis and
 * verdict as the model at every step, until the model raises. */
static void test_against_deepspeed_bookkeeping(void)
{
    static const int hysteresis[] = {1, 2, 3};
    static const int64_t window[] = {1, 2, 5};
    static const double min_scale[] = {1, 0.25, 3};
    static const double p_overflow[] = {0.05, 0.4, 0.8};
    struct loom_rng rng;
    loom_rng_seed(&rng, 7);
    int bad = 0, runs = 0, raised = 0;
    for (int h = 0; h < 3; h++)
        for (int consecutive = 0; consecutive < 2; consecutive++)
            for (int w = 0; w < 3; w++)
                for (int f = 0; f < 3; f++)
                    for (int raise = 0; raise < 2; raise++)
                        for (int p = 0; p < 3; p++) {
                            struct loom_loss_scaler s =
                                make(6, window[w], hysteresis[h], consecutive, min_scale[f], raise);
                            struct ds_model m = {ldexp(1, 6), 0, -1, hysteresis[h], 0};
                            int overflow = 0;
                            runs++;
                            for (int step = 0; step < 400; step++) {
                                /* bursts: the previous step's outcome repeats half the time */
                                if (loom_rng_uniform(&rng) >= 0.5f)
                                    overflow = loom_rng_uniform(&rng) < p_overflow[p];
                                enum loom_scaler_verdict v = loom_loss_scaler_update(&s, overflow);
                                ds_update(&m, &s.cfg, overflow);
                                int want = m.raised   ? LOOM_SCALER_SKIP_AT_MIN
                                           : overflow ? LOOM_SCALER_SKIP
                                                      : LOOM_SCALER_STEP;
                                if ((int)v != want || s.st.scale != m.cur_scale ||
                                    s.st.hysteresis != m.cur_hysteresis) {
                                    if (bad++ < 5)
                                        fprintf(stderr,
                                                "  hysteresis %d consecutive %d window %lld min %g raise %d, "
                                                "step %d: verdict %d scale %g hyst %d; deepspeed %d %g %d\n",
                                                hysteresis[h], consecutive, (long long)window[w],
                                                min_scale[f], raise, step, (int)v, s.st.scale,
                                                s.st.hysteresis, want, m.cur_scale, m.cur_hysteresis);
                                    break;
                                }
                                if (m.raised) {
                                    raised++;
                                    break;
                                }
                            }
                        }
    check_count++;
    if (bad) {
        check_failures++;
        fprintf(stderr, "FAIL against DeepSpeed's bookkeeping: %d of %d runs differ\n", bad, runs);
    }
    CHECK(raised > 0); /* the floor was reached in some runs */
}

/* Restoring a stored state continues exactly where the run left off. */
static void test_restore(void)
{
    struct loom_rng rng;
    loom_rng_seed(&rng, 11);
    struct loom_loss_scaler a = make(12, 3, 2, 0, 1, 0), b;
    int same = 1;
    for (int step = 0; step < 300; step++) {
        int overflow = loom_rng_uniform(&rng) < 0.3f;
        if (step == 137) { /* a fresh scaler resumes from a's state */
            b = make(12, 3, 2, 0, 1, 0);
            CHECK(loom_loss_scaler_restore(&b, &a.st) == LOOM_OK);
        }
        enum loom_scaler_verdict va = loom_loss_scaler_update(&a, overflow);
        if (step < 137) continue;
        enum loom_scaler_verdict vb = loom_loss_scaler_update(&b, overflow);
        if (va != vb || memcmp(&a.st, &b.st, sizeof a.st) != 0) same = 0;
    }
    CHECK(same && a.st.skipped_steps > 0 && a.st.scale != 0x1p12);

    struct loom_loss_scaler_state good = a.st, st;
#define REJECTS(field, value)                                                                                \
    do {                                                                                                     \
        st = good;                                                                                           \
        st.field = value;                                                                                    \
        CHECK(loom_loss_scaler_restore(&b, &st) == LOOM_ERR_INPUT);                                          \
    } while (0)
    REJECTS(scale, 0);
    REJECTS(scale, NAN);
    REJECTS(scale, INFINITY);
    REJECTS(hysteresis, 0);
    REJECTS(steps, -1);
    REJECTS(skipped_steps, good.steps + 1);
    REJECTS(clean_steps, good.steps - good.skipped_steps + 1);
#undef REJECTS

    /* A static scaler takes the counts and keeps its own scale. */
    struct loom_loss_scaler_config cfg;
    loom_loss_scaler_defaults(&cfg);
    cfg.loss_scale = 8;
    struct loom_loss_scaler s;
    CHECK(loom_loss_scaler_init(&s, &cfg) == LOOM_OK);
    CHECK(loom_loss_scaler_restore(&s, &good) == LOOM_OK);
    CHECK(s.st.scale == 8 && s.st.steps == good.steps && s.st.skipped_steps == good.skipped_steps);
}

int main(void)
{
    test_defaults_are_deepspeeds();
    test_overflows_halve_then_window_doubles();
    test_window_from_the_start();
    test_hysteresis();
    test_consecutive_hysteresis();
    test_min_loss_scale();
    test_static_scale();
    test_bad_config();
    test_against_deepspeed_bookkeeping();
    test_restore();
    return check_summary("test_loss_scaler");
}
