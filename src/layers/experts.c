/* Expert parallelism's moves (see experts.h). */
#include "layers/experts.h"

#include <stdint.h>
#include <stdlib.h>

#include "base/log.h"
#include "comm/comm.h"

static double waited;

static void wait(struct loom_comm_handle *h)
{
    waited += loom_comm_wait(h);
}

double loom_ep_comm_take_s(void)
{
    const double s = waited;
    waited = 0;
    return s;
}

int loom_ep_group_rank(void)
{
    return loom_comm_group_rank(LOOM_GROUP_EP);
}

struct loom_ep loom_ep_of(int experts, int ep, int rank)
{
    LOOM_ASSERT(ep >= 1 && rank >= 0 && rank < ep && experts % ep == 0);
    return (struct loom_ep){.ep = ep, .rank = rank, .local = experts / ep, .first = rank * (experts / ep)};
}

void loom_ep_exchange_counts(const struct loom_ep *p, const int *counts, int *recv)
{
    const size_t n = (size_t)p->ep * (size_t)p->local;
    wait(loom_comm_alltoall(LOOM_GROUP_EP, loom_buf_of((void *)counts, n, LOOM_DTYPE_I32),
                            loom_buf_of(recv, n, LOOM_DTYPE_I32)));
}

int loom_ep_rows(const struct loom_ep *p, const int *recv)
{
    int n = 0;
    for (int i = 0; i < p->ep * p->local; i++) n += recv[i];
    return n;
}

/* Element counts and offsets, per rank of the group: of the source layout
 * (each rank's share of counts) and of the received layout (each source's
 * rows). */
static void extents(const struct loom_ep *p, const int *counts, const int *recv, int C, int *src_n,
                    int *src_at, int *recv_n, int *recv_at)
{
    int64_t s_at = 0, r_at = 0;
    for (int q = 0; q < p->ep; q++) {
        int64_t s = 0, r = 0;
        for (int j = 0; j < p->local; j++) s += counts[q * p->local + j], r += recv[q * p->local + j];
        s *= C, r *= C;
        LOOM_ASSERT(s_at + s <= INT32_MAX && r_at + r <= INT32_MAX); /* MPI's int counts */
        src_n[q] = (int)s, src_at[q] = (int)s_at, recv_n[q] = (int)r, recv_at[q] = (int)r_at;
        s_at += s, r_at += r;
    }
}

static void exchange(const struct loom_ep *p, float *dst, const int *counts, const float *src,
                     const int *recv, int C, int out, void (*work)(void *ctx), void *ctx)
{
    int *e = malloc(sizeof(int) * 4 * (size_t)p->ep);
    if (!e) loom_die("out of memory exchanging the experts' rows");
    int *src_n = e, *src_at = e + p->ep, *recv_n = e + 2 * p->ep, *recv_at = e + 3 * p->ep;
    extents(p, counts, recv, C, src_n, src_at, recv_n, recv_at);
    const size_t src_total = (size_t)src_at[p->ep - 1] + (size_t)src_n[p->ep - 1],
                 recv_total = (size_t)recv_at[p->ep - 1] + (size_t)recv_n[p->ep - 1];
    struct loom_comm_handle *h =
        out ? loom_comm_alltoall_v(LOOM_GROUP_EP, loom_buf_of((void *)src, src_total, LOOM_DTYPE_F32), src_n,
                                   src_at, loom_buf_f32(dst, recv_total), recv_n, recv_at)
            : loom_comm_alltoall_v(LOOM_GROUP_EP, loom_buf_of((void *)src, recv_total, LOOM_DTYPE_F32),
                                   recv_n, recv_at, loom_buf_f32(dst, src_total), src_n, src_at);
    free(e); /* the counts are copied */
    if (work) work(ctx);
    wait(h);
}

