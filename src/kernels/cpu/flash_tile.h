/*
 * What the fused attention kernels (flash_attention.c, flash_attention_bf16.c)
 * share: the tile sizes, each query's key range under the causal, window and
 * document rules, and a register-blocked float32 product for one tile.
 *
 * Every mask the kernels take leaves query t of row b the contiguous keys
 * [key_lo(t), t]: causal, the window's t - W + 1, the document's start.
 * key_lo never decreases along t (doc_start is checked to be so), so the
 * keys a query tile needs are one range, and the query tiles that reach a
 * key tile are one range too.
 *
 * The product computes c (M,N) (+)= a (M,K) b (K,N) with a read through any
 * two strides (a row-major tile, or one transposed) and b row-major: blocks
 * of MR rows by up to 64 columns held in registers (GCC vector types, which
 * become AVX-512, AVX2 or SSE code by -march), each b row read once per
 * block and each a element broadcast. Columns past the last multiple of 16
 * are done by plain loops. Deliberately not: cache blocking (the tiles fit
 * in L1/L2), packing a (it is read in place), or a BLAS call per tile.
 */
#ifndef LOOM_KERNELS_CPU_FLASH_TILE_H
#define LOOM_KERNELS_CPU_FLASH_TILE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/vexp.h"
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include "kernels/dropout_mask.h"
#include "kernels/kernels.h"
#include "kernels/sparse_layout.h"

#define FA_BQ 64 /* query rows per tile */
#define FA_BK 64 /* keys per tile; equal to FA_BQ so diagonal tiles line up */
#define FA_MR 6  /* rows of a register block */

static inline int fa_min(int a, int b)
{
    return a < b ? a : b;
}

static inline int fa_max(int a, int b)
{
    return a > b ? a : b;
}

/* n rounded up to a multiple of 16 */
static inline int fa_up16(int n)
{
    return (n + 15) & ~15;
}

/* The part of the sequences a call has (kernels.h: q0, Tq, k0, Tk): its
 * queries' and keys' rows a sequence, their ends, lse's pitch. */
static inline int fa_tq(const struct loom_flash_attn *a)
{
    return a->Tq ? a->Tq : a->T - a->q0;
}
static inline int fa_tk(const struct loom_flash_attn *a)
{
    return a->Tk ? a->Tk : a->T - a->k0;
}
static inline int fa_qend(const struct loom_flash_attn *a)
{
    return a->q0 + fa_tq(a);
}
static inline int fa_kend(const struct loom_flash_attn *a)
{
    return a->k0 + fa_tk(a);
}
static inline size_t fa_ld_lse(const struct loom_flash_attn *a)
{
    return (size_t)(a->ld_lse ? a->ld_lse : fa_tq(a));
}

/* The first key query t of sequence b may see: [key_lo, t] are its keys
 * (before a layout's blocks), and of the call's part [key_lo, kend). */
static inline int fa_key_lo(const struct loom_flash_attn *a, int b, int t)
{
    int lo = a->window > 0 ? t - a->window + 1 : 0;
    if (a->layout && a->layout->window > 0 && t - a->layout->window + 1 > lo) lo = t - a->layout->window + 1;
    if (lo < 0) lo = 0;
    if (a->doc_start) {
        const int d = a->doc_start[(size_t)b * a->T + t];
        if (d > lo) lo = d;
    }
    return lo > a->k0 ? lo : a->k0;
}

/* The last query of sequence b that sees key j (>= j), by bisection on
 * key_lo's order. */
