/*
 * Fused causal attention in float32, FlashAttention-2's algorithm on the
 * CPU: memory O(T) per (row, head), never the (T,T) probabilities.
 *
 * Forward, per (b, h, query tile) in parallel (largest tiles first, taken
 * dynamically): for each key tile of the query tile's key range,
 * S^T = K Q^T (a query to a column, so that the softmax's maxima and sums
 * run down columns, 16 queries to a vector), each query's running max m
 * and sum l updated, the output accumulator rescaled by exp(m_old - m_new)
 * and P V added; at the end O = acc / l and lse = m + log l are written.
 *
 * Backward, per (b, h) in parallel: D = rowsum(dO * O) first, then for each
 * key tile, over the query tiles that reach it: P = exp(scale S - lse),
 * dP = dO V^T, dS = scale P (dP - D); dV += P^T dO and dK += dS^T Q stay in
 * the task's tile buffers until the key tile is done, dQ += dS K goes
 * straight to dq (this task's head only). Tasks are (b, h) rather than
 * query tiles because dK and dV sum over query tiles and dQ over key tiles:
 * one owner per head needs neither atomics nor a second pass. With
 * grouped-query attention the heads of a group would share dK and dV, so
 * each head writes its own into a scratch (B,NH,T,hs) pair, summed into dk
 * and dv afterwards.
 *
 * Masks (flash_tile.h) leave each query a contiguous key range: tiles
 * wholly inside every row's range skip the mask, tiles outside every row's
 * are never visited, the rest are masked by row. Products are flash_tile.h's
 * register-blocked tile products; exponentials its fa_exp2.
 *
 * A block-sparse layout (kernels/sparse_layout.h) works on the same tiles:
 * a tile holding no kept (query block, key block) pair is skipped, one
 * kept whole runs as without a layout, one kept in part is masked by row
 * from the layout's blocks (any block size: a tile may hold many blocks or
 * lie inside one).
 *
 * Attention dropout (a->drop): each row's mask (kernels/dropout_mask.h)
 * multiplies the tile's probabilities after the online softmax's sums, and
 * the backward draws it again (dV from the dropped P, dP through the mask).
 *
 * Deliberately not: non-causal or arbitrary masks, or parallelism
 * inside a (b, h) of the backward (more threads than B*NH leave some idle
 * there).
 */
#include "kernels/cpu/flash_tile.h"

#include <math.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "kernels/cpu/vexp.h"

float loom_flash_attn_check(const struct loom_flash_attn *a)
{
    LOOM_ASSERT(a->B >= 1 && a->T >= 1 && a->hs >= 1 && a->G >= 1 && a->NH >= a->G && a->NH % a->G == 0);
    LOOM_ASSERT(a->ld_q >= a->NH * a->hs && a->ld_k >= a->G * a->hs && a->ld_v >= a->G * a->hs);
    LOOM_ASSERT(a->window >= 0);
    LOOM_ASSERT(a->q0 >= 0 && a->Tq >= 0 && a->k0 >= 0 && a->Tk >= 0 && fa_tq(a) >= 1 && fa_tk(a) >= 1 &&
                fa_qend(a) <= a->T && fa_kend(a) <= a->T && (a->ld_lse == 0 || a->ld_lse >= fa_tq(a)));
    if (a->layout)
        LOOM_ASSERT(a->layout->T == a->T && a->layout->unidirectional && a->h0 >= 0 &&
                    a->h0 + a->NH <= a->layout->NH);
    if (a->doc_start)
        for (int b = 0; b < a->B; b++)
            for (int t = 0; t < a->T; t++) {
                const int32_t d = a->doc_start[(size_t)b * a->T + t];
                LOOM_ASSERT(d >= 0 && d <= t && (t == 0 || d >= a->doc_start[(size_t)b * a->T + t - 1]));
            }
    return a->scale > 0.0f ? a->scale : 1.0f / sqrtf((float)a->hs);
}

void *loom_flash_attn_scratch(int slot, size_t bytes)
{
    static struct {
        void *p;
        size_t cap;
    } s[FA_SCRATCH_COUNT];
    LOOM_ASSERT(slot >= 0 && slot < FA_SCRATCH_COUNT);
    if (bytes > s[slot].cap) {
        loom_free(s[slot].p);
        s[slot].p = loom_alloc(bytes, LOOM_MEM_OTHER);
        s[slot].cap = bytes;
    }
    return s[slot].p;
}

