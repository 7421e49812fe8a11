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
#include <signal.h>
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

static const char *const group_names[] = {"world", "dp", "tp", "pp", "embedding", "cp", "ep", "expert-dp"};
static_assert(sizeof group_names / sizeof group_names[0] == LOOM_GROUP_COUNT, "group_names");
static const char *const coll_names[] = {"all-reduce", "reduce-scatter", "all-gather", "broadcast",
                                         "send",       "recv",           "all-to-all", "all-to-all-v"};
static_assert(sizeof coll_names / sizeof coll_names[0] == LOOM_COLL_COUNT, "coll_names");

struct loom_comm_handle {
    struct loom_comm_op op; /* what the transport starts */
    int *counts;            /* reduce-scatter-v and all-gather-v: (group size), owned; op.counts */
    int *displs;            /* all-gather-v: (group size), owned; op.displs */
    int64_t step;
    int64_t seq;            /* this rank's count of operations on the group, 1 for the first */
    double t_start, t_done; /* loom_now on the communication thread, for the trace */
    int local;              /* done at posting: one rank in the group, nothing moved */
    int done;               /* guarded by lock */
    struct loom_comm_handle *next;
    void *req; /* the transport's request, while started */
    /* a sum in the tree order (loom_comm_set_tree_sums): every rank's send
     * gathered into tree_rows, summed at the wait into tree_dst */
    void *tree_rows, *tree_dst;
    size_t tree_off, tree_n, tree_stride; /* the elements summed: [off, off + n) of rows of stride */
    /* device memory (base/mem.h's loom_devmem) moves through host copies:
     * host_send downloaded at posting, host_recv uploaded to dev_recv at the
     * wait; each NULL when its buffer is host memory */
    void *host_send, *host_recv, *dev_recv;
    size_t recv_bytes;
};

static const struct loom_comm_backend *transport; /* NULL: a single process, no transport */
static int world_size = 1, world_rank = 0, group_size[LOOM_GROUP_COUNT] = {1, 1, 1, 1, 1, 1, 1, 1};
static int group_rank[LOOM_GROUP_COUNT]; /* this rank's place in each group */
static int have_group[LOOM_GROUP_COUNT]; /* made by the transport */
static int tree_sums[LOOM_GROUP_COUNT];  /* loom_comm_set_tree_sums */
static double timeout_s = 600;
static int64_t cur_step = -1;
static int have_thread;

/* Progress, for hang reports (guarded by lock): operations posted on each
 * group, the last one completed, and the one the main thread waits in. */
struct progress_mark {
    int64_t seq, step;
    size_t bytes;
    enum loom_coll coll;
};
static int64_t posted_seq[LOOM_GROUP_COUNT];
static struct progress_mark last_done[LOOM_GROUP_COUNT];
static const struct loom_comm_handle *waiting_in; /* NULL: not waiting */
static double waiting_since;
static struct loom_topology topo_saved;
static char host[64] = "?";
static char (*hosts)[64];                  /* every world rank's host name, from set-up */
static volatile sig_atomic_t report_asked; /* SIGUSR1 */
static volatile sig_atomic_t stop_asked;   /* a stop signal (loom_comm_note_stop) */
static int reported;                       /* this rank printed its line for a hang */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t posted = PTHREAD_COND_INITIALIZER, completed = PTHREAD_COND_INITIALIZER;
static struct loom_comm_handle *queue_head, *queue_tail; /* posted, not started */
static int stopping;
static pthread_t thread;

void loom_comm_note_stop(void)
{
    stop_asked = 1;
}

void loom_comm_set_timeout(double seconds)
{
    timeout_s = seconds;
}
void loom_comm_set_step(int64_t step)
{
    cur_step = step;
    if (report_asked && !have_thread) { /* one process: no communication thread to print SIGUSR1's line */
        report_asked = 0;
        fprintf(stderr, "loom: progress: [rank %d on %s] at step %lld (one process: no collectives)\n",
                world_rank, host, (long long)step);
    }
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
    if (t->cp > 1)
        snprintf(buf, n, "TP(%d)-CP(%d)-DP(%d)-PP(%d)-Rank(%d)", t->tp, t->cp, t->dp / t->cp, t->pp, t->rank);
    else if (t->ep > 1) /* the data ranks, of which ep hold a layer's experts between them */
        snprintf(buf, n, "TP(%d)-EP(%d)-DP(%d)-PP(%d)-Rank(%d)", t->tp, t->ep, t->dp, t->pp, t->rank);
    else
        snprintf(buf, n, "TP(%d)-DP(%d)-PP(%d)-Rank(%d)", t->tp, t->dp, t->pp, t->rank);
}

