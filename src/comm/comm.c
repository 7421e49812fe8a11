/*
 * The comm layer over a transport (comm_backend.h; MPI in comm_mpi.c):
 * topology, handles, the communication thread and the one wait path (see
 * comm.h).
 *
 * Requests go into a FIFO; the thread starts each through the transport in
 * posting order and tests the started ones, sleeping 20 us when none
 * completed. Waiters block on a condition variable with the deadline of
 * --comm-timeout. Without a transport (a build without MPI) the process is
 * alone and every collective is the identity.
 */
#include "comm/comm.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/dtype.h"
#include "base/log.h"
#include "base/trace.h"
#include "comm/comm_backend.h"
#include "loom/loom.h"

static const char *const group_names[] = {"world", "dp", "tp", "pp", "embedding"};
static_assert(sizeof group_names / sizeof group_names[0] == LOOM_GROUP_COUNT, "group_names");
static const char *const coll_names[] = {"all-reduce", "reduce-scatter", "all-gather",
                                         "broadcast",  "send",           "recv"};
static_assert(sizeof coll_names / sizeof coll_names[0] == LOOM_COLL_COUNT, "coll_names");

struct loom_comm_handle {
    struct loom_comm_op op; /* what the transport starts */
    int *counts;            /* reduce-scatter-v and all-gather-v: (group size), owned; op.counts */
    int *displs;            /* all-gather-v: (group size), owned; op.displs */
    int64_t step;
    double t_start, t_done; /* loom_now on the communication thread, for the trace */
    int local;              /* done at posting: one rank in the group, nothing moved */
    int done;               /* guarded by lock */
    struct loom_comm_handle *next;
    void *req; /* the transport's request, while started */
};

static const struct loom_comm_backend *transport; /* NULL: a single process, no transport */
static int world_size = 1, world_rank = 0, group_size[LOOM_GROUP_COUNT] = {1, 1, 1, 1, 1};
static int group_rank[LOOM_GROUP_COUNT]; /* this rank's place in each group */
static int have_group[LOOM_GROUP_COUNT]; /* made by the transport */
static double timeout_s = 600;
static int64_t cur_step = -1;
static int have_thread;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t posted = PTHREAD_COND_INITIALIZER, completed = PTHREAD_COND_INITIALIZER;
static struct loom_comm_handle *queue_head, *queue_tail; /* posted, not started */
static int stopping;
static pthread_t thread;

void loom_comm_set_timeout(double seconds)
{
    timeout_s = seconds;
}
void loom_comm_set_step(int64_t step)
{
    cur_step = step;
}
int loom_comm_world_size(void)
{
    return world_size;
}
int loom_comm_world_rank(void)
{
    return world_rank;
}

void loom_topology_format(const struct loom_topology *t, char *buf, size_t n)
{
    snprintf(buf, n, "TP(%d)-DP(%d)-PP(%d)-Rank(%d)", t->tp, t->dp, t->pp, t->rank);
}

/* The communication thread: start posted requests in order, test the active
 * ones, sleep briefly when nothing moved. */