/* ---- forward ------------------------------------------------------------------- */

/* floats of one thread's forward workspace: S^T and the keeps of a tile
 * that is not full (BK,BQ each), acc (BQ,hsp), the query tile transposed
 * (hs,BQ), and m, l, the rescale factors and each query's lowest and end
 * key (BQ each) */
static size_t fwd_ws(int hs)
{
    const size_t hsp = (size_t)fa_up16(hs);
    return 2 * (size_t)FA_BK * FA_BQ + FA_BQ * hsp + (size_t)hs * FA_BQ + 5 * FA_BQ;
}

/* The online softmax's step for the queries [0, m16) of a tile's S^T (n
 * keys by BQ queries: a query is a column, so every reduction runs down
 * columns, 16 queries to a vector): each query's new maximum, its rescale
 * factor exp(m - m_new) into alpha, its unnormalised probabilities
 * exp(scale s - m_new) in place (0 where keep, when given, is 0), and m, l
 * moved to the new maximum. A query that sees no key of the tile keeps its
 * maximum (alpha 1) and adds nothing. The loops stay free of the mask's
 * test where it has none: a select in the vector loop cost the kernel a
 * third of its speed. */
static inline __attribute__((always_inline)) void col_softmax_nv(float *St, const float *keep, int n,
                                                                 const int NV, float scale, float *mx,
                                                                 float *l, float *alpha)
{
    const float scale2 = scale * FA_LOG2E;
    fa_vec smax[4], sum[4], m2[4];
    for (int v = 0; v < NV; v++) smax[v] = fa_splat(-INFINITY), sum[v] = fa_splat(0.0f);
    if (keep)
        for (int r = 0; r < n; r++)
            for (int v = 0; v < NV; v++) {
                const fa_vec x = *(const fa_vec *)(St + r * FA_BQ + 16 * v);
                const fa_vec k = *(const fa_vec *)(keep + r * FA_BQ + 16 * v);
                smax[v] = fa_vsel(k != 0.0f, fa_vmax(x, smax[v]), smax[v]);
            }
    else
        for (int r = 0; r < n; r++)
            for (int v = 0; v < NV; v++)
                smax[v] = fa_vmax(*(const fa_vec *)(St + r * FA_BQ + 16 * v), smax[v]);
    for (int v = 0; v < NV; v++) {
        /* -inf: no key here for the query, m kept */
        const fa_vec m = *(const fa_vec *)(mx + 16 * v), sm = smax[v] * scale;
        const fa_vec mn = fa_vsel(m >= sm, m, sm);
        *(fa_vec *)(alpha + 16 * v) = fa_vsel(mn == m, fa_splat(1.0f), fa_exp2v((m - mn) * FA_LOG2E));
        *(fa_vec *)(mx + 16 * v) = mn;
        m2[v] = mn * FA_LOG2E;
    }
    if (keep)
        for (int r = 0; r < n; r++)
            for (int v = 0; v < NV; v++) {
                fa_vec *x = (fa_vec *)(St + r * FA_BQ + 16 * v);
                const fa_vec k = *(const fa_vec *)(keep + r * FA_BQ + 16 * v);
                const fa_vec p = fa_vsel(k != 0.0f, fa_exp2v(*x * scale2 - m2[v]), fa_splat(0.0f));
                *x = p;
                sum[v] += p;
            }
    else
        for (int r = 0; r < n; r++)
            for (int v = 0; v < NV; v++) {
                fa_vec *x = (fa_vec *)(St + r * FA_BQ + 16 * v);
                const fa_vec p = fa_exp2v(*x * scale2 - m2[v]);
                *x = p;
                sum[v] += p;
            }
    for (int v = 0; v < NV; v++)
        *(fa_vec *)(l + 16 * v) = *(const fa_vec *)(l + 16 * v) * *(const fa_vec *)(alpha + 16 * v) + sum[v];
}

