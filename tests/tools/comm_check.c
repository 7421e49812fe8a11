/*
 * Test tool, run under mpirun by tests/test_comm.py: every collective of the
 * comm layer on every group, checked against the values each rank can work
 * out for itself. Prints one line per check on rank 0; exits 1 on a failure.
 *
 *   mpirun -np N comm_check TP PP
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "loom/loom.h"

static int failures;

static void expect(int rank, const char *what, int ok)
{
    if (!ok) {
        failures++;
        fprintf(stderr, "FAIL [rank %d] %s\n", rank, what);
    }
}

int main(int argc, char **argv)
{
    loom_comm_init(&argc, &argv);
    if (argc != 3) {
        fprintf(stderr, "usage: comm_check TP PP\n");
        return 2;
    }
    struct loom_topology t;
    if (loom_comm_setup(&t, atoi(argv[1]), atoi(argv[2])) != LOOM_OK) {
        fprintf(stderr, "comm_check: %s\n", loom_error_message());
        loom_comm_finalize();
        return 2;
    }
    loom_comm_set_timeout(30);
    const int r = t.rank;
    /* rank order: tp fastest, then dp, then pp */
    expect(r, "rank order", r == t.tp_rank + t.tp * (t.dp_rank + t.dp * t.pp_rank));
    const size_t n = 1000;
    float *buf = malloc(sizeof(float) * n * (size_t)t.world),
          *out = malloc(sizeof(float) * n * (size_t)t.world);
    struct {
        enum loom_group g;
        int size, me;
    } groups[] = {{LOOM_GROUP_WORLD, t.world, r},
                  {LOOM_GROUP_DP, t.dp, t.dp_rank},
                  {LOOM_GROUP_TP, t.tp, t.tp_rank},
                  {LOOM_GROUP_PP, t.pp, t.pp_rank}};
    for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
        enum loom_group g = groups[gi].g;
        int size = groups[gi].size, me = groups[gi].me;
        /* the members of my group are the ranks that share my other coordinates;
         * their group ranks are 0..size-1, so sums over them are known */
        for (size_t i = 0; i < n; i++) buf[i] = (float)(me + 1) * (float)(i % 7);
        loom_comm_wait(loom_comm_allreduce(g, loom_buf_f32(buf, n), LOOM_OP_SUM));
        int ok = 1;
        float s = (float)size * (size + 1) / 2;
        for (size_t i = 0; i < n; i++) ok &= buf[i] == s * (float)(i % 7);
        expect(r, "all-reduce sum", ok);

        uint64_t mx = (uint64_t)me;
        loom_comm_allreduce_sync(g, loom_buf_of(&mx, 1, LOOM_DTYPE_U64), LOOM_OP_MAX);
        expect(r, "all-reduce max", mx == (uint64_t)(size - 1));

        for (size_t i = 0; i < n * (size_t)size; i++) buf[i] = (float)(me + 1) + (float)i;
        loom_comm_wait(
            loom_comm_reduce_scatter(g, loom_buf_f32(buf, n * (size_t)size), loom_buf_f32(out, n)));
        ok = 1;
        for (size_t i = 0; i < n; i++) ok &= out[i] == s + (float)size * (float)(me * n + i);
        expect(r, "reduce-scatter", ok);

        for (size_t i = 0; i < n; i++) buf[i] = (float)(me * 10000) + (float)i;
        loom_comm_wait(loom_comm_allgather(g, loom_buf_f32(buf, n), loom_buf_f32(out, n * (size_t)size)));
        ok = 1;
        for (int k = 0; k < size; k++)
            for (size_t i = 0; i < n; i++) ok &= out[k * n + i] == (float)(k * 10000) + (float)i;
        expect(r, "all-gather", ok);

        for (size_t i = 0; i < n; i++) buf[i] = me == size - 1 ? (float)i : -1.0f;
        loom_comm_wait(loom_comm_broadcast(g, loom_buf_f32(buf, n), size - 1));
        ok = 1;
        for (size_t i = 0; i < n; i++) ok &= buf[i] == (float)i;
        expect(r, "broadcast", ok);

        if (size > 1) { /* a ring of sends: each to the next, from the previous */
            for (size_t i = 0; i < n; i++) buf[i] = (float)me;
            struct loom_comm_handle *rh = loom_comm_recv(g, loom_buf_f32(out, n), (me + size - 1) % size, 7);
            struct loom_comm_handle *sh = loom_comm_send(g, loom_buf_f32(buf, n), (me + 1) % size, 7);
            loom_comm_wait(sh);
            loom_comm_wait(rh);
            ok = 1;
            for (size_t i = 0; i < n; i++) ok &= out[i] == (float)((me + size - 1) % size);
            expect(r, "send/recv ring", ok);
        }
    }
    /* agreement: the lowest rank with the worst status */
    int first = -1;
    int worst = loom_comm_agree(r >= 1 ? (r % 2 ? 2 : 1) : 0, &first);
    expect(r, "agree", t.world == 1 ? worst == 0 : worst == 2 && first == 1);
    uint64_t f = (uint64_t)failures;
    loom_comm_allreduce_sync(LOOM_GROUP_WORLD, loom_buf_of(&f, 1, LOOM_DTYPE_U64), LOOM_OP_SUM);
    char topo[64];
    loom_topology_format(&t, topo, sizeof topo);
    if (r == 0) printf("%s: %llu failure(s)\n", topo, (unsigned long long)f);
    free(buf);
    free(out);
    loom_comm_finalize();
    return f ? 1 : 0;
}
