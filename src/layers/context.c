/* Context parallelism's pieces (context.h). */
#include "layers/context.h"

#include <string.h>

#include "base/dtype.h"
#include "base/log.h"
#include "comm/comm.h"

static double waited;

static void wait(struct loom_comm_handle *h)
{
    waited += loom_comm_wait(h);
}

double loom_cp_comm_take_s(void)
{
    const double s = waited;
    waited = 0;
    return s;
}

int loom_cp_group_rank(void)
{
    return loom_comm_group_rank(LOOM_GROUP_CP);
}

struct loom_cp loom_cp_of(int cp, int rank, int T)
{
    LOOM_ASSERT(cp >= 1 && rank >= 0 && rank < cp && (cp == 1 || T % (2 * cp) == 0));
    return (struct loom_cp){.cp = cp, .rank = rank, .T = T, .Tl = T / cp, .c = T / (2 * cp)};
}

int loom_cp_position_of(const struct loom_cp *p, int r, int t)
{
    return t < p->c ? r * p->c + t : (2 * p->cp - 1 - r) * p->c + t - p->c;
}

int loom_cp_position(const struct loom_cp *p, int t)
{
    return loom_cp_position_of(p, p->rank, t);
}

void loom_cp_take_rows(const struct loom_cp *p, int32_t *dst, const int32_t *src, int B)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < p->Tl; t++)
            dst[(size_t)b * p->Tl + t] = src[(size_t)b * p->T + loom_cp_position(p, t)];
}

double loom_cp_sum(const struct loom_cp *p, double x)
{
    if (p->cp > 1) wait(loom_comm_allreduce(LOOM_GROUP_CP, loom_buf_of(&x, 1, LOOM_DTYPE_F64), LOOM_OP_SUM));
    return x;
}

void loom_cp_sum_all(const struct loom_cp *p, struct loom_buf b)
{
    if (p->cp > 1) wait(loom_comm_allreduce(LOOM_GROUP_CP, b, LOOM_OP_SUM));
}

/* Rank r's rows (B Tl of width w, its order) and the whole sequence's
 * (B, T, w): each of its 2 B chunks of c rows, one copy each way. */
static void rows_to_whole(const struct loom_cp *p, const struct loom_kernels *k, float *whole,
                          const float *rows, int r, int B, int w)
{
    for (int b = 0; b < B; b++)
        for (int h = 0; h < 2; h++)
            k->convert_rows(whole + ((size_t)b * p->T + loom_cp_position_of(p, r, h * p->c)) * w,
                            LOOM_DTYPE_F32, (size_t)w, rows + ((size_t)b * p->Tl + (size_t)h * p->c) * w,
                            LOOM_DTYPE_F32, (size_t)w, (size_t)p->c, (size_t)w);
}

static void whole_to_rows(const struct loom_cp *p, const struct loom_kernels *k, float *rows,
                          const float *whole, int r, int B, int w)
{
    for (int b = 0; b < B; b++)
        for (int h = 0; h < 2; h++)
            k->convert_rows(rows + ((size_t)b * p->Tl + (size_t)h * p->c) * w, LOOM_DTYPE_F32, (size_t)w,
                            whole + ((size_t)b * p->T + loom_cp_position_of(p, r, h * p->c)) * w,
                            LOOM_DTYPE_F32, (size_t)w, (size_t)p->c, (size_t)w);
}

/* The width of all segments, checked divisible. */
static int width_of(const struct loom_cp *p, const int *seg, int nseg)
{
    int w = 0;
    for (int i = 0; i < nseg; i++) {
        LOOM_ASSERT(seg[i] % p->cp == 0);
        w += seg[i];
    }
    return w;
}