static void col_softmax(float *St, const float *keep, int n, int m16, float scale, float *mx, float *l,
                        float *alpha)
{
    switch (m16 / 16) {
    case 1:
        col_softmax_nv(St, keep, n, 1, scale, mx, l, alpha);
        break;
    case 2:
        col_softmax_nv(St, keep, n, 2, scale, mx, l, alpha);
        break;
    case 3:
        col_softmax_nv(St, keep, n, 3, scale, mx, l, alpha);
        break;
    default:
        col_softmax_nv(St, keep, n, 4, scale, mx, l, alpha);
        break;
    }
}

/* The keeps of a tile that is not full, (n keys, BQ queries): query c (of
 * m, from position i0) sees key r (from j0) when it lies in [lo, end) of
 * its range (lo, end: BQ each) and, for a tile its layout keeps in part,
 * in a kept block; queries [m, m16) see none. */
static void tile_keeps(float *keep, const int *lo, const int *end, const struct loom_flash_attn *a, int h,
                       int i0, int m, int m16, int j0, int n, int kept)
{
    for (int r = 0; r < n; r++) {
        const int j = j0 + r;
        float *kr = keep + (size_t)r * FA_BQ;
#pragma omp simd
        for (int c = 0; c < m16; c++) kr[c] = c < m && j >= lo[c] && j < end[c] ? 1.0f : 0.0f;
    }
    if (kept == 1) {
        const struct loom_sparse_layout *L = a->layout;
        const uint8_t *mk = L->mask + (size_t)(L->heads == 1 ? 0 : a->h0 + h) * L->nb * L->nb;
        for (int c = 0; c < m; c++) {
            const uint8_t *row = mk + (size_t)((i0 + c) / L->block) * L->nb;
            for (int r = 0; r < n; r++)
                if (!row[(j0 + r) / L->block]) keep[(size_t)r * FA_BQ + c] = 0.0f;
        }
    }
}

/* One query tile [i0, i1) (positions: the tile of 64 at i0, from q0 at the
 * part's first) of head h of sequence b; kc, vc: its key/value head's keys
 * and values, (tiles BK, hsp) each, contiguous from tile kt0's first
 * position. The queries are taken transposed, so that each key tile's
 * scores come as S^T = K Q^T, a query to a column: the online softmax's
 * maxima and sums then run down columns, 16 queries to a vector, where a
 * row per query needed a sum across a vector's lanes for each. Then
 * acc = alpha acc + P V in one product (P read through S^T, the rescale in
 * its loads of acc). */
static void fwd_tile(float *out, float *lse, const float *q, const float *kc, const float *vc, int kt0,
                     const struct loom_flash_attn *a, float scale, int b, int h, int i0, float *ws)
{
    float dmask[FA_BK] __attribute__((aligned(64)));
    const int hs = a->hs, hsp = fa_up16(hs), kend = fa_kend(a);
    const int i1 = fa_min(i0 / FA_BQ * FA_BQ + FA_BQ, fa_qend(a)), m = i1 - i0, m16 = fa_up16(m);
    float *St = ws, *keeps = St + FA_BK * FA_BQ, *acc = keeps + FA_BK * FA_BQ,
          *qt = acc + (size_t)FA_BQ * hsp;
    float *mx = qt + (size_t)hs * FA_BQ, *l = mx + FA_BQ, *alpha = l + FA_BQ;
    int *lo = (int *)(alpha + FA_BQ), *end = lo + FA_BQ;
    fa_pack_t(qt, FA_BQ, q + ((size_t)b * fa_tq(a) + i0 - a->q0) * a->ld_q + (size_t)h * hs, a->ld_q, m, hs);
    for (int c = 0; c < m16; c++) mx[c] = -INFINITY, l[c] = 0.0f;
    for (int c = 0; c < m; c++) lo[c] = fa_key_lo(a, b, i0 + c), end[c] = fa_min(i0 + c + 1, kend);
    memset(acc, 0, (size_t)m * hsp * sizeof(float));
    const int lo_last = lo[m - 1], jend = fa_min(i1, kend);
    for (int j0 = lo[0] / FA_BK * FA_BK; j0 < jend; j0 += FA_BK) {
        const int j1 = fa_min(j0 + FA_BK, jend), n = j1 - j0;
        const int kept = fa_tile_kept(a, h, i0, i1, j0, j1);
        if (!kept) continue;
        /* full: every query sees every key */
        const int full = kept == 2 && j1 - 1 <= i0 && lo_last <= j0;
        const float *Kc = kc + (size_t)(j0 - kt0 * FA_BK) * hsp;
        fa_gemm(n, m16, hs, Kc, hsp, 1, qt, FA_BQ, St, FA_BQ, 0); /* S^T = K Q^T */
        if (!full) tile_keeps(keeps, lo, end, a, h, i0, m, m16, j0, n, kept);
        col_softmax(St, full ? NULL : keeps, n, m16, scale, mx, l, alpha);
        if (a->drop) /* after the sums: they are the undropped ones */
            for (int c = 0; c < m; c++) {
                const float *dm = fa_drop_row(dmask, a, b, h, i0 + c, j0, n);
                for (int r = 0; r < n; r++) St[(size_t)r * FA_BQ + c] *= dm[r];
            }
        fa_gemm_rs(m, hs, n, St, 1, FA_BQ, vc + (size_t)(j0 - kt0 * FA_BK) * hsp, hsp, acc, hsp, 1,
                   alpha); /* acc = alpha acc + P V */
    }
    fa_finish_rows(out, lse, acc, hsp, mx, l, a, b, h, i0, m);
}