static inline int fa_last_query(const struct loom_flash_attn *a, int b, int j)
{
    int lo = j, hi = a->T - 1; /* key_lo(j) <= j: query j sees key j (k0 <= j) */
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (fa_key_lo(a, b, mid) <= j)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* How much of tile (queries [i0, i1), keys [j0, j1)) head h's layout
 * keeps: 0 no block pair, 1 some, 2 all (no layout: all). */
static inline int fa_tile_kept(const struct loom_flash_attn *a, int h, int i0, int i1, int j0, int j1)
{
    const struct loom_sparse_layout *l = a->layout;
    if (!l) return 2;
    const uint8_t *m = l->mask + (size_t)(l->heads == 1 ? 0 : a->h0 + h) * l->nb * l->nb;
    int any = 0, all = 1;
    for (int rb = i0 / l->block; rb <= (i1 - 1) / l->block; rb++)
        for (int cb = j0 / l->block; cb <= (j1 - 1) / l->block; cb++) {
            const int k = m[(size_t)rb * l->nb + cb] != 0;
            any |= k, all &= k;
        }
    return all ? 2 : any;
}

/* keep (n16): 1 for the keys [j0, j0 + n) of a tile that query t (of head
 * h, sequence b) sees, else 0; full: the tile is inside every row's range
 * and kept whole; kept 1: kept in part, so the layout's block pairs decide
 * too. Returns how many it sees. */
static inline int fa_row_keep(float *keep, const struct loom_flash_attn *a, int b, int h, int t, int j0,
                              int n, int n16, int full, int kept)
{
    const int ca = full ? 0 : fa_key_lo(a, b, t) - j0, ce = full ? n : fa_min(t + 1, fa_kend(a)) - j0;
    int cnt = 0;
    for (int c = 0; c < n16; c++) {
        const int k = c >= ca && c < ce && c < n;
        keep[c] = (float)k;
        cnt += k;
    }
    if (kept == 1 && cnt) {
        const struct loom_sparse_layout *l = a->layout;
        const uint8_t *m = l->mask + ((size_t)(l->heads == 1 ? 0 : a->h0 + h) * l->nb + t / l->block) * l->nb;
        cnt = 0;
        for (int c = 0; c < n; c++) {
            if (!m[(j0 + c) / l->block]) keep[c] = 0.0f;
            cnt += keep[c] != 0.0f;
        }
    }
    return cnt;
}

#define FA_LOG2E 1.4426950408889634f

/* 2^u for the softmax's u <= 0 in base 2 (the callers fold log2(e) into
 * the scale and the maximum: u = s scale log2(e) - m log2(e)); larger u
 * come only from masked entries, whose value a select then drops. u is
 * held above -125 so that 2^k times the polynomial (in [0.7, 1.42]) is a
 * normal float, made by adding k to its exponent. k = round(u) by the
 * shift trick, f = u - k in [-1/2, 1/2], 2^f by a degree-5 polynomial
 * fitted for the least largest relative error on that interval (7.5e-8;
 * 2.1e-7 over [-40, 0] with float32's roundings, where vexp.h's range
 * reduction in base e gave 2.3e-7). 11 vector operations against 16 in
 * base e: the exponential is most of the softmax's work. */
static inline float fa_exp2(float u)
{
    u = u < -125.0f ? -125.0f : u;
    const float shift = 0x1.8p23f;
    const float t = u + shift;
    const float f = u - (t - shift);
    float p = 0x1.5c08e4p-10f;
    p = VEXP_FMA(p, f, 0x1.3d0c52p-7f);
    p = VEXP_FMA(p, f, 0x1.c6b6e4p-5f);
    p = VEXP_FMA(p, f, 0x1.ebf918p-3f);
    p = VEXP_FMA(p, f, 0x1.62e428p-1f);
    p = VEXP_FMA(p, f, 0x1.000002p+0f);
    union {
        float f;
        uint32_t u;
    } tb = {t}, pb = {p};
    pb.u += tb.u << 23; /* t's low bits hold k; the shift's own bits leave nothing at 23 and above */
    return pb.f;
}

/* float32 -> bf16, round to nearest even (NaN stays a NaN) */
static inline uint16_t fa_bf(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u) : (uint16_t)r;
}

/* Attention dropout's mask of query t (a position) of head h of sequence b
 * on the keys [j0, j0 + n) into dm (kernels/dropout_mask.h); NULL when the
 * call drops nothing. */
static inline const float *fa_drop_row(float *dm, const struct loom_flash_attn *a, int b, int h, int t,
                                       int j0, int n)
{
    if (!a->drop) return NULL;
    const int64_t NHg = a->NHg ? a->NHg : a->NH;
    const uint64_t row = (uint64_t)(((a->seq0 + b) * NHg + a->h0 + h) * a->T + t);
    loom_dropout_mask_row(dm, a->drop, loom_dropout_row_key(a->drop, row), j0, n);
    return dm;
}

