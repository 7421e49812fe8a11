/* Test points armed from the environment (see testpoint.h). */
#include "base/testpoint.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char crash_at[64];   /* LOOM_TEST_CRASH_AT; "" when unset */
static char stall_at[32];   /* "step STEP" of LOOM_TEST_STALL; "" when unset */
static int stall_rank = -1; /* RANK of LOOM_TEST_STALL */
static int host_read;       /* LOOM_TEST_HOST_READ set */

static void read_environment(void)
{
    const char *crash = getenv("LOOM_TEST_CRASH_AT"), *stall = getenv("LOOM_TEST_STALL");
    if (crash) snprintf(crash_at, sizeof crash_at, "%s", crash);
    host_read = getenv("LOOM_TEST_HOST_READ") != NULL;
    int rank, step;
    if (stall && sscanf(stall, "%d:%d", &rank, &step) == 2) {
        stall_rank = rank;
        snprintf(stall_at, sizeof stall_at, "step %d", step);
    }
}

void loom_test_point(const char *name)
{
    pthread_once(&once, read_environment);
    if (*crash_at && strcmp(name, crash_at) == 0) raise(SIGKILL);
    if (*stall_at && strcmp(name, stall_at) == 0 && loom_log_rank() == stall_rank)
        for (;;) pause();
}

void loom_test_host_read(const void *p)
{
    pthread_once(&once, read_environment);
    if (host_read && p) {
        const volatile unsigned char *b = p;
        fprintf(stderr, "loom: test point: a direct host read of %p\n", p);
        (void)b[0];
    }
}