void loom_flash_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                                  const struct loom_flash_attn *a)
{
    const float scale = loom_flash_attn_check(a);
    const int hs = a->hs, nthr = fa_threads(a), R = a->NH / a->G;
    /* the part's query tiles and key tiles, of 64 positions from 0 (the
     * same tiles as the whole sequence's, so the same sums) */
    const int qt0 = a->q0 / FA_BQ, nqt = (fa_qend(a) - 1) / FA_BQ + 1 - qt0;
    const int kt0 = a->k0 / FA_BK, nkt = (fa_kend(a) - 1) / FA_BK + 1 - kt0;
    const size_t per = fwd_ws(hs);
    float *ws = loom_flash_attn_scratch(FA_SCRATCH_FWD_WS, loom_mul_size((size_t)nthr * per, sizeof(float)));
    /* the keys and values gathered, (B,G,nkt BK,hsp) each: each row is read
     * by up to nqt query tiles of R heads, from contiguous memory (rows of
     * k, v are pages apart at long T); a part's edge tiles through a
     * zero-padded copy (eds) */
    const size_t hsp = (size_t)fa_up16(hs), head = (size_t)nkt * FA_BK * hsp, nbg = (size_t)a->B * a->G;
    float *kc = loom_flash_attn_scratch(
        FA_SCRATCH_FWD_PACK,
        loom_mul_size(loom_mul_size(nbg, 2 * head) + (size_t)nthr * 2 * FA_BK * hs, sizeof(float)));
    float *vc = kc + nbg * head, *eds = vc + nbg * head;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
    {
        float *edge = eds + (size_t)fa_thread_id() * 2 * FA_BK * hs;
#pragma omp for collapse(2) schedule(static)
        for (int bg = 0; bg < a->B * a->G; bg++)
            for (int jt = 0; jt < nkt; jt++) {
                const int b = bg / a->G, g = bg % a->G;
                ptrdiff_t ldk, ldv;
                const float *kr, *vr;
                const int n = fa_kv_tile(a, k, v, b, g, kt0, jt, edge, &kr, &ldk, &vr, &ldv);
                const size_t row0 = (size_t)bg * head + (size_t)jt * FA_BK * hsp;
                for (int j = 0; j < n; j++) {
                    memcpy(kc + row0 + (size_t)j * hsp, kr + (ptrdiff_t)j * ldk, (size_t)hs * sizeof(float));
                    memcpy(vc + row0 + (size_t)j * hsp, vr + (ptrdiff_t)j * ldv, (size_t)hs * sizeof(float));
                }
            }
        const long nbh = (long)a->B * a->NH, ntask = nbh * nqt;
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < ntask; task++) {
            /* a head's tiles one after another, the longest (last along
             * T) first: its keys and values are then still in the cache
             * for the next (a tile of each head in turn streamed them from
             * memory, 7% of the forward at T=8192) */
            const int it = qt0 + nqt - 1 - (int)(task % nqt), bh = (int)(task / nqt), b = bh / a->NH,
                      h = bh % a->NH;
            const size_t bg = (size_t)b * a->G + h / R;
            fwd_tile(out, lse, q, kc + bg * head, vc + bg * head, kt0, a, scale, b, h,
                     fa_max(it * FA_BQ, a->q0), ws + (size_t)fa_thread_id() * per);
        }
    }
}

