/*
 * Peak FLOP/s for MFU: given by the user, or measured at start-up by a short
 * sgemm calibration on all threads (the best of a few runs).
 */
#ifndef LOOM_APP_MFU_H
#define LOOM_APP_MFU_H

/* Best sgemm FLOP/s on this machine with the current thread count. */
double loom_calibrate_peak_flops(void);

#endif
