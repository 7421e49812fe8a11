/* Graceful stop on SIGTERM, SIGINT, SIGUSR2 and SIGURG (see stop.h). */
#include "app/stop.h"

#include <signal.h>
#include <string.h>

#include "comm/comm.h"

static volatile sig_atomic_t received;

static void on_signal(int sig)
{
    received = sig;
    loom_comm_note_stop();
    if (sig == SIGTERM || sig == SIGINT) signal(sig, SIG_DFL); /* a second one ends the process */
}

void loom_stop_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
    sigaction(SIGURG, &sa, NULL);
}

int loom_stop_signal(void)
{
    return received;
}