/* ---- backward ------------------------------------------------------------------ */

/* floats of one thread's backward workspace: S and dS (BQ,BK), K^T and V^T
 * (hsp,BK), the dK and dV accumulators (BK,hsp), D (T), the head's Q, dO
 * and dQ gathered (T,hsp): at long T their rows in q, dout, dq are pages
 * apart, and every key tile walks them all; and the key tile's rows
 * gathered (BK,hsp), the b of dQ += dS K for every query tile (read in
 * place, its 64 rows on as many pages cost the backward 7%) */
static size_t bwd_ws(int hs, int T)
{
    const size_t hsp = (size_t)fa_up16(hs);
    return 2 * (size_t)FA_BQ * FA_BK + 5 * hsp * FA_BK + (size_t)fa_up16(T) + 3 * (size_t)T * hsp;
}

/* Head h of sequence b: dq's rows of the head, and dK, dV of its keys into
 * dk, dv (pitch ldk, ldv: kv head g's columns, or the head's own scratch). */
static void bwd_head(float *dq, float *dk, size_t ldk, float *dv, size_t ldv, const float *dout,
                     const float *out, const float *lse, const float *q, const float *k, const float *v,
                     const struct loom_flash_attn *a, float scale, int b, int h, void *wsv)
{
    float keep[FA_BK] __attribute__((aligned(64))), dmask[FA_BK] __attribute__((aligned(64)));
    float *ws = wsv;
    /* T: the part's queries; rows of Qc, dOc, dQc, D from q0, of dk, dv from k0 */
    const int T = fa_tq(a), q0 = a->q0, k0 = a->k0, qend = fa_qend(a), kend = fa_kend(a), hs = a->hs,
              hsp = fa_up16(hs), g = h / (a->NH / a->G);
    const size_t ldo = (size_t)a->NH * hs;
    float *S = ws, *dS = S + FA_BQ * FA_BK, *Kt = dS + FA_BQ * FA_BK, *Vt = Kt + (size_t)hsp * FA_BK;
    float *dKa = Vt + (size_t)hsp * FA_BK, *dVa = dKa + (size_t)FA_BK * hsp, *D = dVa + (size_t)FA_BK * hsp;
    float *Qc = D + fa_up16(T), *dOc = Qc + (size_t)T * hsp, *dQc = dOc + (size_t)T * hsp;
    float *Kc = dQc + (size_t)T * hsp;
    const float *qb = q + (size_t)b * T * a->ld_q + (size_t)h * hs;
    const float *kb = k + (size_t)b * fa_tk(a) * a->ld_k + (size_t)g * hs;
    const float *vb = v + (size_t)b * fa_tk(a) * a->ld_v + (size_t)g * hs;
    const float *dob = dout + (size_t)b * T * ldo + (size_t)h * hs;
    const float *ob = out + (size_t)b * T * ldo + (size_t)h * hs;
    const float *lseb = lse + ((size_t)b * a->NH + h) * fa_ld_lse(a);
    float *dqb = dq + (size_t)b * T * a->ld_q + (size_t)h * hs;
    for (int t = 0; t < T; t++) {
        const float *o = ob + (size_t)t * ldo, *d_o = dob + (size_t)t * ldo;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int d = 0; d < hs; d++) s += o[d] * d_o[d];
        D[t] = s;
        memcpy(Qc + (size_t)t * hsp, qb + (size_t)t * a->ld_q, (size_t)hs * sizeof(float));
        memcpy(dOc + (size_t)t * hsp, d_o, (size_t)hs * sizeof(float));
    }
    memset(dQc, 0, (size_t)T * hsp * sizeof(float));
    for (int j0 = k0; j0 < kend; j0 += FA_BK) { /* positions */
        const int j1 = fa_min(j0 + FA_BK, kend), n = j1 - j0, n16 = fa_up16(n);
        const int tmax = fa_min(fa_last_query(a, b, j1 - 1), qend - 1);
        const float *kj = kb + (size_t)(j0 - k0) * a->ld_k;
        for (int j = 0; j < n; j++)
            memcpy(Kc + (size_t)j * hsp, kj + (size_t)j * a->ld_k, (size_t)hs * sizeof(float));
        fa_pack_t(Kt, FA_BK, Kc, hsp, n, hs); /* from the gathered rows: kj's are pages apart */
        fa_pack_t(Vt, FA_BK, vb + (size_t)(j0 - k0) * a->ld_v, a->ld_v, n, hs);
        memset(dKa, 0, (size_t)n * hsp * sizeof(float));
        memset(dVa, 0, (size_t)n * hsp * sizeof(float));
        for (int i0 = fa_max(j0, q0); i0 <= tmax; i0 += FA_BQ) {
            const int i1 = fa_min(i0 + FA_BQ, qend), m = i1 - i0;
            const int kept = fa_tile_kept(a, h, i0, i1, j0, j1);
            if (!kept) continue;
            const int full = kept == 2 && j1 - 1 <= i0 && fa_key_lo(a, b, i1 - 1) <= j0;
            if (full) fa_row_keep(keep, a, b, h, i0, j0, n, n16, 1, 2); /* the same for every row */
            const float *qi = Qc + (size_t)(i0 - q0) * hsp, *doi = dOc + (size_t)(i0 - q0) * hsp;
            fa_gemm(m, n16, hs, qi, hsp, 1, Kt, FA_BK, S, FA_BK, 0);   /* S = Q K^T */
            fa_gemm(m, n16, hs, doi, hsp, 1, Vt, FA_BK, dS, FA_BK, 0); /* dP = dO V^T */
            for (int r = 0; r < m; r++) {
                const int t = i0 + r;
                float *s = S + (size_t)r * FA_BK, *ds = dS + (size_t)r * FA_BK;
                if (!full) fa_row_keep(keep, a, b, h, t, j0, n, n16, 0, kept);
                const float lt = lseb[t - q0] * FA_LOG2E, Dt = D[t - q0], scale2 = scale * FA_LOG2E;
                const float *dm = fa_drop_row(dmask, a, b, h, t, j0, n16);
                if (dm) { /* P's gradient is the dropped one's times the mask; dV takes the dropped P */
#pragma omp simd
                    for (int c = 0; c < n16; c++) {
                        const float e = fa_exp2(s[c] * scale2 - lt);
                        const float p = keep[c] != 0.0f ? e : 0.0f;
                        s[c] = p * dm[c];
                        ds[c] = scale * p * (ds[c] * dm[c] - Dt);
                    }
                    continue;
                }
                if (full && n == n16) { /* every key: no select */
                    for (int c = 0; c < n16; c += 16) {
                        fa_vec *sv = (fa_vec *)(s + c), *dsv = (fa_vec *)(ds + c);
                        const fa_vec p = fa_exp2v(*sv * scale2 - lt);
                        *sv = p;
                        *dsv = scale * p * (*dsv - Dt);
                    }
                    continue;
                }
#pragma omp simd
                for (int c = 0; c < n16; c++) {
                    const float e = fa_exp2(s[c] * scale2 - lt);
                    const float p = keep[c] != 0.0f ? e : 0.0f;
                    s[c] = p;
                    ds[c] = scale * p * (ds[c] - Dt);
                }
            }
            fa_gemm(n, hs, m, S, 1, FA_BK, doi, hsp, dVa, hsp, 1); /* dV += P^T dO */
            fa_gemm(n, hs, m, dS, 1, FA_BK, qi, hsp, dKa, hsp, 1); /* dK += dS^T Q */
            fa_gemm(m, hs, n, dS, FA_BK, 1, Kc, hsp, dQc + (size_t)(i0 - q0) * hsp, hsp, 1); /* dQ += dS K */
        }
        for (int j = 0; j < n; j++) {
            memcpy(dk + (size_t)(j0 - k0 + j) * ldk, dKa + (size_t)j * hsp, (size_t)hs * sizeof(float));
            memcpy(dv + (size_t)(j0 - k0 + j) * ldv, dVa + (size_t)j * hsp, (size_t)hs * sizeof(float));
        }
    }
    for (int t = 0; t < T; t++)
        memcpy(dqb + (size_t)t * a->ld_q, dQc + (size_t)t * hsp, (size_t)hs * sizeof(float));
}

