/* Nice axes for the report's plots (see plot_axis.h). */
#include "app/plot_axis.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The first and the last tick's multiple of the step (with rounding's slack). */
long long tick_first(const struct axis *a)
{
    return (long long)ceil(a->lo / a->step - 1e-9);
}
long long tick_last(const struct axis *a)
{
    return (long long)floor(a->hi / a->step + 1e-9);
}

/* The axis over [lo, hi] (lo < hi) whose step, at least min_step, gives 4
 * to 6 ticks (else the count nearest), and of those the one that fills
 * most of its range. extend: the range grows to the ticks at or beyond its
 * ends, as a value axis's does, so that it starts at the tick at or below
 * the smallest value (never below zero when no value is); otherwise the
 * range stays and the ticks are those inside it (steps, time). */
struct axis nice_axis(double lo, double hi, int extend, double min_step)
{
    static const double mult[3] = {1, 2, 5};
    const int top = (int)floor(log10(hi - lo));
    struct axis best = {lo, hi, 0};
    double best_off = INFINITY, best_fill = 0;
    for (int e = top - 2; e <= top + 1; e++)
        for (int m = 0; m < 3; m++) {
            struct axis a = {lo, hi, mult[m] * pow(10, e)};
            if (a.step < min_step) continue;
            if (extend) a.lo = floor(lo / a.step + 1e-9) * a.step, a.hi = ceil(hi / a.step - 1e-9) * a.step;
            const long long gaps = tick_last(&a) - tick_first(&a);
            const double off = fmax(fmax(3 - (double)gaps, (double)gaps - 5), 0);
            const double fill = extend ? (hi - lo) / (a.hi - a.lo) : (double)gaps * a.step / (hi - lo);
            if (off > best_off || (off == best_off && fill <= best_fill)) continue;
            best = a, best_off = off, best_fill = fill;
        }
    if (!(best.step > 0) || !isfinite(best.lo) || !isfinite(best.hi)) /* no step fits: one tick a side */
        best = (struct axis){lo, hi, isfinite(hi - lo) && hi > lo ? hi - lo : 1};
    return best;
}

/* Decimals that multiples of step need: none for 1, 2, 5 and up, one for 0.5 and 0.2. */
static int step_decimals(double step)
{
    const int d = (int)ceil(-log10(step) - 1e-9);
    return d > 0 ? d : 0;
}

/* v (not 0) in e-notation with the mantissa digits that multiples of step
 * need at v's power of ten, trailing zeros dropped: 5e-4, 1.5e-3. */
static void e_label(char *buf, size_t n, double v, double step)
{
    const int e = (int)floor(log10(fabs(v)) + 1e-9), k = (int)floor(log10(step) + 1e-9);
    char mant[32];
    snprintf(mant, sizeof mant, "%.*f", e > k ? e - k : 0, v / pow(10, e));
    if (strchr(mant, '.')) {
        size_t len = strlen(mant);
        while (mant[len - 1] == '0') mant[--len] = 0;
        if (mant[len - 1] == '.') mant[--len] = 0;
    }
    snprintf(buf, n, "%se%d", mant, e);
}

/* A tick's label in its axis's one style, with the digits the step needs
 * and no more: fixed decimals (12, 0.5, 0.02); from ten thousand up a
 * thousands suffix (35k, 1.5M, up to T); below 0.01 and beyond the
 * suffixes e-notation (5e-4, 1.5e-3, 3e20); in the last two zero is 0. */
void tick_label(char *buf, size_t n, double v, const struct axis *a)
{
    static const char suffix[] = "kMGT";
    const double big = fmax(fabs((double)tick_first(a)), fabs((double)tick_last(a))) * a->step;
    const int si = big >= 1e4 && big < 1e15, sci = big < 1e-2 || big >= 1e15;
    if (v == 0 && (si || sci)) {
        snprintf(buf, n, "0");
    } else if (si) {
        const int p = (int)floor(log10(big) / 3 + 1e-9);
        const double unit = pow(1000, p);
        snprintf(buf, n, "%.*f%c", step_decimals(a->step / unit), v / unit, suffix[p - 1]);
    } else if (sci) {
        e_label(buf, n, v, a->step);
    } else {
        snprintf(buf, n, "%.*f", step_decimals(a->step), v);
    }
}
