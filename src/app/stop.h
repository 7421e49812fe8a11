/*
 * Graceful stop, as Megatron's exit signal handler: SIGTERM or SIGINT (a
 * scheduler's notice before the time limit, a Ctrl-C) asks the run to stop
 * at the next step boundary; the training loop agrees on it across ranks,
 * saves a checkpoint and exits 0. The first signal puts the default action
 * back, so a second one ends the process at once.
 */
#ifndef LOOM_APP_STOP_H
#define LOOM_APP_STOP_H

/* Installs the handlers (training only). */
void loom_stop_install(void);
/* The signal that asked to stop (SIGTERM, SIGINT), or 0. */
int loom_stop_signal(void);

#endif
