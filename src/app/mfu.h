/*
 * Peak FLOP/s for MFU: given by the user (--peak-tflops), or calibrated on
 * this machine with the products the training uses (sgemm, or under bf16
 * the bf16 product on the units chosen: kernels/kernels.h's
 * loom_bf16_units), so MFU counts against the peak of the precision in use.
 *
 * A calibration on a shared machine swings with its load (33 to 167
 * GFLOP/s have been seen), so the peak is kept per machine: the first
 * start-up measures the best of many short products and caches it (the
 * CPU's model, its logical CPUs, the threads, the dtype and the units are
 * the key; ~/.cache/loom/peak.json, or $XDG_CACHE_HOME/loom); later
 * start-ups measure a few and keep the best ever seen. So the peak only
 * grows toward the machine's own, and an MFU above 100% means that peak is
 * still too low: the report says so rather than print it as real.
 */
#ifndef LOOM_APP_MFU_H
#define LOOM_APP_MFU_H

#include <stddef.h>

#include "base/dtype.h"

/* Best FLOP/s of three 1024^3 products in compute (F32, or BF16 on its
 * units) on this machine with the current thread count (after one that
 * warms up). */
double loom_calibrate_peak_flops(enum loom_dtype compute);

/* This machine's peak for compute at `threads` threads: the cache's best
 * and a short calibration now, the larger (written back when it grew), or
 * a long calibration when the cache has none. source: one line saying
 * which ("best of 3 start-ups' calibrations, cached in FILE"). */
double loom_machine_peak_flops(enum loom_dtype compute, int threads, char *source, size_t n);

#endif