static void *comm_thread(void *arg)
{
    (void)arg;
    enum { MAX_ACTIVE = 256 };
    struct loom_comm_handle *active[MAX_ACTIVE];
    int nactive = 0;
    for (;;) {
        pthread_mutex_lock(&lock);
        while (!queue_head && nactive == 0 && !stopping) pthread_cond_wait(&posted, &lock);
        if (stopping && !queue_head && nactive == 0) {
            pthread_mutex_unlock(&lock);
            return NULL;
        }
        struct loom_comm_handle *batch = NULL;
        if (nactive < MAX_ACTIVE) {
            batch = queue_head;
            struct loom_comm_handle *last = NULL;
            int room = MAX_ACTIVE - nactive;
            for (struct loom_comm_handle *h = queue_head; h && room > 0; h = h->next, room--) last = h;
            if (last) {
                queue_head = last->next;
                if (!queue_head) queue_tail = NULL;
                last->next = NULL;
            }
        }
        pthread_mutex_unlock(&lock);
        for (struct loom_comm_handle *h = batch; h; h = h->next) {
            h->t_start = loom_now();
            h->req = transport->start(&h->op);
            active[nactive++] = h;
        }
        int moved = 0;
        for (int i = 0; i < nactive;) {
            if (transport->test(active[i]->req)) {
                active[i]->req = NULL;
                active[i]->t_done = loom_now();
                pthread_mutex_lock(&lock);
                active[i]->done = 1;
                pthread_cond_broadcast(&completed);
                pthread_mutex_unlock(&lock);
                active[i] = active[--nactive];
                moved = 1;
            } else {
                i++;
            }
        }
        if (!moved && nactive) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

void loom_comm_init(int *argc, char ***argv)
{
    transport = loom_comm_backend_mpi();
    if (transport) transport->init(argc, argv, &world_size, &world_rank);
    group_rank[LOOM_GROUP_WORLD] = world_rank;
    loom_log_set_rank(world_rank);
    if (world_size > 1) loom_log_set_abort(loom_comm_abort);
}

int loom_comm_setup(struct loom_topology *t, int tp, int pp)
{
    memset(t, 0, sizeof *t);
    t->world = world_size;
    t->rank = world_rank;
    t->tp = t->pp = t->dp = 1;
    /* the world group and the thread first: even a bad layout is agreed on */
    if (transport && !have_group[LOOM_GROUP_WORLD]) {
        transport->create_group(LOOM_GROUP_WORLD, 0, world_rank);
        have_group[LOOM_GROUP_WORLD] = 1;
        group_size[LOOM_GROUP_WORLD] = world_size;
        if (world_size > 1 && !have_thread) {
            if (pthread_create(&thread, NULL, comm_thread, NULL) != 0) {
                fprintf(stderr, "loom: error: [rank %d] cannot start the communication thread\n", world_rank);
                transport->abort(LOOM_ERR_RUNTIME);
            }
            have_thread = 1;
        }
    }
    if (tp < 1 || pp < 1 || world_size % (tp * pp) != 0)
        return loom_error_set(
            LOOM_ERR_INPUT,
            "world size %d is not divisible by tensor-parallel size %d x pipeline-parallel size %d",
            world_size, tp, pp);
    t->tp = tp;
    t->pp = pp;
    t->dp = world_size / (tp * pp);
    t->tp_rank = world_rank % tp;
    t->dp_rank = world_rank / tp % t->dp;
    t->pp_rank = world_rank / (tp * t->dp);
    group_size[LOOM_GROUP_WORLD] = world_size;
    group_size[LOOM_GROUP_DP] = t->dp;
    group_size[LOOM_GROUP_TP] = tp;
    group_size[LOOM_GROUP_PP] = pp;
    group_rank[LOOM_GROUP_WORLD] = world_rank;
    group_rank[LOOM_GROUP_DP] = t->dp_rank;
    group_rank[LOOM_GROUP_TP] = t->tp_rank;
    group_rank[LOOM_GROUP_PP] = t->pp_rank;
    const int ends = pp > 1 && (t->pp_rank == 0 || t->pp_rank == pp - 1);
    group_size[LOOM_GROUP_EMBEDDING] = ends ? 2 : 1;
    group_rank[LOOM_GROUP_EMBEDDING] = ends && t->pp_rank > 0;
    if (transport && !have_group[LOOM_GROUP_DP]) {
        /* colour: the coordinates that stay fixed within the group */
        transport->create_group(LOOM_GROUP_DP, t->tp_rank + tp * t->pp_rank, t->dp_rank);
        transport->create_group(LOOM_GROUP_TP, t->dp_rank + t->dp * t->pp_rank, t->tp_rank);
        transport->create_group(LOOM_GROUP_PP, t->tp_rank + tp * t->dp_rank, t->pp_rank);
        /* a rank between the ends: a group of its own */
        transport->create_group(LOOM_GROUP_EMBEDDING,
                                ends ? t->tp_rank + tp * t->dp_rank : world_size + world_rank, t->pp_rank);
        have_group[LOOM_GROUP_DP] = have_group[LOOM_GROUP_TP] = have_group[LOOM_GROUP_PP] = 1;
        have_group[LOOM_GROUP_EMBEDDING] = 1;
    }
    return LOOM_OK;
}

/* Hands a built request to the communication thread. */
static void submit(struct loom_comm_handle *h)
{
    pthread_mutex_lock(&lock);
    if (queue_tail)
        queue_tail->next = h;
    else
        queue_head = h;
    queue_tail = h;
    pthread_cond_signal(&posted);
    pthread_mutex_unlock(&lock);
}

static struct loom_comm_handle *build(enum loom_coll coll, enum loom_group g, const void *send, void *recv,
                                      size_t count, enum loom_dtype dt, enum loom_op op, int peer, int tag)
{
    LOOM_ASSERT(g >= 0 && g < LOOM_GROUP_COUNT && dt >= 0 && dt < LOOM_DTYPE_COUNT);
    struct loom_comm_handle *h = calloc(1, sizeof *h);
    if (!h) loom_die("out of memory posting a collective");
    h->op = (struct loom_comm_op){.coll = coll,
                                  .group = g,
                                  .dt = dt,
                                  .op = op,
                                  .send = send,
                                  .recv = recv,
                                  .count = count,
                                  .peer = peer,
                                  .tag = tag};
    h->step = cur_step;
    return h;
}

/* One rank in the group: every collective is the identity. */
static int local_only(enum loom_group g)
{
    return group_size[g] == 1 || !have_thread;
}

static struct loom_comm_handle *post(enum loom_coll coll, enum loom_group g, const void *send, void *recv,
                                     size_t count, enum loom_dtype dt, enum loom_op op, int peer, int tag)
{
    struct loom_comm_handle *h = build(coll, g, send, recv, count, dt, op, peer, tag);
    if (local_only(g)) {
        size_t bytes = count * loom_dtype_size(dt);
        if ((coll == LOOM_COLL_REDUCE_SCATTER || coll == LOOM_COLL_ALLGATHER) && send && send != recv &&
            bytes)
            memcpy(recv, send, bytes);
        LOOM_ASSERT(coll != LOOM_COLL_SEND && coll != LOOM_COLL_RECV);
        h->done = h->local = 1;
        return h;
    }
    submit(h);
    return h;
}

/* The buffer's memory, for a CPU buffer of a dtype comm moves. */
static void *data_of(struct loom_buf b)
{
    LOOM_ASSERT(b.device == LOOM_DEVICE_CPU && b.dtype >= 0 && b.dtype < LOOM_DTYPE_COUNT);
    return b.data;
}

struct loom_comm_handle *loom_comm_allreduce(enum loom_group g, struct loom_buf b, enum loom_op op)
{
    return post(LOOM_COLL_ALLREDUCE, g, data_of(b), data_of(b), b.numel, b.dtype, op, 0, 0);
}

struct loom_comm_handle *loom_comm_reduce_scatter(enum loom_group g, struct loom_buf send,
                                                  struct loom_buf recv)
{
    LOOM_ASSERT(send.dtype == recv.dtype && send.numel == recv.numel * (size_t)group_size[g]);
    return post(LOOM_COLL_REDUCE_SCATTER, g, data_of(send), data_of(recv), recv.numel, recv.dtype,
                LOOM_OP_SUM, 0, 0);
}

struct loom_comm_handle *loom_comm_reduce_scatter_v(enum loom_group g, struct loom_buf send,
                                                    struct loom_buf recv, const int *counts)
{
    const int n = group_size[g];
    size_t total = 0;
    for (int r = 0; r < n; r++) total += (size_t)counts[r];
    LOOM_ASSERT(send.dtype == recv.dtype && send.numel == total &&
                recv.numel == (size_t)counts[group_rank[g]]);
    const enum loom_dtype dt = recv.dtype;
    if (local_only(g))
        return post(LOOM_COLL_REDUCE_SCATTER, g, data_of(send), data_of(recv), (size_t)counts[0], dt,
                    LOOM_OP_SUM, 0, 0);
    int *copy = malloc(sizeof(int) * (size_t)n);
    if (!copy) loom_die("out of memory posting a collective");
    for (int r = 0; r < n; r++) copy[r] = counts[r];
    struct loom_comm_handle *h =
        build(LOOM_COLL_REDUCE_SCATTER, g, data_of(send), data_of(recv), total, dt, LOOM_OP_SUM, 0, 0);
    h->op.counts = h->counts = copy;
    submit(h);
    return h;
}

struct loom_comm_handle *loom_comm_allgather_v(enum loom_group g, struct loom_buf send, struct loom_buf recv,
                                               const int *counts, const int *displs)
{
    const int n = group_size[g];
    const enum loom_dtype dt = recv.dtype;
    LOOM_ASSERT(send.dtype == dt && send.numel == (size_t)counts[group_rank[g]]);
    for (int r = 0; r < n; r++)
        LOOM_ASSERT(counts[r] >= 0 && displs[r] >= 0 && (size_t)displs[r] + (size_t)counts[r] <= recv.numel);
    if (local_only(g)) {
        struct loom_comm_handle *h = post(LOOM_COLL_ALLGATHER, g, NULL, NULL, 0, dt, LOOM_OP_SUM, 0, 0);
        if (counts[0])
            memcpy((char *)data_of(recv) + (size_t)displs[0] * loom_dtype_size(dt), data_of(send),
                   (size_t)counts[0] * loom_dtype_size(dt));
        return h;
    }
    int *c = malloc(sizeof(int) * (size_t)n), *d = malloc(sizeof(int) * (size_t)n);
    if (!c || !d) loom_die("out of memory posting a collective");
    size_t total = 0;
    for (int r = 0; r < n; r++) total += (size_t)(c[r] = counts[r]), d[r] = displs[r];
    struct loom_comm_handle *h =
        build(LOOM_COLL_ALLGATHER, g, data_of(send), data_of(recv), total, dt, LOOM_OP_SUM, 0, 0);
    h->op.counts = h->counts = c;
    h->op.displs = h->displs = d;
    submit(h);
    return h;
}

struct loom_comm_handle *loom_comm_allgather(enum loom_group g, struct loom_buf send, struct loom_buf recv)
{
    const size_t count = recv.numel / (size_t)group_size[g];
    LOOM_ASSERT(recv.numel == count * (size_t)group_size[g]);
    LOOM_ASSERT(!send.data || (send.dtype == recv.dtype && send.numel == count));
    return post(LOOM_COLL_ALLGATHER, g, send.data ? data_of(send) : NULL, data_of(recv), count, recv.dtype,
                LOOM_OP_SUM, 0, 0);
}

struct loom_comm_handle *loom_comm_broadcast(enum loom_group g, struct loom_buf b, int root)
{
    return post(LOOM_COLL_BROADCAST, g, data_of(b), data_of(b), b.numel, b.dtype, LOOM_OP_SUM, root, 0);
}

struct loom_comm_handle *loom_comm_send(enum loom_group g, struct loom_buf b, int peer, int tag)
{
    return post(LOOM_COLL_SEND, g, data_of(b), NULL, b.numel, b.dtype, LOOM_OP_SUM, peer, tag);
}

struct loom_comm_handle *loom_comm_recv(enum loom_group g, struct loom_buf b, int peer, int tag)
{
    return post(LOOM_COLL_RECV, g, NULL, data_of(b), b.numel, b.dtype, LOOM_OP_SUM, peer, tag);
}

double loom_comm_wait(struct loom_comm_handle *h)
{
    if (h->done && !have_thread) {
        free(h->counts);
        free(h->displs);
        free(h);
        return 0;
    }
    double t0 = loom_now();
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += (time_t)timeout_s;
    deadline.tv_nsec += (long)((timeout_s - (double)(time_t)timeout_s) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&lock);
    const int waited = !h->done;
    while (!h->done) {
        int rc = pthread_cond_timedwait(&completed, &lock, &deadline);
        if (rc == ETIMEDOUT && !h->done) {
            pthread_mutex_unlock(&lock);
            fprintf(stderr,
                    "loom: error: [rank %d] communication timeout: %s on the %s group (%zu bytes) not done "
                    "after %g s at step %lld; aborting the job\n",
                    world_rank, coll_names[h->op.coll], group_names[h->op.group],
                    h->op.count * loom_dtype_size(h->op.dt), timeout_s, (long long)h->step);
            loom_comm_abort(LOOM_ERR_RUNTIME);
        }
    }
    pthread_mutex_unlock(&lock);
    const double t1 = loom_now();
    if (loom_trace_on() && !h->local) {
        const size_t bytes = h->op.count * loom_dtype_size(h->op.dt);
        char name[64];
        snprintf(name, sizeof name, "%s %s", coll_names[h->op.coll], group_names[h->op.group]);
        loom_trace_comm(name, group_names[h->op.group], bytes, h->t_start, h->t_done);
        /* blocked on it: under pipeline parallelism, the bubble */
        snprintf(name, sizeof name, "wait %s %s", coll_names[h->op.coll], group_names[h->op.group]);
        if (waited) loom_trace_wait(name, t0, t1, bytes);
    }
    free(h->counts);
    free(h->displs);
    free(h);
    return t1 - t0;
}

void loom_comm_allreduce_sync(enum loom_group g, struct loom_buf b, enum loom_op op)
{
    loom_comm_wait(loom_comm_allreduce(g, b, op));
}

int loom_comm_agree_in(enum loom_group g, int rc, int *first_rank)
{
    uint64_t v[2] = {(uint64_t)rc, rc ? (uint64_t)world_rank : (uint64_t)world_size};
    loom_comm_allreduce_sync(g, loom_buf_of(&v[0], 1, LOOM_DTYPE_U64), LOOM_OP_MAX);
    if (v[0]) {
        /* the lowest rank with the worst status prints */
        uint64_t mine = (uint64_t)rc == v[0] ? (uint64_t)world_rank : (uint64_t)world_size;
        v[1] = mine;
        loom_comm_allreduce_sync(g, loom_buf_of(&v[1], 1, LOOM_DTYPE_U64), LOOM_OP_MIN);
    }
    if (first_rank) *first_rank = (int)v[1];
    return (int)v[0];
}

int loom_comm_agree(int rc, int *first_rank)
{
    return loom_comm_agree_in(LOOM_GROUP_WORLD, rc, first_rank);
}

int loom_comm_agree_shared(int rc)
{
    int first;
    int all = loom_comm_agree(rc, &first);
    if (!all || world_size == 1) return all;
    uint64_t words[128] = {0}; /* the message, as bytes */
    char *msg = (char *)words;
    if (world_rank == first) snprintf(msg, sizeof words, "%s", loom_error_message());
    loom_comm_wait(loom_comm_broadcast(LOOM_GROUP_WORLD, loom_buf_of(words, 128, LOOM_DTYPE_U64), first));
    msg[sizeof words - 1] = 0;
    loom_error_set(all, "%s", msg);
    return all;
}

void loom_comm_abort(int code)
{
    fflush(stdout);
    fflush(stderr);
    if (transport && world_size > 1) transport->abort(code);
    _exit(code);
}

void loom_comm_finalize(void)
{
    if (have_thread) {
        pthread_mutex_lock(&lock);
        stopping = 1;
        pthread_cond_signal(&posted);
        pthread_mutex_unlock(&lock);
        pthread_join(thread, NULL);
        have_thread = 0;
    }
    if (transport) {
        transport->finalize();
        transport = NULL;
        for (int g = 0; g < LOOM_GROUP_COUNT; g++) have_group[g] = 0;
    }
}
