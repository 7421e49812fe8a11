/*
 * A plot's axes as a plotting library draws them: ticks at multiples of 1,
 * 2 or 5 times a power of ten, about five of them, and labels with only the
 * digits the step needs, in one style an axis. loom report's page
 * (html_report.c) draws with them.
 */
#ifndef LOOM_APP_PLOT_AXIS_H
#define LOOM_APP_PLOT_AXIS_H

#include <stddef.h>

/* An axis: the range drawn and the step of its ticks (1, 2 or 5 times a
 * power of ten); the ticks are the step's multiples in the range. */
struct axis {
    double lo, hi, step;
};

/* The first and the last tick's multiple of the step (with rounding's slack). */
long long tick_first(const struct axis *a);
long long tick_last(const struct axis *a);
/* The axis over [lo, hi] (lo < hi) whose step, at least min_step, gives 4
 * to 6 ticks (else the count nearest), and of those the one that fills
 * most of its range. extend: the range grows to the ticks at or beyond its
 * ends, as a value axis's does (never below zero when no value is);
 * otherwise the range stays and the ticks are those inside it (steps,
 * time). */
struct axis nice_axis(double lo, double hi, int extend, double min_step);
/* A tick's label in its axis's one style: fixed decimals (12, 0.5, 0.02);
 * from ten thousand up a thousands suffix (35k, 1.5M, up to T); below 0.01
 * and beyond the suffixes e-notation (5e-4, 1.5e-3, 3e20). */
void tick_label(char *buf, size_t n, double v, const struct axis *a);

#endif
