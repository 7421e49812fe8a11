/*
 * Peak FLOP/s for MFU: given by the user (--peak-tflops), or calibrated on
 * this machine with the products the training uses (sgemm, or under bf16
 * the bf16 product on the units chosen: kernels/kernels.h's
 * loom_bf16_units), so MFU counts against the peak of the precision in use.
 *
 * A wall-clock calibration on a shared machine swings with its load (33 to
 * 167 GFLOP/s have been seen), so a core's speed is measured instead: one
 * thread's best product rate by its own CPU time, times the threads. It is
 * kept per machine (the CPU's model, its logical CPUs, the threads, the
 * dtype and the units are the key; ~/.cache/loom/peak.json, or
 * $XDG_CACHE_HOME/loom): the first start-up measures more products, later
 * ones a few, and the best ever seen stands. An MFU above 100% then means
 * the peak is too low (a --peak-tflops below the run), and is said so.
 */
#ifndef LOOM_APP_MFU_H
#define LOOM_APP_MFU_H

#include <stddef.h>

#include "base/dtype.h"

/* One calibration now: a core's best 1024^3 product rate in compute (F32,
 * or BF16 on its units) times the current thread count (the benches'). */
double loom_calibrate_peak_flops(enum loom_dtype compute);

/* This machine's peak for compute at the current thread count (threads
 * beyond the physical cores add nothing): the cache's best and a short
 * calibration now, the larger (written back with the count of start-ups),
 * or a long calibration when the cache has none. source: one
 * line saying which ("the best calibration of 3 start-ups on this machine,
 * cached in FILE"). */
double loom_machine_peak_flops(enum loom_dtype compute, char *source, size_t n);

/* MFU as the step lines and the summary print it: "41.3%", or, above 100%
 * (the peak is too low, not the run too fast), ">100% (peak too low)". */
void loom_mfu_text(char *buf, size_t n, double mfu);

#endif