/* ---- progress and hang reports ------------------------------------------------ */

static void mark_done(const struct loom_comm_handle *h) /* under lock */
{
    struct progress_mark *d = &last_done[h->op.group];
    if (h->seq > d->seq)
        *d = (struct progress_mark){h->seq, h->step, h->op.count * loom_dtype_size(h->op.dt), h->op.coll};
}

/* This rank's line: what it waits in (or that it waits in nothing) and
 * the last operation completed on that group. */
static void progress_line(char *buf, size_t n, enum loom_group g)
{
    pthread_mutex_lock(&lock);
    const struct loom_comm_handle *w = waiting_in;
    if (w) g = w->op.group;
    const struct progress_mark d = last_done[g];
    int k = snprintf(buf, n, "[rank %d on %s] ", world_rank, host);
    if (w)
        k += snprintf(
            buf + k, n - (size_t)k, "waiting in %s #%lld on the %s group (%zu bytes, step %lld) for %.1f s",
            coll_names[w->op.coll], (long long)w->seq, group_names[g],
            w->op.count * loom_dtype_size(w->op.dt), (long long)w->step, loom_now() - waiting_since);
    else
        k += snprintf(buf + k, n - (size_t)k,
                      "in no collective (computing, or stopped) at step %lld; %lld posted on the %s group",
                      (long long)cur_step, (long long)posted_seq[g], group_names[g]);
    if (d.seq)
        snprintf(buf + k, n - (size_t)k, "; last completed: %s #%lld on the %s group (step %lld)",
                 coll_names[d.coll], (long long)d.seq, group_names[g], (long long)d.step);
    else
        snprintf(buf + k, n - (size_t)k, "; none completed on the %s group", group_names[g]);
    pthread_mutex_unlock(&lock);
}

enum { TAG_QUERY = 1, TAG_REPLY = 2, MAX_REPLIES = 64 };

/* The communication thread's side of progress queries: a receive always
 * posted, the replies in flight. */
struct server {
    int32_t query[2]; /* group; 1: a hang (print this rank's line once) */
    void *listen;
    int64_t reply[MAX_REPLIES][3];
    void *sending[MAX_REPLIES];
};

static void serve(struct server *s)
{
    if (!transport->side_recv) return;
    if (report_asked) { /* SIGUSR1: the line, and the run goes on */
        report_asked = 0;
        char line[512];
        progress_line(line, sizeof line, LOOM_GROUP_WORLD);
        fprintf(stderr, "loom: progress: %s\n", line);
    }
    for (int i = 0; i < MAX_REPLIES; i++)
        if (s->sending[i] && transport->side_test(s->sending[i], NULL)) s->sending[i] = NULL;
    if (!s->listen) s->listen = transport->side_recv(s->query, sizeof s->query, -1, TAG_QUERY);
    int from;
    if (!transport->side_test(s->listen, &from)) return;
    s->listen = NULL;
    const enum loom_group g = (enum loom_group)s->query[0];
    if (s->query[1] && !__atomic_exchange_n(&reported, 1, __ATOMIC_RELAXED)) {
        char line[512];
        progress_line(line, sizeof line, g);
        fprintf(stderr, "loom: hang report: %s\n", line);
    }
    for (int i = 0; i < MAX_REPLIES; i++)
        if (!s->sending[i]) {
            pthread_mutex_lock(&lock);
            s->reply[i][0] = posted_seq[g];
            s->reply[i][1] = last_done[g].seq;
            s->reply[i][2] = cur_step;
            pthread_mutex_unlock(&lock);
            s->sending[i] = transport->side_send(s->reply[i], sizeof s->reply[i], from, TAG_REPLY);
            break;
        }
}

static void serve_end(struct server *s)
{
    if (s->listen) transport->side_cancel(s->listen);
    for (int i = 0; i < MAX_REPLIES; i++)
        while (s->sending[i] && !transport->side_test(s->sending[i], NULL)) {
        }
}

static void on_sigusr1(int sig)
{
    (void)sig;
    report_asked = 1;
}

/* World rank of member m of this rank's group g (ranks are placed tp
 * fastest, then dp, then pp); -1 past its size. */
