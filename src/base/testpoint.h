/*
 * Test points: named places where a test makes the process fail on purpose,
 * armed from the environment (read once, at the first point reached) and
 * doing nothing otherwise.
 *
 *   LOOM_TEST_CRASH_AT=POINT  the process kills itself with SIGKILL at POINT.
 *                             The checkpoint save's points: after-rank-file
 *                             (a rank's file is in the temporary directory),
 *                             before-rename, before-latest, after-latest.
 *   LOOM_TEST_STALL=RANK:STEP rank RANK stops answering (pauses for good)
 *                             at point "step STEP", which the training loop
 *                             reaches before each step, to exercise the
 *                             communication deadline.
 *
 * Not here: faults a test can cause from outside (a full disk, kill -9 at a
 * random moment).
 */
#ifndef LOOM_BASE_TESTPOINT_H
#define LOOM_BASE_TESTPOINT_H

/* Acts when the environment arms the point `name`; returns otherwise. */
void loom_test_point(const char *name);

#endif