void loom_flash_attn_backward_heads(fa_head_fn fn, size_t ws_bytes, float *dq, float *dk, float *dv,
                                    const float *dout, const float *out, const float *lse, const float *q,
                                    const float *k, const float *v, const struct loom_flash_attn *a)
{
    const float scale = loom_flash_attn_check(a);
    /* T: the part's keys (dk, dv's rows a sequence) */
    const int B = a->B, T = fa_tk(a), NH = a->NH, G = a->G, hs = a->hs, R = NH / G, nthr = fa_threads(a);
    const size_t per = (ws_bytes + 63) & ~(size_t)63;
    char *ws = loom_flash_attn_scratch(FA_SCRATCH_BWD_WS, loom_mul_size((size_t)nthr, per));
    /* grouped: each head's dK and dV (B,NH,T,hs), summed below */
    float *part = R > 1 ? loom_flash_attn_scratch(
                              FA_SCRATCH_BWD_PART,
                              loom_mul_size(loom_mul_size((size_t)2 * B * NH, (size_t)T * hs), sizeof(float)))
                        : NULL;
    const size_t head = (size_t)T * hs;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr) if (nthr > 1)
    for (int bh = 0; bh < B * NH; bh++) {
        const int b = bh / NH, h = bh % NH, g = h / R;
        float *dkh, *dvh;
        size_t ldk, ldv;
        if (part) {
            dkh = part + (size_t)bh * head, dvh = part + ((size_t)B * NH + bh) * head;
            ldk = ldv = (size_t)hs;
        } else {
            dkh = dk + (size_t)b * T * a->ld_k + (size_t)g * hs, ldk = (size_t)a->ld_k;
            dvh = dv + (size_t)b * T * a->ld_v + (size_t)g * hs, ldv = (size_t)a->ld_v;
        }
        fn(dq, dkh, ldk, dvh, ldv, dout, out, lse, q, k, v, a, scale, b, h,
           ws + (size_t)fa_thread_id() * per);
    }
    if (part) {
#pragma omp parallel for collapse(2) schedule(static) num_threads(nthr) if (nthr > 1)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int g = 0; g < G; g++) {
                    float *dkr = dk + ((size_t)b * T + t) * a->ld_k + (size_t)g * hs;
                    float *dvr = dv + ((size_t)b * T + t) * a->ld_v + (size_t)g * hs;
                    for (int d = 0; d < hs; d++) dkr[d] = dvr[d] = 0.0f;
                    for (int r = 0; r < R; r++) {
                        const size_t bh = (size_t)b * NH + (size_t)g * R + r;
                        const float *pk = part + bh * head + (size_t)t * hs;
                        const float *pv = part + ((size_t)B * NH + bh) * head + (size_t)t * hs;
#pragma omp simd
                        for (int d = 0; d < hs; d++) dkr[d] += pk[d], dvr[d] += pv[d];
                    }
                }
    }
}

