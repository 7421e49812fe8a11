/*
 * Peak FLOP/s for MFU: given by the user, or measured at start-up by a short
 * calibration on all threads (the best of a few runs) with the products the
 * training uses: sgemm, or under bf16 the bf16 product on the units chosen
 * (kernels/kernels.h's loom_bf16_units), so MFU counts against the peak of
 * the precision in use.
 */
#ifndef LOOM_APP_MFU_H
#define LOOM_APP_MFU_H

#include "base/dtype.h"

/* Best FLOP/s of a 1024^3 product in compute (F32, or BF16 on its units)
 * on this machine with the current thread count. */
double loom_calibrate_peak_flops(enum loom_dtype compute);

#endif