/* 16-lane vectors, passed and returned by value only among these static
 * inline helpers: below AVX-512 GCC's note that such a return changes the
 * ABI concerns no call that leaves the file */
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float fa_vec __attribute__((vector_size(64), aligned(4), may_alias));
typedef float fa_vec8 __attribute__((vector_size(32)));
typedef float fa_vec4 __attribute__((vector_size(16)));

typedef int32_t fa_ivec __attribute__((vector_size(64)));

static inline fa_vec fa_splat(float x)
{
    return (fa_vec){0} + x;
}

/* mask's lanes (-1 or 0, as comparisons make them) of a, the others of b */
static inline fa_vec fa_vsel(fa_ivec mask, fa_vec a, fa_vec b)
{
    return (fa_vec)(((fa_ivec)a & mask) | ((fa_ivec)b & ~mask));
}

/* The larger of a and b in each lane (a where b is a NaN): one vmaxps
 * where the target has it, which GCC does not make of the select */
static inline fa_vec fa_vmax(fa_vec a, fa_vec b)
{
#ifdef __AVX512F__
    return (fa_vec)_mm512_max_ps((__m512)b, (__m512)a);
#else
    return fa_vsel(a > b, a, b);
#endif
}

/* fa_exp2 on 16 lanes: the same clamp, rounding and polynomial; with
 * AVX-512, k = round(u) and f = u - k in two operations (vrndscaleps) and
 * 2^k by vscalefps, 9 operations against 11, the same values */
