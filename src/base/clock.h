/*
 * The one clock loom measures time with: seconds on the monotonic clock,
 * for step times, checkpoint I/O rates, communication waits and progress.
 * Not here: wall-clock time of day (deadlines for a timed wait take
 * CLOCK_REALTIME where the call asks for it).
 */
#ifndef LOOM_BASE_CLOCK_H
#define LOOM_BASE_CLOCK_H

/* Seconds since an arbitrary fixed point; only differences mean anything. */
double loom_now(void);

#endif
