/*
 * Graceful stop, as Megatron's exit signal handler: SIGTERM or SIGINT (a
 * scheduler's notice before the time limit, a Ctrl-C) asks the run to stop
 * at the next step boundary; the training loop agrees on it across ranks,
 * saves a checkpoint and exits 0. The first signal puts the default action
 * back, so a second one ends the process at once.
 *
 * SIGUSR2 and SIGURG ask the same, any number of times. mpirun forwards
 * SIGUSR2 to every rank (a SIGTERM of its own it answers by killing them);
 * SIGURG is the stop `loom launch` sends through mpirun (cli/launch.c):
 * ignored by default, it cannot kill a rank that has not installed these
 * handlers yet.
 */
#ifndef LOOM_APP_STOP_H
#define LOOM_APP_STOP_H

/* Installs the handlers (training only, before MPI starts: a stop asked
 * during set-up is kept for the first step boundary). */
void loom_stop_install(void);
/* The signal that asked to stop (SIGTERM, SIGINT, SIGUSR2, SIGURG), or 0. */
int loom_stop_signal(void);

#endif