void loom_cp_to_heads(const struct loom_cp *p, const struct loom_kernels *k, float *dst, const float *src,
                      int B, const int *seg, int nseg, float *send, float *recv)
{
    const int w = width_of(p, seg, nseg), wj = w / p->cp;
    const size_t n = (size_t)B * p->Tl, block = n * wj;
    for (int j = 0; j < p->cp; j++)
        for (int i = 0, off = 0; i < nseg; off += seg[i++]) {
            const int part = seg[i] / p->cp;
            k->convert_rows(send + j * block + off / p->cp, LOOM_DTYPE_F32, (size_t)wj,
                            src + off + (size_t)j * part, LOOM_DTYPE_F32, (size_t)w, n, (size_t)part);
        }
    wait(loom_comm_alltoall(LOOM_GROUP_CP, loom_buf_f32(send, block * p->cp),
                            loom_buf_f32(recv, block * p->cp)));
    for (int r = 0; r < p->cp; r++) rows_to_whole(p, k, dst, recv + r * block, r, B, wj);
}

void loom_cp_to_rows(const struct loom_cp *p, const struct loom_kernels *k, float *dst, const float *src,
                     int B, const int *seg, int nseg, float *send, float *recv)
{
    const int w = width_of(p, seg, nseg), wj = w / p->cp;
    const size_t n = (size_t)B * p->Tl, block = n * wj;
    for (int r = 0; r < p->cp; r++) whole_to_rows(p, k, send + r * block, src, r, B, wj);
    wait(loom_comm_alltoall(LOOM_GROUP_CP, loom_buf_f32(send, block * p->cp),
                            loom_buf_f32(recv, block * p->cp)));
    for (int j = 0; j < p->cp; j++)
        for (int i = 0, off = 0; i < nseg; off += seg[i++]) {
            const int part = seg[i] / p->cp;
            k->convert_rows(dst + off + (size_t)j * part, LOOM_DTYPE_F32, (size_t)w,
                            recv + j * block + off / p->cp, LOOM_DTYPE_F32, (size_t)wj, n, (size_t)part);
        }
}

void loom_cp_gather_rows(const struct loom_cp *p, const struct loom_kernels *k, float *whole,
                         const float *rows, int B, int w, float *recv)
{
    const size_t block = (size_t)B * p->Tl * w;
    wait(loom_comm_allgather(LOOM_GROUP_CP, loom_buf_f32((float *)rows, block),
                             loom_buf_f32(recv, block * p->cp)));
    for (int r = 0; r < p->cp; r++) rows_to_whole(p, k, whole, recv + r * block, r, B, w);
}

void loom_cp_gather_host(const struct loom_cp *p, void *whole, const void *mine, void *all, int B,
                         enum loom_dtype dt)
{
    const size_t n = (size_t)B * p->Tl, sz = loom_dtype_size(dt);
    wait(loom_comm_allgather(LOOM_GROUP_CP, loom_buf_of((void *)mine, n, dt),
                             loom_buf_of(all, n * (size_t)p->cp, dt)));
    for (int r = 0; r < p->cp; r++)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < 2; h++)
                memcpy((char *)whole + ((size_t)b * p->T + loom_cp_position_of(p, r, h * p->c)) * sz,
                       (const char *)all + ((size_t)r * n + (size_t)b * p->Tl + (size_t)h * p->c) * sz,
                       (size_t)p->c * sz);
}

void loom_cp_sum_rows(const struct loom_cp *p, const struct loom_kernels *k, float *rows, const float *whole,
                      int B, int w, float *send)
{
    const size_t block = (size_t)B * p->Tl * w;
    for (int r = 0; r < p->cp; r++) whole_to_rows(p, k, send + r * block, whole, r, B, w);
    wait(loom_comm_reduce_scatter(LOOM_GROUP_CP, loom_buf_f32(send, block * p->cp),
                                  loom_buf_f32(rows, block)));
}

void loom_cp_ring_start(const struct loom_cp *p, struct loom_cp_ring *r, const float *send, float *recv,
                        size_t n, int tag)
{
    const int next = (p->rank + 1) % p->cp, prev = (p->rank + p->cp - 1) % p->cp;
    r->send = loom_comm_send(LOOM_GROUP_CP, loom_buf_f32((float *)send, n), next, tag);
    r->recv = loom_comm_recv(LOOM_GROUP_CP, loom_buf_f32(recv, n), prev, tag);
}

void loom_cp_ring_wait(struct loom_cp_ring *r)
{
    wait(r->send);
    wait(r->recv);
}
