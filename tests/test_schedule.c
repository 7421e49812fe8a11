/*
 * The pipeline schedules (parallel/schedule.c), as plans, for P = 1..8
 * stages, m = 1..16 micro-batches and (interleaved) 2..4 chunks a stage:
 *
 * 1. Every plan runs each (micro-batch, chunk) forward once and backward
 *    once, a backward after its forward, the first forwards (chunk 0) and
 *    the last backwards (chunk 0) in micro-batch order, and its phases in
 *    order (warmup, steady, cooldown).
 * 2. In flight (first forward to last backward): GPipe m, 1F1B
 *    min(P - s, m) on stage s, no pipelining 1; the plan's `slots` is the
 *    count, and micro-batch k's slot k % slots is never taken by another
 *    micro-batch in flight.
 * 3. The stages' plans together, run by a simulation of loom_schedule_run
 *    (a pass starts once its stage is free and the activation or gradient
 *    it receives has been sent; sends do not block), never deadlock; between
 *    any two stages each kind of message is received in the order it was
 *    sent, for the micro-batch and chunk the receiver expects.
 * 4. With forward 1 and backward 2 time units a stage (a chunk 1/v of
 *    that), the simulated idle share of every stage is exactly
 *    (P-1)/(m+P-1) for GPipe and 1F1B, and (P-1)/(v m+P-1) for interleaved
 *    (Megatron's bubble), below 1F1B's.
 * Interleaved micro-batches that are not a multiple of P are refused by the
 * configuration (config/resolve.c; tests/test_pipeline_parallel.py).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "loom/config.h"
#include "loom/loom.h"
#include "parallel/schedule.h"

#define MAXP 8
#define MAXM 16
#define MAXV 4

struct sim {
    int P, v, m;
    struct loom_pipe_plan plan[MAXP];
    /* finish time of (stage-independent) virtual stage vs's forward/backward of micro k */
    double fwd_done[MAXP * MAXV][MAXM], bwd_done[MAXP * MAXV][MAXM];
    /* messages between stage pairs, in send order: (micro, virtual stage it is for) */
    int sent_n[2][MAXP], sent_k[2][MAXP][MAXM * MAXV], sent_vs[2][MAXP][MAXM * MAXV];
    int recv_n[2][MAXP];
};

static void check_plan(const struct loom_pipe_plan *p, int expect_slots)
{
    int fwd[MAXM][MAXV] = {{0}}, bwd[MAXM][MAXV] = {{0}}, next_first = 0, next_last = 0, live = 0, most = 0;
    int in_flight[MAXM] = {0};
    enum loom_phase phase = LOOM_PHASE_WARMUP;
    CHECK(p->n == 2 * p->chunks * p->micro_batches);
    for (int i = 0; i < p->n; i++) {
        const struct loom_pipe_pass *x = &p->passes[i];
        CHECK(x->micro >= 0 && x->micro < p->micro_batches && x->chunk >= 0 && x->chunk < p->chunks);
        CHECK(x->phase >= phase); /* warmup, steady, cooldown in order */
        phase = x->phase;
        if (x->pass == LOOM_PASS_FORWARD) {
            CHECK(fwd[x->micro][x->chunk]++ == 0);
            if (x->chunk == 0) {
                CHECK(x->micro == next_first++);
                /* its slot is free: no micro-batch in flight has the same one */
                for (int k = 0; k < p->micro_batches; k++)
                    CHECK(!in_flight[k] || k % p->slots != x->micro % p->slots);
                in_flight[x->micro] = 1;
                if (++live > most) most = live;
            }
        } else {
            CHECK(fwd[x->micro][x->chunk] == 1 && bwd[x->micro][x->chunk]++ == 0);
            if (x->chunk == 0) {
                CHECK(x->micro == next_last++);
                in_flight[x->micro] = 0;
                live--;
            }
        }
    }
    CHECK(next_first == p->micro_batches && next_last == p->micro_batches && live == 0);
    CHECK(most == p->slots);
    if (expect_slots > 0) CHECK(p->slots == expect_slots);
}

/* The virtual stage of chunk c on stage s. */
static int vstage(const struct sim *S, int s, int c)
{
    return c * S->P + s;
}

/* Simulates every stage's plan; returns 0 on a deadlock or a mismatched
 * message, and each stage's idle share in idle[]. */