void loom_ep_dispatch(const struct loom_ep *p, float *dst, const int *recv, const float *src,
                      const int *counts, int C)
{
    exchange(p, dst, counts, src, recv, C, 1, NULL, NULL);
}

void loom_ep_dispatch_while(const struct loom_ep *p, float *dst, const int *recv, const float *src,
                            const int *counts, int C, void (*work)(void *ctx), void *ctx)
{
    exchange(p, dst, counts, src, recv, C, 1, work, ctx);
}

void loom_ep_combine(const struct loom_ep *p, float *dst, const int *counts, const float *src,
                     const int *recv, int C)
{
    exchange(p, dst, counts, src, recv, C, 0, NULL, NULL);
}

void loom_ep_regroup(const struct loom_ep *p, const struct loom_backend *b, float *dst, const float *src,
                     const int *recv, int C, int to_experts)
{
    const int S = p->ep, L = p->local;
    size_t at_recv = 0;
    for (int s = 0; s < S; s++)
        for (int j = 0; j < L; j++) {
            /* block (s, j): at_recv in the received layout; in the expert-major one after experts < j
             * (every source's) and expert j's rows from sources < s */
            size_t at_exp = 0;
            for (int jj = 0; jj < j; jj++)
                for (int ss = 0; ss < S; ss++) at_exp += (size_t)recv[ss * L + jj];
            for (int ss = 0; ss < s; ss++) at_exp += (size_t)recv[ss * L + j];
            const size_t n = (size_t)recv[s * L + j] * (size_t)C;
            if (n) {
                if (to_experts)
                    b->copy(dst + at_exp * (size_t)C, src + at_recv * (size_t)C, n * sizeof(float));
                else
                    b->copy(dst + at_recv * (size_t)C, src + at_exp * (size_t)C, n * sizeof(float));
            }
            at_recv += (size_t)recv[s * L + j];
        }
}

void loom_ep_gather(const struct loom_ep *p, void *dst, const void *src, size_t n, enum loom_dtype dt)
{
    wait(loom_comm_allgather(LOOM_GROUP_EP, loom_buf_of((void *)src, n, dt),
                             loom_buf_of(dst, n * (size_t)p->ep, dt)));
}

void loom_ep_reduce_scatter(const struct loom_ep *p, float *dst, const float *src, size_t n)
{
    wait(loom_comm_reduce_scatter(LOOM_GROUP_EP, loom_buf_of((void *)src, n * (size_t)p->ep, LOOM_DTYPE_F32),
                                  loom_buf_f32(dst, n)));
}

void loom_ep_recv_of(const struct loom_ep *p, const int *all, int E, int *recv)
{
    for (int s = 0; s < p->ep; s++)
        for (int j = 0; j < p->local; j++) recv[s * p->local + j] = all[(size_t)s * E + p->first + j];
}

void loom_ep_local_places(const struct loom_ep *p, int32_t *out, const int32_t *idx, const int32_t *pos,
                          const int *all, const int *recv, int E, int Nk)
{
    const int S = p->ep, L = p->local;
    int *off = malloc(sizeof(int) * ((size_t)E + (size_t)L * S));
    if (!off) loom_die("out of memory placing the experts' rows");
    int *base = off + E; /* (L x S) where expert j's rows from rank s start, expert-major */
    for (int j = 0, at = 0; j < L; j++)
        for (int s = 0; s < S; s++) base[j * S + s] = at, at += recv[s * L + j];
    for (int s = 0; s < S; s++) {
        const int *c = all + (size_t)s * E;
        for (int e = 0, o = 0; e < E; o += c[e++]) off[e] = o; /* rank s's experts' blocks */
        for (int i = 0; i < Nk; i++) {
            const size_t at = (size_t)s * Nk + i;
            const int e = idx[at], r = pos[at], j = e - p->first;
            out[at] = r < 0 || j < 0 || j >= L ? -1 : base[j * S + s] + (r - off[e]);
        }
    }
    free(off);
}