static int member(enum loom_group g, int m)
{
    const struct loom_topology *t = &topo_saved;
    if (m >= group_size[g]) return -1;
    int tp = t->tp_rank, dp = t->dp_rank, pp = t->pp_rank;
    switch (g) {
    case LOOM_GROUP_WORLD:
        return m;
    case LOOM_GROUP_DP:
        dp = m;
        break;
    case LOOM_GROUP_TP:
        tp = m;
        break;
    case LOOM_GROUP_PP:
        pp = m;
        break;
    case LOOM_GROUP_EMBEDDING:
        pp = m == 0 ? 0 : t->pp - 1;
        break;
    default:
        return -1;
    }
    return tp + t->tp * (dp + t->dp * pp);
}

/* "2 (on HOST)": world rank r and its host, where set-up learned it. */
static int rank_name(char *buf, size_t n, int r)
{
    return hosts ? snprintf(buf, n, "%d (on %s)", r, hosts[r]) : snprintf(buf, n, "%d", r);
}

/* The deadline passed in h (or a stop signal came while h waits): this
 * rank's line, every member's (they print their own as they answer, within
 * answer_s), and the members that never reached h. */
static void report_hang(const struct loom_comm_handle *h, double answer_s)
{
    char line[512];
    /* once: a member's query may have had this rank say it already */
    if (!__atomic_exchange_n(&reported, 1, __ATOMIC_RELAXED)) {
        progress_line(line, sizeof line, h->op.group);
        fprintf(stderr, "loom: hang report: %s\n", line);
    }
    if (!transport || !transport->side_recv) return;
    const enum loom_group g = h->op.group;
    const int n = group_size[g];
    int32_t query[2] = {(int32_t)g, 1};
    int64_t(*replies)[3] = calloc((size_t)n, sizeof *replies);
    void **recvs = calloc((size_t)n, sizeof *recvs), **sends = calloc((size_t)n, sizeof *sends);
    if (!replies || !recvs || !sends) return;
    for (int m = 0; m < n; m++) {
        const int r = member(g, m);
        if (r == world_rank || r < 0) continue;
        recvs[m] = transport->side_recv(replies[m], sizeof replies[m], r, TAG_REPLY);
        sends[m] = transport->side_send(query, sizeof query, r, TAG_QUERY);
    }
    const double until = loom_now() + answer_s; /* a rank whose process is gone never answers */
    int left = 1;
    while (left && loom_now() < until) {
        left = 0;
        for (int m = 0; m < n; m++) {
            if (recvs[m] && transport->side_test(recvs[m], NULL)) recvs[m] = NULL;
            if (sends[m] && transport->side_test(sends[m], NULL)) sends[m] = NULL;
            left |= recvs[m] != NULL;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    char behind[512] = "", silent[512] = "", name[96];
    size_t kb = 0, ks = 0;
    for (int m = 0; m < n; m++) {
        const int r = member(g, m);
        if (r == world_rank || r < 0) continue;
        rank_name(name, sizeof name, r);
        if (recvs[m])
            ks += (size_t)snprintf(silent + ks, ks < sizeof silent ? sizeof silent - ks : 0, "%s%s",
                                   ks ? ", " : "", name);
        else if (replies[m][0] < h->seq)
            kb += (size_t)snprintf(behind + kb, kb < sizeof behind ? sizeof behind - kb : 0,
                                   "%s%s, %lld posted there, at step %lld", kb ? "; " : "", name,
                                   (long long)replies[m][0], (long long)replies[m][2]);
    }
    /* once: the deadline after a stop signal's report says it again only if it changed */
    static char said[1200];
    char summary[1200];
    snprintf(summary, sizeof summary,
             "loom: hang report: [rank %d] the %s group's ranks that never reached %s #%lld: %s%s%s\n",
             world_rank, group_names[g], coll_names[h->op.coll], (long long)h->seq, *behind ? behind : "none",
             *silent ? "; no answer from " : "", silent);
    if (strcmp(summary, said) != 0) fputs(summary, stderr);
    snprintf(said, sizeof said, "%s", summary);
    fflush(stderr);
    struct timespec ts = {0, answer_s > 1 ? 200000000 : 20000000}; /* let the answering ranks' lines out */
    nanosleep(&ts, NULL);
}

/* The communication thread: start posted requests in order, test the active
 * ones, sleep briefly when nothing moved. */
static void *comm_thread(void *arg)
{
    (void)arg;
    enum { MAX_ACTIVE = 256 };
    struct loom_comm_handle *active[MAX_ACTIVE];
    int nactive = 0;
    struct server srv = {0};
    for (;;) {
        serve(&srv);
        pthread_mutex_lock(&lock);
        while (!queue_head && nactive == 0 && !stopping) {
            if (!transport->side_recv) {
                pthread_cond_wait(&posted, &lock);
                continue;
            }
            /* idle: still answer progress queries and SIGUSR1, every 20 ms */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 20000000L;
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            if (pthread_cond_timedwait(&posted, &lock, &ts) == ETIMEDOUT) {
                pthread_mutex_unlock(&lock);
                serve(&srv);
                pthread_mutex_lock(&lock);
            }
        }
        if (stopping && !queue_head && nactive == 0) {
            pthread_mutex_unlock(&lock);
            serve_end(&srv);
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
                mark_done(active[i]);
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

/* A process torchrun (or DeepSpeed's launcher) started: RANK and WORLD_SIZE
 * set for a world of more than one, and no MPI job's variables (mpirun's,
 * Slurm's PMI/PMIx) around it. Each such
 * process would train alone as a world of one: said in one line, exit 2. */
static void refuse_torchrun_world(void)
{
    const char *ws = getenv("WORLD_SIZE"), *rank = getenv("RANK");
    if (!ws || !rank || atoi(ws) <= 1) return;
    static const char *const mpi_env[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof mpi_env / sizeof mpi_env[0]; i++)
        if (getenv(mpi_env[i])) return;
    fprintf(stderr,
            "loom: error: started with RANK=%s and WORLD_SIZE=%s (torchrun's or DeepSpeed's launcher) and no "
            "MPI: "
            "each of the %s processes would train alone; start them with loom launch --nproc_per_node=N (or "
            "mpirun -np N, srun -n N)\n",
            rank, ws, ws);
    exit(LOOM_ERR_INPUT);
}

void loom_comm_init(int *argc, char ***argv)
{
    refuse_torchrun_world(); /* before MPI: a lone process's MPI sets its own variables */
    transport = loom_comm_backend_mpi();
    if (transport) transport->init(argc, argv, &world_size, &world_rank);
    group_rank[LOOM_GROUP_WORLD] = world_rank;
    loom_log_set_rank(world_rank);
    if (world_size > 1) loom_log_set_abort(loom_comm_abort);
    gethostname(host, sizeof host - 1);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigusr1;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
}

void loom_comm_setup_world(void)
{
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
            /* every rank's host, for the hang reports */
            char(*all)[64] = calloc((size_t)world_size, sizeof *all);
            if (all) {
                memcpy(all[world_rank], host, sizeof host);
                loom_comm_wait(loom_comm_allgather(LOOM_GROUP_WORLD, loom_buf_of(NULL, 0, LOOM_DTYPE_U8),
                                                   loom_buf_of(all, (size_t)world_size * 64, LOOM_DTYPE_U8)));
                for (int r = 0; r < world_size; r++) all[r][63] = 0;
                hosts = all;
            }
        }
    }
}

int loom_comm_setup_cp(struct loom_topology *t, int tp, int pp, int cp)
{
    return loom_comm_setup_layout(t, tp, pp, cp, 1);
}

int loom_comm_setup_layout(struct loom_topology *t, int tp, int pp, int cp, int ep)
{
    memset(t, 0, sizeof *t);
    t->world = world_size;
    t->rank = world_rank;
    t->tp = t->pp = t->dp = t->cp = t->ep = 1;
    /* the world group and the thread first: even a bad layout is agreed on */
    loom_comm_setup_world();
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
    if (cp < 1 || t->dp % cp != 0)
        return loom_error_set(
            LOOM_ERR_INPUT,
            "world size %d over tensor-parallel size %d x pipeline-parallel size %d leaves %d "
            "ranks, not divisible by context-parallel size %d",
            world_size, tp, pp, t->dp, cp);
    t->cp = cp;
    t->cp_rank = t->dp_rank % cp;
    if (ep < 1 || t->dp % ep != 0)
        return loom_error_set(
            LOOM_ERR_INPUT,
            "world size %d over tensor-parallel size %d x pipeline-parallel size %d leaves %d "
            "data-parallel rank%s, not divisible by expert-parallel size %d",
            world_size, tp, pp, t->dp, t->dp == 1 ? "" : "s", ep);
    t->ep = ep;
    t->ep_rank = t->dp_rank % ep;
    topo_saved = *t;
    group_size[LOOM_GROUP_WORLD] = world_size;
    group_size[LOOM_GROUP_DP] = t->dp;
    group_size[LOOM_GROUP_TP] = tp;
    group_size[LOOM_GROUP_PP] = pp;
    group_rank[LOOM_GROUP_WORLD] = world_rank;
    group_rank[LOOM_GROUP_DP] = t->dp_rank;
    group_rank[LOOM_GROUP_TP] = t->tp_rank;
    group_rank[LOOM_GROUP_PP] = t->pp_rank;
    group_size[LOOM_GROUP_CP] = cp;
    group_rank[LOOM_GROUP_CP] = t->cp_rank;
    group_size[LOOM_GROUP_EP] = ep;
    group_rank[LOOM_GROUP_EP] = t->ep_rank;
    group_size[LOOM_GROUP_EXPERT_DP] = t->dp / ep;
    group_rank[LOOM_GROUP_EXPERT_DP] = t->dp_rank / ep;
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
    if (transport && cp > 1 && !have_group[LOOM_GROUP_CP]) {
        /* a later setup with another cp (loom plan's) never reaches here: a job has one layout */
        transport->create_group(LOOM_GROUP_CP, world_rank - t->cp_rank * tp, t->cp_rank);
        have_group[LOOM_GROUP_CP] = 1;
    }
    if (transport && ep > 1 && !have_group[LOOM_GROUP_EP]) {
        /* the position (tp, pp) and the data rank's block of ep; the position and the expert rank */
        const int pos = t->tp_rank + tp * t->pp_rank;
        transport->create_group(LOOM_GROUP_EP, pos + tp * pp * (t->dp_rank / ep), t->ep_rank);
        transport->create_group(LOOM_GROUP_EXPERT_DP, pos + tp * pp * t->ep_rank, t->dp_rank / ep);
        have_group[LOOM_GROUP_EP] = have_group[LOOM_GROUP_EXPERT_DP] = 1;
    }
    return LOOM_OK;
}

int loom_comm_setup(struct loom_topology *t, int tp, int pp)
{
    return loom_comm_setup_cp(t, tp, pp, 1);
}

int loom_comm_group_size(enum loom_group g)
{
    LOOM_ASSERT(g >= 0 && g < LOOM_GROUP_COUNT);
    return group_size[g];
}

int loom_comm_group_rank(enum loom_group g)
{
    LOOM_ASSERT(g >= 0 && g < LOOM_GROUP_COUNT);
    return group_rank[g];
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
    pthread_mutex_lock(&lock);
    h->seq = ++posted_seq[g];
    pthread_mutex_unlock(&lock);
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
        if ((coll == LOOM_COLL_REDUCE_SCATTER || coll == LOOM_COLL_ALLGATHER || coll == LOOM_COLL_ALLTOALL) &&
            send && send != recv && bytes)
            memcpy(recv, send, bytes);
        LOOM_ASSERT(coll != LOOM_COLL_SEND && coll != LOOM_COLL_RECV);
        h->done = h->local = 1;
        pthread_mutex_lock(&lock);
        mark_done(h);
        pthread_mutex_unlock(&lock);
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

void loom_comm_set_tree_sums(enum loom_group g, int on)
{
    LOOM_ASSERT(g >= 0 && g < LOOM_GROUP_COUNT);
    tree_sums[g] = on;
}

/* Whether a sum of dt on g goes through the tree (more than two ranks:
 * two are one addition, the same in any order). */
static int in_tree(enum loom_group g, enum loom_op op, enum loom_dtype dt)
{
    return tree_sums[g] && op == LOOM_OP_SUM && group_size[g] > 2 && !local_only(g) &&
           (dt == LOOM_DTYPE_F32 || dt == LOOM_DTYPE_F64);
}

/* The sum in the tree order: every rank's send (stride elements) gathered,
 * elements [off, off + n) of the sum written to dst at the wait. */
static struct loom_comm_handle *post_tree(enum loom_group g, const void *send, void *dst, size_t stride,
                                          size_t off, size_t n, enum loom_dtype dt)
{
    const size_t es = loom_dtype_size(dt);
    void *rows = malloc(stride * (size_t)group_size[g] * es + 1);
    if (!rows) loom_die("out of memory posting a collective");
    struct loom_comm_handle *h = build(LOOM_COLL_ALLGATHER, g, send, rows, stride, dt, LOOM_OP_SUM, 0, 0);
    h->tree_rows = rows;
    h->tree_dst = dst;
    h->tree_off = off;
    h->tree_n = n;
    h->tree_stride = stride;
    submit(h);
    return h;
}

/* row 0 = the pairwise tree over the group's rows in rank order: rows r
 * and r + w added for w = 1, 2, 4, ... */
static void finish_tree(struct loom_comm_handle *h)
{
    const int G = group_size[h->op.group];
    const size_t off = h->tree_off, n = h->tree_n, st = h->tree_stride;
    if (h->op.dt == LOOM_DTYPE_F64) {
        double *x = h->tree_rows;
        for (int w = 1; w < G; w *= 2)
            for (int r = 0; r + w < G; r += 2 * w)
                for (size_t i = off; i < off + n; i++) x[(size_t)r * st + i] += x[(size_t)(r + w) * st + i];
        memcpy(h->tree_dst, x + off, n * sizeof *x);
    } else {
        float *x = h->tree_rows;
        for (int w = 1; w < G; w *= 2)
            for (int r = 0; r + w < G; r += 2 * w)
                for (size_t i = off; i < off + n; i++) x[(size_t)r * st + i] += x[(size_t)(r + w) * st + i];
        memcpy(h->tree_dst, x + off, n * sizeof *x);
    }
    free(h->tree_rows);
}

/* A posting's buffers as the transport sees them: a device's buffer
 * (loom_devmem) replaced by a host copy of it, the send's and the receive's
 * current values downloaded (an in-place collective reads its receive). */
struct staging {
    void *send, *recv; /* what the transport gets */
    void *host_send, *host_recv, *dev_recv;
    size_t recv_bytes;
};

static void *download(const struct loom_devmem *d, const void *dev, size_t bytes)
{
    void *copy = malloc(bytes + 1);
    if (!copy) loom_die("out of memory staging a collective's %zu bytes", bytes);
    if (bytes) d->download(copy, dev, bytes);
    return copy;
}

static struct staging stage(struct loom_buf send, struct loom_buf recv)
{
    struct staging s = {send.data, recv.data, NULL, NULL, NULL, 0};
    const struct loom_devmem *d = loom_devmem();
    if (!d) return s;
    if (recv.data && d->owns(recv.data)) {
        s.recv_bytes = loom_buf_bytes(recv);
        s.recv = s.host_recv = download(d, recv.data, s.recv_bytes);
        s.dev_recv = recv.data;
    }
    if (send.data == recv.data)
        s.send = s.recv;
    else if (send.data && d->owns(send.data))
        s.send = s.host_send = download(d, send.data, loom_buf_bytes(send));
    return s;
}

static struct loom_comm_handle *staged(struct loom_comm_handle *h, const struct staging *s)
{
    h->host_send = s->host_send;
    h->host_recv = s->host_recv;
    h->dev_recv = s->dev_recv;
    h->recv_bytes = s->recv_bytes;
    return h;
}

/* At the wait: the receive back into the device's buffer. */
static void unstage(struct loom_comm_handle *h)
{
    if (h->dev_recv && h->recv_bytes) loom_devmem()->upload(h->dev_recv, h->host_recv, h->recv_bytes);
    free(h->host_send);
    free(h->host_recv);
}

struct loom_comm_handle *loom_comm_allreduce(enum loom_group g, struct loom_buf b, enum loom_op op)
{
    const struct staging s = stage(b, b);
    (void)data_of(b);
    if (in_tree(g, op, b.dtype))
        return staged(post_tree(g, s.send, s.recv, b.numel, 0, b.numel, b.dtype), &s);
    return staged(post(LOOM_COLL_ALLREDUCE, g, s.send, s.recv, b.numel, b.dtype, op, 0, 0), &s);
}

struct loom_comm_handle *loom_comm_reduce_scatter(enum loom_group g, struct loom_buf send,
                                                  struct loom_buf recv)
{
    LOOM_ASSERT(send.dtype == recv.dtype && send.numel == recv.numel * (size_t)group_size[g]);
    (void)data_of(send), (void)data_of(recv);
    const struct staging s = stage(send, recv);
    if (in_tree(g, LOOM_OP_SUM, recv.dtype))
        return staged(post_tree(g, s.send, s.recv, send.numel, recv.numel * (size_t)group_rank[g], recv.numel,
                                recv.dtype),
                      &s);
    return staged(
        post(LOOM_COLL_REDUCE_SCATTER, g, s.send, s.recv, recv.numel, recv.dtype, LOOM_OP_SUM, 0, 0), &s);
}

struct loom_comm_handle *loom_comm_reduce_scatter_v(enum loom_group g, struct loom_buf send,
                                                    struct loom_buf recv, const int *counts)
{
    const int n = group_size[g];
    size_t total = 0;
    for (int r = 0; r < n; r++) total += (size_t)counts[r];
    LOOM_ASSERT(send.dtype == recv.dtype && send.numel == total &&
                recv.numel == (size_t)counts[group_rank[g]]);
    (void)data_of(send), (void)data_of(recv);
    const enum loom_dtype dt = recv.dtype;
    const struct staging s = stage(send, recv);
    if (local_only(g))
        return staged(
            post(LOOM_COLL_REDUCE_SCATTER, g, s.send, s.recv, (size_t)counts[0], dt, LOOM_OP_SUM, 0, 0), &s);
    if (in_tree(g, LOOM_OP_SUM, dt)) {
        size_t off = 0;
        for (int r = 0; r < group_rank[g]; r++) off += (size_t)counts[r];
        return staged(post_tree(g, s.send, s.recv, total, off, (size_t)counts[group_rank[g]], dt), &s);
    }
    int *copy = malloc(sizeof(int) * (size_t)n);
    if (!copy) loom_die("out of memory posting a collective");
    for (int r = 0; r < n; r++) copy[r] = counts[r];
    struct loom_comm_handle *h =
        build(LOOM_COLL_REDUCE_SCATTER, g, s.send, s.recv, total, dt, LOOM_OP_SUM, 0, 0);
    h->op.counts = h->counts = copy;
    staged(h, &s);
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
    (void)data_of(send), (void)data_of(recv);
    const struct staging s = stage(send, recv);
    if (local_only(g)) {
        struct loom_comm_handle *h = post(LOOM_COLL_ALLGATHER, g, NULL, NULL, 0, dt, LOOM_OP_SUM, 0, 0);
        if (counts[0])
            memcpy((char *)s.recv + (size_t)displs[0] * loom_dtype_size(dt), s.send,
                   (size_t)counts[0] * loom_dtype_size(dt));
        return staged(h, &s);
    }
    int *c = malloc(sizeof(int) * (size_t)n), *d = malloc(sizeof(int) * (size_t)n);
    if (!c || !d) loom_die("out of memory posting a collective");
    size_t total = 0;
    for (int r = 0; r < n; r++) total += (size_t)(c[r] = counts[r]), d[r] = displs[r];
    struct loom_comm_handle *h = build(LOOM_COLL_ALLGATHER, g, s.send, s.recv, total, dt, LOOM_OP_SUM, 0, 0);
    h->op.counts = h->counts = c;
    h->op.displs = h->displs = d;
    staged(h, &s);
    submit(h);
    return h;
}

struct loom_comm_handle *loom_comm_allgather(enum loom_group g, struct loom_buf send, struct loom_buf recv)
{
    const size_t count = recv.numel / (size_t)group_size[g];
    LOOM_ASSERT(recv.numel == count * (size_t)group_size[g]);
    LOOM_ASSERT(!send.data || (send.dtype == recv.dtype && send.numel == count));
    if (send.data) (void)data_of(send);
    (void)data_of(recv);
    const struct staging s = stage(send, recv);
    return staged(post(LOOM_COLL_ALLGATHER, g, s.send, s.recv, count, recv.dtype, LOOM_OP_SUM, 0, 0), &s);
}

struct loom_comm_handle *loom_comm_alltoall(enum loom_group g, struct loom_buf send, struct loom_buf recv)
{
    const size_t count = send.numel / (size_t)group_size[g];
    LOOM_ASSERT(send.numel == count * (size_t)group_size[g] && recv.numel == send.numel &&
                send.dtype == recv.dtype);
    (void)data_of(send), (void)data_of(recv);
    const struct staging s = stage(send, recv);
    return staged(post(LOOM_COLL_ALLTOALL, g, s.send, s.recv, count, recv.dtype, LOOM_OP_SUM, 0, 0), &s);
}

struct loom_comm_handle *loom_comm_alltoall_v(enum loom_group g, struct loom_buf send, const int *scounts,
                                              const int *sdispls, struct loom_buf recv, const int *rcounts,
                                              const int *rdispls)
{
    const int n = group_size[g];
    const enum loom_dtype dt = recv.dtype;
    LOOM_ASSERT(send.dtype == dt);
    size_t total = 0;
    for (int r = 0; r < n; r++) {
        LOOM_ASSERT(scounts[r] >= 0 && sdispls[r] >= 0 &&
                    (size_t)sdispls[r] + (size_t)scounts[r] <= send.numel);
        LOOM_ASSERT(rcounts[r] >= 0 && rdispls[r] >= 0 &&
                    (size_t)rdispls[r] + (size_t)rcounts[r] <= recv.numel);
        total += (size_t)rcounts[r];
    }
    (void)data_of(send), (void)data_of(recv);
    const struct staging s = stage(send, recv);
    if (local_only(g)) {
        struct loom_comm_handle *h = post(LOOM_COLL_ALLTOALL_V, g, NULL, NULL, 0, dt, LOOM_OP_SUM, 0, 0);
        LOOM_ASSERT(scounts[0] == rcounts[0]);
        if (rcounts[0])
            memmove((char *)s.recv + (size_t)rdispls[0] * loom_dtype_size(dt),
                    (const char *)s.send + (size_t)sdispls[0] * loom_dtype_size(dt),
                    (size_t)rcounts[0] * loom_dtype_size(dt));
        return staged(h, &s);
    }
    int *c = malloc(sizeof(int) * 4 * (size_t)n);
    if (!c) loom_die("out of memory posting a collective");
    for (int r = 0; r < n; r++)
        c[r] = scounts[r], c[n + r] = sdispls[r], c[2 * n + r] = rcounts[r], c[3 * n + r] = rdispls[r];
    struct loom_comm_handle *h = build(LOOM_COLL_ALLTOALL_V, g, s.send, s.recv, total, dt, LOOM_OP_SUM, 0, 0);
    h->op.counts = h->counts = c; /* one block, freed with counts */
    h->op.displs = c + n;
    h->op.rcounts = c + 2 * n;
    h->op.rdispls = c + 3 * n;
    staged(h, &s);
    submit(h);
    return h;
}

struct loom_comm_handle *loom_comm_broadcast(enum loom_group g, struct loom_buf b, int root)
{
    (void)data_of(b);
    const struct staging s = stage(b, b);
    return staged(post(LOOM_COLL_BROADCAST, g, s.send, s.recv, b.numel, b.dtype, LOOM_OP_SUM, root, 0), &s);
}

struct loom_comm_handle *loom_comm_send(enum loom_group g, struct loom_buf b, int peer, int tag)
{
    (void)data_of(b);
    const struct staging s = stage(b, (struct loom_buf){0});
    return staged(post(LOOM_COLL_SEND, g, s.send, NULL, b.numel, b.dtype, LOOM_OP_SUM, peer, tag), &s);
}

struct loom_comm_handle *loom_comm_recv(enum loom_group g, struct loom_buf b, int peer, int tag)
{
    (void)data_of(b);
    const struct staging s = stage((struct loom_buf){0}, b);
    return staged(post(LOOM_COLL_RECV, g, NULL, s.recv, b.numel, b.dtype, LOOM_OP_SUM, peer, tag), &s);
}

double loom_comm_wait(struct loom_comm_handle *h)
{
    if (h->done && !have_thread) {
        unstage(h);
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
    waiting_in = h;
    waiting_since = t0;
    double stop_seen = 0; /* when this wait saw a stop signal; 0: none, -1: reported */
    while (!h->done) {
        /* wake every 50 ms: a stop signal while a collective is blocked
         * (mpirun ending the job after a host died, a scheduler's SIGTERM
         * on a hung job) reports the ranks that do not answer before the
         * SIGKILL that follows within a second */
        struct timespec slice;
        clock_gettime(CLOCK_REALTIME, &slice);
        slice.tv_nsec += 50000000L;
        if (slice.tv_nsec >= 1000000000L) slice.tv_sec++, slice.tv_nsec -= 1000000000L;
        const int last = slice.tv_sec > deadline.tv_sec ||
                         (slice.tv_sec == deadline.tv_sec && slice.tv_nsec >= deadline.tv_nsec);
        int rc = pthread_cond_timedwait(&completed, &lock, last ? &deadline : &slice);
        if (h->done) break;
        if (rc == ETIMEDOUT && !last && stop_asked && stop_seen >= 0) {
            const double now = loom_now();
            if (stop_seen == 0) stop_seen = now;
            if (now - stop_seen >= 0.2) {
                stop_seen = -1;
                pthread_mutex_unlock(&lock);
                fprintf(stderr, "loom: hang report: [rank %d] a stop signal came while this rank waits\n",
                        world_rank);
                report_hang(h, 0.4);
                pthread_mutex_lock(&lock);
            }
        }
        if (rc == ETIMEDOUT && last && !h->done) {
            pthread_mutex_unlock(&lock);
            report_hang(h, 5);
            fprintf(stderr,
                    "loom: error: [rank %d] communication timeout: %s #%lld on the %s group (%zu bytes) not "
                    "done after %g s at step %lld; aborting the job\n",
                    world_rank, coll_names[h->op.coll], (long long)h->seq, group_names[h->op.group],
                    h->op.count * loom_dtype_size(h->op.dt), timeout_s, (long long)h->step);
            loom_comm_abort(LOOM_ERR_RUNTIME);
        }
    }
    waiting_in = NULL;
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
    if (h->tree_rows) finish_tree(h);
    unstage(h);
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
    free(hosts);
    hosts = NULL;
}