void loom_flash_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                   const float *lse, const float *q, const float *k, const float *v,
                                   const struct loom_flash_attn *a)
{
    loom_flash_attn_backward_heads(bwd_head, bwd_ws(a->hs, fa_tq(a)) * sizeof(float), dq, dk, dv, dout, out,
                                   lse, q, k, v, a);
}

/* ---- merging blocks of keys ------------------------------------------------------ */

void loom_flash_attention_merge(float *out, float *lse, const float *out_p, const float *lse_p, int N, int NH,
                                int hs, int ld_lse)
{
    const size_t ldo = (size_t)NH * hs;
#pragma omp parallel for collapse(2) if ((size_t)N * NH * hs >= 65536)
    for (int h = 0; h < NH; h++)
        for (int n = 0; n < N; n++) {
            const float lp = lse_p[(size_t)h * N + n];
            float *l = lse + (size_t)h * ld_lse + n;
            if (lp == -INFINITY) continue;
            const float mx = fmaxf(*l, lp), lnew = mx + logf(expf(*l - mx) + expf(lp - mx));
            const float wa = expf(*l - lnew), wb = expf(lp - lnew);
            float *o = out + (size_t)n * ldo + (size_t)h * hs;
            const float *op = out_p + (size_t)n * ldo + (size_t)h * hs;
            for (int d = 0; d < hs; d++) o[d] = wa * o[d] + wb * op[d];
            *l = lnew;
        }
}