static int simulate(struct sim *S, double *idle)
{
    const int P = S->P, V = S->v, last_vs = P * V - 1;
    const double tf = 1.0 / V, tb = 2.0 / V;
    int at[MAXP] = {0};
    double clock[MAXP] = {0}, busy[MAXP] = {0};
    for (int a = 0; a < P * V; a++)
        for (int k = 0; k < S->m; k++) S->fwd_done[a][k] = S->bwd_done[a][k] = -1;
    memset(S->sent_n, 0, sizeof S->sent_n);
    memset(S->recv_n, 0, sizeof S->recv_n);
    for (;;) {
        int progressed = 0, finished = 1;
        for (int s = 0; s < P; s++) {
            const struct loom_pipe_plan *p = &S->plan[s];
            while (at[s] < p->n) {
                const struct loom_pipe_pass *x = &p->passes[at[s]];
                const int vs = vstage(S, s, x->chunk), k = x->micro;
                double ready;
                if (x->pass == LOOM_PASS_FORWARD) {
                    ready = vs == 0 ? 0 : S->fwd_done[vs - 1][k];
                } else {
                    if (S->fwd_done[vs][k] < 0) return 0; /* a backward before its own forward */
                    ready = vs == last_vs ? S->fwd_done[vs][k] : S->bwd_done[vs + 1][k];
                }
                if (ready < 0) break; /* blocked on a receive */
                /* the receive takes the next message of its kind from that neighbour: it must be this one */
                const int kind = x->pass == LOOM_PASS_FORWARD ? 0 : 1;
                const int has_msg = x->pass == LOOM_PASS_FORWARD ? vs != 0 : vs != last_vs;
                if (has_msg) { /* stage s hears each kind from one neighbour only */
                    const int i = S->recv_n[kind][s]++;
                    if (i >= S->sent_n[kind][s] || S->sent_k[kind][s][i] != k || S->sent_vs[kind][s][i] != vs)
                        return 0;
                }
                const double start = clock[s] > ready ? clock[s] : ready;
                const double t = x->pass == LOOM_PASS_FORWARD ? tf : tb;
                clock[s] = start + t;
                busy[s] += t;
                if (x->pass == LOOM_PASS_FORWARD) {
                    S->fwd_done[vs][k] = clock[s];
                    if (vs != last_vs) { /* to the next stage's inbox */
                        const int to = (s + 1) % P, n = S->sent_n[0][to]++;
                        S->sent_k[0][to][n] = k;
                        S->sent_vs[0][to][n] = vs + 1;
                    }
                } else {
                    S->bwd_done[vs][k] = clock[s];
                    if (vs != 0) {
                        const int to = (s + P - 1) % P, n = S->sent_n[1][to]++;
                        S->sent_k[1][to][n] = k;
                        S->sent_vs[1][to][n] = vs - 1;
                    }
                }
                at[s]++;
                progressed = 1;
            }
            if (at[s] < p->n) finished = 0;
        }
        if (finished) break;
        if (!progressed) return 0; /* every stage waits on another: a deadlock */
    }
    double end = 0;
    for (int s = 0; s < P; s++) end = clock[s] > end ? clock[s] : end;
    for (int s = 0; s < P; s++) idle[s] = 1 - busy[s] / end;
    return 1;
}

static void plans(struct sim *S, int schedule)
{
    for (int s = 0; s < S->P; s++) loom_schedule_plan(&S->plan[s], schedule, S->P, s, S->v, S->m);
}

static void free_plans(struct sim *S)
{
    for (int s = 0; s < S->P; s++) loom_schedule_plan_free(&S->plan[s]);
}

/* idle fractions: sums of whole time units divided once, in double: exact to
 * ~1e-16; 1e-9 leaves room, a schedule one slot off differs by 1e-2 or more */
static int near(double a, double b)
{
    return fabs(a - b) < 1e-9;
}

int main(void)
{
    static struct sim S;
    /* no pipelining */
    struct loom_pipe_plan one;
    loom_schedule_no_pipelining(&one, 5);
    check_plan(&one, 1);
    CHECK(strcmp(loom_schedule_name(LOOM_PIPELINE_SCHEDULE_GPIPE, 1), "no pipelining") == 0);
    loom_schedule_plan_free(&one);
    for (int P = 2; P <= MAXP; P++)
        for (int m = 1; m <= MAXM; m++) {
            double idle_g[MAXP], idle_f[MAXP];
            S = (struct sim){.P = P, .v = 1, .m = m};
            plans(&S, LOOM_PIPELINE_SCHEDULE_GPIPE);
            for (int s = 0; s < P; s++) check_plan(&S.plan[s], m);
            CHECK(simulate(&S, idle_g));
            free_plans(&S);
            plans(&S, LOOM_PIPELINE_SCHEDULE_1F1B);
            for (int s = 0; s < P; s++) check_plan(&S.plan[s], P - s < m ? P - s : m);
            CHECK(simulate(&S, idle_f));
            free_plans(&S);
            const double want = (double)(P - 1) / (m + P - 1);
            for (int s = 0; s < P; s++) {
                CHECK(near(idle_g[s], want));
                CHECK(near(idle_f[s], want));
            }
            if (m % P) continue; /* interleaving needs a multiple of P (config/resolve.c refuses others) */
            for (int v = 2; v <= MAXV; v++) {
                double idle_i[MAXP];
                S = (struct sim){.P = P, .v = v, .m = m};
                plans(&S, LOOM_PIPELINE_SCHEDULE_INTERLEAVED);
                for (int s = 0; s < P; s++) check_plan(&S.plan[s], 0);
                int ok = simulate(&S, idle_i);
                CHECK(ok);
                if (!ok) fprintf(stderr, "  interleaved P=%d m=%d v=%d\n", P, m, v);
                free_plans(&S);
                const double want_i = (double)(P - 1) / (v * m + P - 1);
                for (int s = 0; ok && s < P; s++) {
                    CHECK(near(idle_i[s], want_i));
                    CHECK(idle_i[s] < idle_f[s]);
                    if (!near(idle_i[s], want_i))
                        fprintf(stderr, "  interleaved P=%d m=%d v=%d stage %d: idle %.4f, want %.4f\n", P, m,
                                v, s, idle_i[s], want_i);
                }
            }
        }
    printf("test_schedule: %d checks, %d failed\n", check_count, check_failures);
    return check_failures != 0;
}
