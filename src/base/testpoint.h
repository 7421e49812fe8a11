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
 *   LOOM_TEST_HOST_READ=1     the model's parameters are read directly by host
 *                             code once their initial values are in place
 *                             (loom_test_host_read): on a backend whose
 *                             memory host code cannot reach (--backend
 *                             guarded) that must be caught.
 *
 * Not here: faults a test can cause from outside (a full disk, kill -9 at a
 * random moment).
 */
#ifndef LOOM_BASE_TESTPOINT_H
#define LOOM_BASE_TESTPOINT_H

/* Acts when the environment arms the point `name`; returns otherwise. */
void loom_test_point(const char *name);
/* Reads the byte at p directly when LOOM_TEST_HOST_READ arms it. */
void loom_test_host_read(const void *p);

#endif