static inline fa_vec fa_exp2v(fa_vec u)
{
    u = fa_vmax(u, fa_splat(-125.0f));
#ifdef __AVX512F__
    const fa_vec k = (fa_vec)_mm512_roundscale_ps((__m512)u, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const fa_vec f = u - k;
#else
    const fa_vec t = u + 0x1.8p23f;
    const fa_vec f = u - (t - 0x1.8p23f);
#endif
    fa_vec p = fa_splat(0x1.5c08e4p-10f);
    p = p * f + 0x1.3d0c52p-7f;
    p = p * f + 0x1.c6b6e4p-5f;
    p = p * f + 0x1.ebf918p-3f;
    p = p * f + 0x1.62e428p-1f;
    p = p * f + 0x1.000002p+0f;
#ifdef __AVX512F__
    return (fa_vec)_mm512_scalef_ps((__m512)p, (__m512)k);
#else
    return (fa_vec)((fa_ivec)p + ((fa_ivec)t << 23));
#endif
}

/* The sum of v's 16 lanes, halves added to halves (a fixed order, whatever
 * the compiler: its omp simd reduction adds the lanes one after another, a
 * chain of 16 dependent adds per row that cost the forward about a tenth) */
static inline float fa_hsum(fa_vec v)
{
    const fa_vec8 h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                      __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    const fa_vec4 q = __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
    return (q[0] + q[2]) + (q[1] + q[3]);
}

/* The sum of a tile row's n16 (a multiple of 16) values */
static inline float fa_row_sum(const float *s, int n16)
{
    fa_vec v = *(const fa_vec *)s;
    for (int c = 16; c < n16; c += 16) v += *(const fa_vec *)(s + c);
    return fa_hsum(v);
}

/* A tile row's maximum of the scores s (n16) on the keys keep marks
 * (every key where keep is NULL: the tile is full). */
static inline float fa_row_max(const float *s, const float *keep, int n16)
{
    float smax = -INFINITY;
    if (keep) {
#pragma omp simd reduction(max : smax)
        for (int c = 0; c < n16; c++) smax = keep[c] != 0.0f && s[c] > smax ? s[c] : smax;
    } else {
#pragma omp simd reduction(max : smax)
        for (int c = 0; c < n16; c++) smax = s[c] > smax ? s[c] : smax;
    }
    return smax;
}

/* One row of a bf16 forward tile, the online softmax's step: the row's
 * unnormalised probabilities exp(scale s - m) on the keys keep marks, 0
 * elsewhere (keep NULL: a full tile, every key, no dropout), from s (n16
 * raw scores) into pa rounded to bf16 (the a operand of P V), times
 * dropout's mask dm where given, and into s as they are (the sum is the
 * undropped one); the row's running maximum *mx and sum *l move to the new
 * maximum m, and its accumulator acc (hs) is rescaled to it. (The float32
 * kernel takes 16 queries' steps at once, on S^T: flash_attention.c.) */
static inline __attribute__((always_inline)) void fa_online_row(float *s, uint16_t *pa, const float *keep,
                                                                const float *dm, int n16, float scale,
                                                                float *mx, float *l, float *acc, int hs)
{
    const float smax = fa_row_max(s, keep, n16) * scale;
    const float mnew = *mx >= smax ? *mx : smax;
    const float alpha = expf(*mx - mnew); /* 0 at the row's first tile */
    const float scale2 = scale * FA_LOG2E, m2 = mnew * FA_LOG2E;
    /* the loops without dropout or a mask stay free of their tests: a
     * select in the vector loop cost the float32 kernels a third of their
     * speed */
    if (!keep) {
#pragma omp simd
        for (int c = 0; c < n16; c++) {
            const float p = fa_exp2(s[c] * scale2 - m2);
            pa[c] = fa_bf(p);
            s[c] = p;
        }
    } else if (dm) {
#pragma omp simd
        for (int c = 0; c < n16; c++) {
            const float e = fa_exp2(s[c] * scale2 - m2);
            const float p = keep[c] != 0.0f ? e : 0.0f;
            pa[c] = fa_bf(p * dm[c]);
            s[c] = p;
        }
    } else {
#pragma omp simd
        for (int c = 0; c < n16; c++) {
            const float e = fa_exp2(s[c] * scale2 - m2);
            const float p = keep[c] != 0.0f ? e : 0.0f;
            pa[c] = fa_bf(p);
            s[c] = p;
        }
    }
    *l = *l * alpha + fa_row_sum(s, n16);
    *mx = mnew;
    if (alpha != 1.0f) {
#pragma omp simd
        for (int d = 0; d < hs; d++) acc[d] *= alpha;
    }
}

/* The end of a forward query tile [i0, i0 + m) (positions) of head h of
 * sequence b: out = acc / l, lse = m + log l, from the rows' accumulators
 * (pitch hsp), maxima and sums; a row that saw no key (l 0: a part's
 * keys all after it or before its document) out 0, lse -inf. */
static inline void fa_finish_rows(float *out, float *lse, const float *acc, int hsp, const float *mx,
                                  const float *l, const struct loom_flash_attn *a, int b, int h, int i0,
                                  int m)
{
    const size_t ldo = (size_t)a->NH * a->hs;
    const int r0 = i0 - a->q0;
    for (int r = 0; r < m; r++) {
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        float *o = out + ((size_t)b * fa_tq(a) + r0 + r) * ldo + (size_t)h * a->hs;
        const float *ar = acc + (size_t)r * hsp;
#pragma omp simd
        for (int d = 0; d < a->hs; d++) o[d] = ar[d] * inv;
        lse[((size_t)b * a->NH + h) * fa_ld_lse(a) + r0 + r] = l[r] > 0.0f ? mx[r] + logf(l[r]) : -INFINITY;
    }
}

static inline __attribute__((always_inline)) void fa_mk(const int M, const int NV, int K, const float *a,
                                                        ptrdiff_t ai, ptrdiff_t ap, const float *b,
                                                        ptrdiff_t ldb, float *c, ptrdiff_t ldc, int acc,
                                                        const float *rs)
{
    fa_vec r[FA_MR][4];
    for (int i = 0; i < M; i++)
        for (int v = 0; v < NV; v++) {
            r[i][v] = acc ? *(const fa_vec *)(c + i * ldc + 16 * v) : (fa_vec){0};
            if (rs) r[i][v] *= rs[i];
        }
    for (int p = 0; p < K; p++) {
        fa_vec bv[4];
        for (int v = 0; v < NV; v++) bv[v] = *(const fa_vec *)(b + p * ldb + 16 * v);
        const float *ap_ = a + p * ap;
        for (int i = 0; i < M; i++) {
            const float s = ap_[i * ai];
            for (int v = 0; v < NV; v++) r[i][v] += s * bv[v];
        }
    }
    for (int i = 0; i < M; i++)
        for (int v = 0; v < NV; v++) *(fa_vec *)(c + i * ldc + 16 * v) = r[i][v];
}

#define FA_MK_CASE(m, nv)                                                                                    \
    case (m)*8 + (nv):                                                                                       \
        fa_mk(m, nv, K, ai0, ai, ap, b + n0, ldb, c + (ptrdiff_t)i0 * ldc + n0, ldc, acc,                    \
              rs ? rs + i0 : NULL);                                                                          \
        break;
#define FA_MK_ROW(m) FA_MK_CASE(m, 1) FA_MK_CASE(m, 2) FA_MK_CASE(m, 3) FA_MK_CASE(m, 4)

/* c (M,N) = (acc: +=) sum over p < K of a(i,p) b(p,:): a(i,p) at
 * a[i*ai + p*ap], b row-major (ldb), c row-major (ldc); with rs (acc),
 * c's row i is scaled by rs[i] first (the forward's rescale, fused into
 * the product's loads). */
static inline void fa_gemm_rs(int M, int N, int K, const float *a, ptrdiff_t ai, ptrdiff_t ap, const float *b,
                              ptrdiff_t ldb, float *c, ptrdiff_t ldc, int acc, const float *rs)
{
    const int nfull = N & ~15;
    for (int n0 = 0; n0 < nfull; n0 += 64) {
        const int nv = fa_min(4, (nfull - n0) / 16);
        for (int i0 = 0; i0 < M; i0 += FA_MR) {
            const int m = fa_min(FA_MR, M - i0);
            const float *ai0 = a + (ptrdiff_t)i0 * ai;
            switch (m * 8 + nv) {
                FA_MK_ROW(1)
                FA_MK_ROW(2)
                FA_MK_ROW(3)
                FA_MK_ROW(4)
                FA_MK_ROW(5)
                FA_MK_ROW(6)
            default:
                break;
            }
        }
    }
    for (int i = 0; i < M; i++)
        for (int n = nfull; n < N; n++) {
            float s = acc ? c[(ptrdiff_t)i * ldc + n] * (rs ? rs[i] : 1.0f) : 0.0f;
            for (int p = 0; p < K; p++)
                s += a[(ptrdiff_t)i * ai + (ptrdiff_t)p * ap] * b[(ptrdiff_t)p * ldb + n];
            c[(ptrdiff_t)i * ldc + n] = s;
        }
}

static inline void fa_gemm(int M, int N, int K, const float *a, ptrdiff_t ai, ptrdiff_t ap, const float *b,
                           ptrdiff_t ldb, float *c, ptrdiff_t ldc, int acc)
{
    fa_gemm_rs(M, N, K, a, ai, ap, b, ldb, c, ldc, acc, NULL);
}

/* The rows [k0, kend) of key tile [j0, j0 + n) (positions) of src, whose
 * row 0 is position k0 (pitch lds), into rows (hs floats) of a float32 tile
 * (n, hs), the rows outside zero: a part's first tile starts before its
 * first key. Returns the tile, or src's row j0 itself when the tile is
 * whole (*ld then lds). */
static inline const float *fa_edge_tile(float *tile, const float *src, ptrdiff_t lds,
                                        const struct loom_flash_attn *a, int j0, int n, int hs, ptrdiff_t *ld)
{
    if (j0 >= a->k0 && j0 + n <= fa_kend(a)) {
        *ld = lds;
        return src + (ptrdiff_t)(j0 - a->k0) * lds;
    }
    for (int j = 0; j < n; j++) {
        const int p = j0 + j;
        if (p >= a->k0 && p < fa_kend(a))
            memcpy(tile + (size_t)j * hs, src + (ptrdiff_t)(p - a->k0) * lds, (size_t)hs * sizeof(float));
        else
            memset(tile + (size_t)j * hs, 0, (size_t)hs * sizeof(float));
    }
    *ld = hs;
    return tile;
}

/* Key tile jt of the call's (tile kt0 + jt of 64 positions from 0) of
 * sequence b, key/value head g: its n positions from its first, and k's and
 * v's rows of them (*kr, *vr, pitches *ldk, *ldv), through edge (2 BK hs
 * floats) where the part begins or ends inside the tile. Returns n. */
static inline int fa_kv_tile(const struct loom_flash_attn *a, const float *k, const float *v, int b, int g,
                             int kt0, int jt, float *edge, const float **kr, ptrdiff_t *ldk, const float **vr,
                             ptrdiff_t *ldv)
{
    const int j0 = (kt0 + jt) * FA_BK, n = fa_min(FA_BK, fa_kend(a) - j0), hs = a->hs, Tk = fa_tk(a);
    *kr = fa_edge_tile(edge, k + (size_t)b * Tk * a->ld_k + (size_t)g * hs, a->ld_k, a, j0, n, hs, ldk);
    *vr = fa_edge_tile(edge + FA_BK * hs, v + (size_t)b * Tk * a->ld_v + (size_t)g * hs, a->ld_v, a, j0, n,
                       hs, ldv);
    return n;
}

/* dst (hs, ld) = rows [0, n) of src (row pitch lds) transposed, the columns
 * n..up16(n) zero: a key or value tile as the b operand of a product with
 * it transposed. */
static inline void fa_pack_t(float *dst, int ld, const float *src, ptrdiff_t lds, int n, int hs)
{
    const int n16 = fa_up16(n);
    for (int j = 0; j < n; j++) {
        const float *s = src + (ptrdiff_t)j * lds;
        for (int d = 0; d < hs; d++) dst[(ptrdiff_t)d * ld + j] = s[d];
    }
    for (int d = 0; d < hs; d++)
        for (int j = n; j < n16; j++) dst[(ptrdiff_t)d * ld + j] = 0.0f;
}

/* Checks a's sizes and doc_start's order; returns the scale. */
float loom_flash_attn_check(const struct loom_flash_attn *a);

/* The kernels' scratch, kept between calls (first-touching fresh pages
 * each call cost about a tenth of a call): slot's buffer of at least bytes,
 * contents undefined. Calls run one at a time, as the bf16 products'
 * conversion buffers assume. Slots: */
enum { FA_SCRATCH_FWD_WS, FA_SCRATCH_FWD_PACK, FA_SCRATCH_BWD_WS, FA_SCRATCH_BWD_PART, FA_SCRATCH_COUNT };
void *loom_flash_attn_scratch(int slot, size_t bytes);

/* The threads for a call: all of them, or one below 2^18 multiply-adds
 * (B NH T T hs / 2), where waking the pool costs more. */
static inline int fa_threads(const struct loom_flash_attn *a)
{
#ifdef _OPENMP
    const size_t work = (size_t)a->B * a->NH * a->T * a->T / 2 * a->hs;
    return work >= ((size_t)1 << 18) ? omp_get_max_threads() : 1;
#else
    (void)a;
    return 1;
#endif
}

static inline int fa_thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* The backward of head h of sequence b: dq's rows of the head written, and
 * dK, dV of its keys into dk, dv (pitch ldk, ldv); ws its thread's
 * workspace. */
typedef void (*fa_head_fn)(float *dq, float *dk, size_t ldk, float *dv, size_t ldv, const float *dout,
                           const float *out, const float *lse, const float *q, const float *k, const float *v,
                           const struct loom_flash_attn *a, float scale, int b, int h, void *ws);

/* Runs fn for every (b, h) in parallel, each thread with ws_bytes of
 * workspace; grouped heads write their dK, dV into a (B,NH,T,hs) scratch
 * pair, summed into dk and dv after (kv head g's rows of its heads). */
void loom_flash_attn_backward_heads(fa_head_fn fn, size_t ws_bytes, float *dq, float *dk, float *dv,
                                    const float *dout, const float *out, const float *lse, const float *q,
                                    const float *k, const float *v, const struct loom_flash_attn *a);

#endif
