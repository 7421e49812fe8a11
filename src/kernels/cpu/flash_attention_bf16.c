/*
 * Fused causal attention with the products on bf16 operands: the
 * algorithm, masks, tiles and parallel split of flash_attention.c, with
 * each operand of the two forward products (Q K^T, P V) and of the five
 * backward ones (Q K^T, dO V^T, P^T dO, dS^T Q, dS K) rounded to bf16 as it
 * is packed, and the softmax statistics, the accumulators, D and every
 * sum in float32.
 *
 * The units are loom_bf16_units()'s choice: AMX and AVX512-BF16 run
 * AVX512-BF16's dot products (vdpbf16ps: pairs along the summed axis
 * multiplied and added into float32), where the CPU has them; "avx512"
 * (and a CPU without them) runs the same packed operands widened to
 * float32 and multiplied exactly, in GCC vector code. The two give the
 * same products up to the order of float32 additions.
 *
 * Operands: an "a" operand is bf16 row-major with an even row length, a
 * "b" operand holds pairs of rows interleaved ((K/2, N, 2): element (p, n)
 * at [(p/2) 2 ldn + 2 n + p%2]) with N padded to a multiple of 16; rows
 * and columns past the data are zero. The forward packs K and V once per
 * call, (B,G) heads of tiles; the backward packs Q and dO in both forms
 * once per head, K and V per key tile, and P, dS as they are made, and
 * sums dK and dV transposed so that nothing made per tile is transposed.
 *
 * On AMX the products run on the tiles (gemm_amx): 16 x 16 blocks of
 * float32 sums, 16 pairs of the summed axis a step, in the same packed
 * layouts (the b operand's pairs are AMX's own); rows and pairs past the
 * last whole 16 run on vdpbf16ps.
 *
 * Deliberately not: bf16 inputs or outputs (the tensors stay float32).
 */
#include <math.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "kernels/cpu/flash_tile.h"
#include "kernels/cpu/vexp.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#include <immintrin.h>
#define FA_DPBF16 1
#endif

static inline int up2(int n)
{
    return (n + 1) & ~1;
}

/* a operand (rows, ld): dst[r][c] = bf16(src[r s_r + c s_c]), columns
 * [cols, ld) zero */
static void pack_a(uint16_t *dst, int ld, const float *src, ptrdiff_t s_r, ptrdiff_t s_c, int rows, int cols)
{
    if (s_r == 1 && s_c != 1) { /* a transpose: 16 of the source's rows at a time, each row of dst's
                                 * piece written whole (a store per element, rows apart, was 4 KiB
                                 * aliasing in L1 at long T) */
        for (int c0 = 0; c0 < cols; c0 += 16) {
            const int nc = fa_min(16, cols - c0);
            for (int r = 0; r < rows; r++) {
                uint16_t *d = dst + (size_t)r * ld + c0;
                const float *s = src + r + (ptrdiff_t)c0 * s_c;
                for (int c = 0; c < nc; c++) d[c] = fa_bf(s[c * s_c]);
            }
        }
        for (int r = 0; r < rows; r++)
            for (int c = cols; c < ld; c++) dst[(size_t)r * ld + c] = 0;
        return;
    }
    for (int r = 0; r < rows; r++) {
        uint16_t *d = dst + (size_t)r * ld;
        const float *s = src + r * s_r;
        if (s_c == 1) {
#pragma omp simd
            for (int c = 0; c < cols; c++) d[c] = fa_bf(s[c]);
        } else {
            for (int c = 0; c < cols; c++) d[c] = fa_bf(s[c * s_c]);
        }
        for (int c = cols; c < ld; c++) d[c] = 0;
    }
}

/* b operand of K2 = up2(K) rows by ldn columns: element (p, n) =
 * bf16(src[p s_k + n s_n]) for p < K, n < N, else 0 */
static void pack_b(uint16_t *dst, int ldn, const float *src, ptrdiff_t s_k, ptrdiff_t s_n, int K, int N)
{
    const int K2 = up2(K);
    for (int p = 0; p < K2; p++) {
        uint16_t *d = dst + (size_t)(p / 2) * 2 * ldn + (p & 1);
        if (p >= K) {
            for (int n = 0; n < ldn; n++) d[2 * n] = 0;
            continue;
        }
        const float *s = src + p * s_k;
        for (int n = 0; n < N; n++) d[2 * n] = fa_bf(s[n * s_n]);
        for (int n = N; n < ldn; n++) d[2 * n] = 0;
    }
}

/* ---- the products: c (M, 16 NV) (+)= a (M, 2 K2) b (2 K2, 16 NV) ------------------- */

typedef uint32_t fa_u32 __attribute__((vector_size(64), aligned(4), may_alias));

static inline float lo_f(uint32_t w)
{
    const uint32_t u = w << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float hi_f(uint32_t w)
{
    const uint32_t u = w & 0xffff0000u;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* widened to float32: each pair's two products added into the sums */
static inline __attribute__((always_inline)) void mk_wide(const int M, const int NV, int K2,
                                                          const uint16_t *a, ptrdiff_t lda, const uint16_t *b,
                                                          ptrdiff_t ldb2, float *c, ptrdiff_t ldc, int acc)
{
    fa_vec r[FA_MR][4];
    for (int i = 0; i < M; i++)
        for (int v = 0; v < NV; v++) r[i][v] = acc ? *(const fa_vec *)(c + i * ldc + 16 * v) : (fa_vec){0};
    for (int p = 0; p < K2; p++) {
        fa_vec be[4], bo[4];
        for (int v = 0; v < NV; v++) {
            const fa_u32 w = *(const fa_u32 *)(b + p * ldb2 + 32 * v);
            be[v] = (fa_vec)(w << 16);
            bo[v] = (fa_vec)(w & 0xffff0000u);
        }
        for (int i = 0; i < M; i++) {
            uint32_t w;
            memcpy(&w, a + i * lda + 2 * p, sizeof w);
            const float ae = lo_f(w), ao = hi_f(w);
            for (int v = 0; v < NV; v++) r[i][v] += ae * be[v] + ao * bo[v];
        }
    }
    for (int i = 0; i < M; i++)
        for (int v = 0; v < NV; v++) *(fa_vec *)(c + i * ldc + 16 * v) = r[i][v];
}

#define BF_CASE(kern, m, nv)                                                                                 \
    case (m)*8 + (nv):                                                                                       \
        kern(m, nv, K2, a + (ptrdiff_t)i0 * lda, lda, b + 2 * n0, ldb2, c + (ptrdiff_t)i0 * ldc + n0, ldc,   \
             acc);                                                                                           \
        break;
#define BF_ROW(kern, m) BF_CASE(kern, m, 1) BF_CASE(kern, m, 2) BF_CASE(kern, m, 3) BF_CASE(kern, m, 4)
#define BF_DRIVER(kern)                                                                                      \
    for (int n0 = 0; n0 < N; n0 += 64) {                                                                     \
        const int nv = fa_min(4, (N - n0) / 16);                                                             \
        for (int i0 = 0; i0 < M; i0 += FA_MR) {                                                              \
            switch (fa_min(FA_MR, M - i0) * 8 + nv) {                                                        \
                BF_ROW(kern, 1)                                                                              \
                BF_ROW(kern, 2)                                                                              \
                BF_ROW(kern, 3)                                                                              \
                BF_ROW(kern, 4)                                                                              \
                BF_ROW(kern, 5)                                                                              \
                BF_ROW(kern, 6)                                                                              \
            default:                                                                                         \
                break;                                                                                       \
            }                                                                                                \
        }                                                                                                    \
    }

static void gemm_wide(int M, int N, int K2, const uint16_t *a, ptrdiff_t lda, const uint16_t *b,
                      ptrdiff_t ldb2, float *c, ptrdiff_t ldc, int acc)
{
    BF_DRIVER(mk_wide)
}

#ifdef FA_DPBF16
#define FA_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* AVX512-BF16: one vdpbf16ps per pair of rows and 16 columns */
static inline __attribute__((always_inline)) FA_TARGET void mk_dp(const int M, const int NV, int K2,
                                                                  const uint16_t *a, ptrdiff_t lda,
                                                                  const uint16_t *b, ptrdiff_t ldb2, float *c,
                                                                  ptrdiff_t ldc, int acc)
{
    __m512 r[FA_MR][4];
    for (int i = 0; i < M; i++)
        for (int v = 0; v < NV; v++)
            r[i][v] = acc ? _mm512_loadu_ps(c + i * ldc + 16 * v) : _mm512_setzero_ps();
    for (int p = 0; p < K2; p++) {
        __m512bh bv[4];
        for (int v = 0; v < NV; v++) bv[v] = (__m512bh)_mm512_loadu_si512(b + p * ldb2 + 32 * v);
        for (int i = 0; i < M; i++) {
            int32_t w;
            memcpy(&w, a + i * lda + 2 * p, sizeof w);
            const __m512bh av = (__m512bh)_mm512_set1_epi32(w);
            for (int v = 0; v < NV; v++) r[i][v] = _mm512_dpbf16_ps(r[i][v], av, bv[v]);
        }
    }
    for (int i = 0; i < M; i++)
        for (int v = 0; v < NV; v++) _mm512_storeu_ps(c + i * ldc + 16 * v, r[i][v]);
}

static FA_TARGET void gemm_dp(int M, int N, int K2, const uint16_t *a, ptrdiff_t lda, const uint16_t *b,
                              ptrdiff_t ldb2, float *c, ptrdiff_t ldc, int acc)
{
    BF_DRIVER(mk_dp)
}
#endif

typedef void (*gemm_fn)(int M, int N, int K2, const uint16_t *a, ptrdiff_t lda, const uint16_t *b,
                        ptrdiff_t ldb2, float *c, ptrdiff_t ldc, int acc);

#if defined(FA_DPBF16) && __GNUC__ >= 12
#include <sys/syscall.h>
#include <unistd.h>
#define FA_AMX 1
#define FA_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

/* AMX: 16 x 16 float32 tiles of c, each the sum over 16 pairs at a time
 * of an a tile (16 rows, 32 bf16) by a b tile (16 pairs of rows of 16
 * columns: the b operand's own layout). Every tile is 16 rows of 64
 * bytes: tiles 0-3 hold c, 4-5 a, 6-7 b. The tile configuration is a
 * thread's state and oneDNN's kernels load their own between loom's
 * calls, so each task loads this one before its products (amx_begin). */
struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

static FA_AMX_TARGET void amx_begin(void)
{
    struct amx_cfg cfg = {.palette = 1};
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
}

static FA_AMX_TARGET void amx_end(void)
{
    _tile_release();
}

/* The OS's leave to use the tile data (Linux asks for it per process). */
static int amx_permitted(void)
{
    static int ok = -1;
    if (ok < 0) {
        enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
        ok = __builtin_cpu_supports("amx-bf16") && __builtin_cpu_supports("amx-tile") &&
             syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    }
    return ok;
}

/* c's rows [0, 16 M16) and pairs [0, 16 K16) on the tiles, in blocks of
 * two by two tiles of c; the rest (rows past the last 16, pairs past the
 * last 16) on vdpbf16ps. K2 >= 1, as every caller's. */
static FA_AMX_TARGET void gemm_amx(int M, int N, int K2, const uint16_t *a, ptrdiff_t lda, const uint16_t *b,
                                   ptrdiff_t ldb2, float *c, ptrdiff_t ldc, int acc)
{
    const int M16 = M / 16 * 16, K16 = K2 / 16 * 16, nt = N / 16;
    const size_t sa = (size_t)lda * 2, sb = (size_t)ldb2 * 2, sc = (size_t)ldc * 4;
    if (K16 > 0)
        for (int i0 = 0; i0 < M16; i0 += 32) {
            const int two_m = i0 + 32 <= M16;
            for (int t0 = 0; t0 < nt; t0 += 2) {
                const int two_n = t0 + 2 <= nt;
                float *c00 = c + (ptrdiff_t)i0 * ldc + 16 * t0, *c10 = c00 + 16 * ldc;
                if (acc) {
                    _tile_loadd(0, c00, sc);
                    if (two_n) _tile_loadd(1, c00 + 16, sc);
                    if (two_m) _tile_loadd(2, c10, sc);
                    if (two_m && two_n) _tile_loadd(3, c10 + 16, sc);
                } else {
                    _tile_zero(0);
                    _tile_zero(1);
                    _tile_zero(2);
                    _tile_zero(3);
                }
                for (int p0 = 0; p0 < K16; p0 += 16) {
                    const uint16_t *a0 = a + (ptrdiff_t)i0 * lda + 2 * p0, *b0 = b + p0 * ldb2 + 32 * t0;
                    _tile_loadd(4, a0, sa);
                    _tile_loadd(6, b0, sb);
                    _tile_dpbf16ps(0, 4, 6);
                    if (two_n) {
                        _tile_loadd(7, b0 + 32, sb);
                        _tile_dpbf16ps(1, 4, 7);
                    }
                    if (two_m) {
                        _tile_loadd(5, a0 + 16 * lda, sa);
                        _tile_dpbf16ps(2, 5, 6);
                        if (two_n) _tile_dpbf16ps(3, 5, 7);
                    }
                }
                _tile_stored(0, c00, sc);
                if (two_n) _tile_stored(1, c00 + 16, sc);
                if (two_m) _tile_stored(2, c10, sc);
                if (two_m && two_n) _tile_stored(3, c10 + 16, sc);
            }
        }
    if (K16 < K2 && M16 > 0) /* the pairs past the tiles (every pair when K2 < 16), added to theirs */
        gemm_dp(M16, N, K2 - K16, a + 2 * K16, lda, b + K16 * ldb2, ldb2, c, ldc, acc || K16 > 0);
    if (M16 < M) /* the rows past the tiles */
        gemm_dp(M - M16, N, K2, a + (ptrdiff_t)M16 * lda, lda, b, ldb2, c + (ptrdiff_t)M16 * ldc, ldc, acc);
}
#endif

/* A task's first and last steps around its products: the tiles'
 * configuration loaded, and released (the OS then saves no tile state). */
static void gemm_begin(gemm_fn g)
{
#ifdef FA_AMX
    if (g == gemm_amx) amx_begin();
#else
    (void)g;
#endif
}

static void gemm_end(gemm_fn g)
{
#ifdef FA_AMX
    if (g == gemm_amx) amx_end();
#else
    (void)g;
#endif
}

/* The product of the units chosen: vdpbf16ps where they allow it and the
 * CPU has it, else the widened one. */
static gemm_fn gemm_for_units(void)
{
#ifdef FA_DPBF16
    const enum loom_bf16_units u = loom_bf16_units();
#ifdef FA_AMX
    if (u == LOOM_BF16_UNITS_AMX && amx_permitted()) return gemm_amx;
#endif
    if ((u == LOOM_BF16_UNITS_AVX512_BF16 || u == LOOM_BF16_UNITS_AMX) &&
        __builtin_cpu_supports("avx512bf16"))
        return gemm_dp;
#endif
    return gemm_wide;
}

const char *loom_flash_attention_bf16_products(void)
{
    const gemm_fn g = gemm_for_units();
#ifdef FA_AMX
    if (g == gemm_amx) return "amx";
#endif
#ifdef FA_DPBF16
    if (g == gemm_dp) return "avx512_bf16";
#endif
    return g == gemm_wide ? "widened" : "?";
}

/* ---- forward ------------------------------------------------------------------- */

/* Sizes of the packed tiles, in uint16: a key tile as b of S = Q K^T
 * ((hs2/2, BK, 2)), a value tile as b of P V ((BK/2, hsp, 2)). */
#define KP_TILE(hs) ((size_t)up2(hs) * FA_BK)
#define VP_TILE(hsp) ((size_t)FA_BK * (hsp))

/* One query tile [i0, i1) (positions: the tile of 64 at i0, from q0 at the
 * part's first); kp, vp: its key/value head's packed tiles from the part's
 * first (kt0 the tiles before it). */
static void fwd_tile(float *out, float *lse, const float *q, const uint16_t *kp, const uint16_t *vp, int kt0,
                     const struct loom_flash_attn *a, float scale, int b, int h, int i0, gemm_fn gemm,
                     char *ws)
{
    float keep[FA_BK] __attribute__((aligned(64))), dmask[FA_BK] __attribute__((aligned(64)));
    const int hs = a->hs, hs2 = up2(hs), hsp = fa_up16(hs);
    const int i1 = fa_min(i0 / FA_BQ * FA_BQ + FA_BQ, fa_qend(a)), m = i1 - i0;
    float *S = (float *)ws, *acc = S + FA_BQ * FA_BK, *mx = acc + (size_t)FA_BQ * hsp, *l = mx + FA_BQ;
    uint16_t *Qa = (uint16_t *)(l + FA_BQ), *Pa = Qa + (size_t)FA_BQ * hs2;
    pack_a(Qa, hs2, q + ((size_t)b * fa_tq(a) + i0 - a->q0) * a->ld_q + (size_t)h * hs, a->ld_q, 1, m, hs);
    gemm_begin(gemm);
    for (int r = 0; r < m; r++) mx[r] = -INFINITY, l[r] = 0.0f;
    memset(acc, 0, (size_t)m * hsp * sizeof(float));
    const int lo_last = fa_key_lo(a, b, i1 - 1), jend = fa_min(i1, fa_kend(a));
    for (int j0 = fa_key_lo(a, b, i0) / FA_BK * FA_BK; j0 < jend; j0 += FA_BK) {
        const int j1 = fa_min(j0 + FA_BK, jend), n = j1 - j0, n16 = fa_up16(n), n2 = up2(n);
        const int kept = fa_tile_kept(a, h, i0, i1, j0, j1);
        if (!kept) continue;
        const int full = kept == 2 && j1 - 1 <= i0 && lo_last <= j0;
        if (full) fa_row_keep(keep, a, b, h, i0, j0, n, n16, 1, 2); /* the same for every row */
        gemm(m, n16, hs2 / 2, Qa, hs2, kp + (size_t)(j0 / FA_BK - kt0) * KP_TILE(hs), 2 * FA_BK, S, FA_BK, 0);
        for (int r = 0; r < m; r++) {
            const int t = i0 + r;
            float *s = S + (size_t)r * FA_BK;
            uint16_t *pa = Pa + (size_t)r * FA_BK;
            if (!full && !fa_row_keep(keep, a, b, h, t, j0, n, n16, full, kept)) {
                memset(pa, 0, (size_t)n16 * sizeof(uint16_t));
                continue;
            }
            const float *dm = fa_drop_row(dmask, a, b, h, t, j0, n16);
            fa_online_row(s, pa, full && n == n16 && !dm ? NULL : keep, dm, n16, scale, &mx[r], &l[r],
                          acc + (size_t)r * hsp, hs);
        }
        gemm(m, hsp, n2 / 2, Pa, FA_BK, vp + (size_t)(j0 / FA_BK - kt0) * VP_TILE(hsp), 2 * hsp, acc, hsp, 1);
    }
    gemm_end(gemm);
    fa_finish_rows(out, lse, acc, hsp, mx, l, a, b, h, i0, m);
}

void loom_flash_attention_forward_bf16(float *out, float *lse, const float *q, const float *k, const float *v,
                                       const struct loom_flash_attn *a)
{
    const float scale = loom_flash_attn_check(a);
    const int nthr = fa_threads(a), R = a->NH / a->G, hs = a->hs;
    const int hsp = fa_up16(hs);
    /* the part's query and key tiles, of 64 positions from 0 (flash_attention.c) */
    const int qt0 = a->q0 / FA_BQ, nqt = (fa_qend(a) - 1) / FA_BQ + 1 - qt0;
    const int kt0 = a->k0 / FA_BK, nkt = (fa_kend(a) - 1) / FA_BK + 1 - kt0;
    const gemm_fn gemm = gemm_for_units();
    const size_t per = ((size_t)FA_BQ * FA_BK + (size_t)FA_BQ * hsp + 2 * FA_BQ) * sizeof(float) +
                       ((size_t)FA_BQ * up2(hs) + (size_t)FA_BQ * FA_BK) * sizeof(uint16_t) + 64;
    const size_t kh = (size_t)nkt * KP_TILE(hs), vh = (size_t)nkt * VP_TILE(hsp), nbg = (size_t)a->B * a->G;
    char *ws = loom_flash_attn_scratch(FA_SCRATCH_FWD_WS, loom_mul_size((size_t)nthr, per));
    uint16_t *kp =
        loom_flash_attn_scratch(FA_SCRATCH_FWD_PACK, loom_mul_size(nbg, (kh + vh) * sizeof(uint16_t)) +
                                                         (size_t)nthr * 2 * FA_BK * hs * sizeof(float) + 64);
    uint16_t *vp = kp + nbg * kh;
    float *eds = (float *)(((uintptr_t)(vp + nbg * vh) + 63) & ~(uintptr_t)63); /* the edge tiles' copies */
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
                pack_b(kp + bg * kh + jt * KP_TILE(hs), FA_BK, kr, 1, ldk, hs, n); /* (d, j) */
                pack_b(vp + bg * vh + jt * VP_TILE(hsp), hsp, vr, ldv, 1, n, hs);  /* (j, d) */
                if (n < FA_BK) /* the keys past the part: zero pairs */
                    memset(vp + bg * vh + jt * VP_TILE(hsp) + (size_t)up2(n) * hsp, 0,
                           (size_t)(FA_BK - up2(n)) * hsp * sizeof(uint16_t));
            }
        const long nbh = (long)a->B * a->NH, ntask = nbh * nqt;
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < ntask; task++) {
            const int it = qt0 + nqt - 1 - (int)(task / nbh), bh = (int)(task % nbh), b = bh / a->NH,
                      h = bh % a->NH;
            const size_t bg = (size_t)b * a->G + h / R;
            fwd_tile(out, lse, q, kp + bg * kh, vp + bg * vh, kt0, a, scale, b, h, fa_max(it * FA_BQ, a->q0),
                     gemm, ws + (size_t)fa_thread_id() * per);
        }
    }
}

/* ---- backward ------------------------------------------------------------------ */

/* One thread's workspace, carved in this order. The backward's products
 * are arranged so that no operand made per tile is transposed: dV and dK
 * are accumulated transposed, dV^T += dO^T P and dK^T += Q^T dS, with
 * dO^T and Q^T packed once per head and P, dS as pairs of rows. */
struct bwd_ws {
    float *S, *dS;      /* (BQ,BK) */
    float *dKt, *dVt;   /* (hs,BK) */
    float *dQ;          /* (T,hsp) */
    float *D;           /* (T) */
    uint16_t *Qa, *dOa; /* a operands (T,hs2) */
    uint16_t *QT, *dOT; /* a operands (hs,T2), transposed */
    uint16_t *Kb, *Vtb; /* b of S and dP: (hs2/2, BK, 2) */
    uint16_t *Kr;       /* b of dQ: (BK/2, hsp, 2) */
    uint32_t *Pi, *dSi; /* b of dV^T and dK^T: (BQ/2, BK) pairs of rows */
    uint16_t *dSa;      /* a of dQ: (BQ, BK) */
};

/* Carves w from base (NULL w: only counts); returns the bytes. */
static size_t bwd_carve(struct bwd_ws *w, char *base, int hs, int T)
{
    const size_t hsp = (size_t)fa_up16(hs), hs2 = (size_t)up2(hs), T2 = (size_t)up2(T);
    size_t off = 0;
#define TAKE(field, n, type)                                                                                 \
    do {                                                                                                     \
        if (w) w->field = (type *)(base + off);                                                              \
        off += (((n) * sizeof(type)) + 63) & ~(size_t)63;                                                    \
    } while (0)
    TAKE(S, (size_t)FA_BQ * FA_BK, float);
    TAKE(dS, (size_t)FA_BQ * FA_BK, float);
    TAKE(dKt, (size_t)hs * FA_BK, float);
    TAKE(dVt, (size_t)hs * FA_BK, float);
    TAKE(dQ, (size_t)T * hsp, float);
    TAKE(D, (size_t)T, float);
    TAKE(Qa, (size_t)T * hs2, uint16_t);
    TAKE(dOa, (size_t)T * hs2, uint16_t);
    TAKE(QT, (size_t)hs * T2, uint16_t);
    TAKE(dOT, (size_t)hs * T2, uint16_t);
    TAKE(Kb, hs2 * FA_BK, uint16_t);
    TAKE(Vtb, hs2 * FA_BK, uint16_t);
    TAKE(Kr, (size_t)FA_BK * hsp, uint16_t);
    TAKE(Pi, (size_t)FA_BQ / 2 * FA_BK, uint32_t);
    TAKE(dSi, (size_t)FA_BQ / 2 * FA_BK, uint32_t);
    TAKE(dSa, (size_t)FA_BQ * FA_BK, uint16_t);
#undef TAKE
    return off;
}

/* One row's probability p and dS entry x at column c of a backward tile:
 * s the raw score, ds dP's entry; lt and Dt the row's log-sum-exp and D. */
#define BWD_PX(s_, ds_, kp_, dm_, lt_, Dt_, p_, x_)                                                          \
    const float e_##p_ = fa_exp2((s_)*scale2 - (lt_)*FA_LOG2E);                                              \
    const float p_ = (kp_) != 0.0f ? e_##p_ : 0.0f;                                                          \
    const float x_ = scale * p_ * ((ds_) * (dm_) - (Dt_))

/* Rows r and r + 1 (present where two) of a backward tile, from their raw
 * scores S and dP (pitch BK) and keeps k0, k1, dropout's masks d0, d1
 * (NULL: none): P (times the mask) and dS rounded to bf16 as pairs of rows
 * into Pi and dSi (an absent row's half 0), and dS's rows into dSa (pitch
 * BK); dP's gradient is the dropped one's times the mask, dV takes the
 * dropped P. */
static inline void bwd_pair(uint32_t *Pi, uint32_t *dSi, uint16_t *dSa, const float *S, const float *dP,
                            const float *k0, const float *k1, const float *d0, const float *d1, float l0,
                            float D0, float l1, float D1, int two, float scale, int n16)
{
    const float scale2 = scale * FA_LOG2E;
    const float *s1 = S + FA_BK, *dp1 = dP + FA_BK;
    uint16_t *dsa1 = dSa + FA_BK;
    if (!two) {
#pragma omp simd
        for (int c = 0; c < n16; c++) {
            const float m0 = d0 ? d0[c] : 1.0f;
            BWD_PX(S[c], dP[c], k0[c], m0, l0, D0, p, x);
            Pi[c] = fa_bf(p * m0);
            const uint16_t xb = fa_bf(x);
            dSi[c] = xb;
            dSa[c] = xb;
        }
    } else if (!d0) {
#pragma omp simd
        for (int c = 0; c < n16; c++) {
            BWD_PX(S[c], dP[c], k0[c], 1.0f, l0, D0, p0, x0);
            BWD_PX(s1[c], dp1[c], k1[c], 1.0f, l1, D1, p1, x1);
            const uint16_t x0b = fa_bf(x0), x1b = fa_bf(x1);
            Pi[c] = (uint32_t)fa_bf(p0) | (uint32_t)fa_bf(p1) << 16;
            dSi[c] = (uint32_t)x0b | (uint32_t)x1b << 16;
            dSa[c] = x0b;
            dsa1[c] = x1b;
        }
    } else {
#pragma omp simd
        for (int c = 0; c < n16; c++) {
            BWD_PX(S[c], dP[c], k0[c], d0[c], l0, D0, p0, x0);
            BWD_PX(s1[c], dp1[c], k1[c], d1[c], l1, D1, p1, x1);
            const uint16_t x0b = fa_bf(x0), x1b = fa_bf(x1);
            Pi[c] = (uint32_t)fa_bf(p0 * d0[c]) | (uint32_t)fa_bf(p1 * d1[c]) << 16;
            dSi[c] = (uint32_t)x0b | (uint32_t)x1b << 16;
            dSa[c] = x0b;
            dsa1[c] = x1b;
        }
    }
}
#undef BWD_PX

static gemm_fn bwd_gemm; /* set by the caller before the heads run */

static void bwd_head(float *dq, float *dk, size_t ldk, float *dv, size_t ldv, const float *dout,
                     const float *out, const float *lse, const float *q, const float *k, const float *v,
                     const struct loom_flash_attn *a, float scale, int b, int h, void *wsv)
{
    float keep[FA_BK] __attribute__((aligned(64))), dmask[FA_BK] __attribute__((aligned(64)));
    /* T: the part's queries; rows of the per-head copies from q0, of dk, dv from k0 */
    const int T = fa_tq(a), q0 = a->q0, k0 = a->k0, qend = fa_qend(a), kend = fa_kend(a), hs = a->hs,
              hsp = fa_up16(hs), hs2 = up2(hs), T2 = up2(T), g = h / (a->NH / a->G);
    const size_t ldo = (size_t)a->NH * hs;
    const gemm_fn gemm = bwd_gemm;
    struct bwd_ws w;
    gemm_begin(gemm);
    bwd_carve(&w, wsv, hs, T);
    const float *qb = q + (size_t)b * T * a->ld_q + (size_t)h * hs;
    const float *kb = k + (size_t)b * fa_tk(a) * a->ld_k + (size_t)g * hs;
    const float *vb = v + (size_t)b * fa_tk(a) * a->ld_v + (size_t)g * hs;
    const float *dob = dout + (size_t)b * T * ldo + (size_t)h * hs;
    const float *ob = out + (size_t)b * T * ldo + (size_t)h * hs;
    const float *lseb = lse + ((size_t)b * a->NH + h) * fa_ld_lse(a);
    for (int t = 0; t < T; t++) {
        const float *o = ob + (size_t)t * ldo, *d_o = dob + (size_t)t * ldo;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int d = 0; d < hs; d++) s += o[d] * d_o[d];
        w.D[t] = s;
    }
    memset(w.dQ, 0, (size_t)T * hsp * sizeof(float));
    pack_a(w.Qa, hs2, qb, a->ld_q, 1, T, hs);
    pack_a(w.dOa, hs2, dob, (ptrdiff_t)ldo, 1, T, hs);
    pack_a(w.QT, T2, qb, 1, a->ld_q, hs, T);
    pack_a(w.dOT, T2, dob, 1, (ptrdiff_t)ldo, hs, T);
    for (int j0 = k0; j0 < kend; j0 += FA_BK) { /* positions */
        const int j1 = fa_min(j0 + FA_BK, kend), n = j1 - j0, n16 = fa_up16(n), n2 = up2(n);
        const int tmax = fa_min(fa_last_query(a, b, j1 - 1), qend - 1);
        const float *kj = kb + (size_t)(j0 - k0) * a->ld_k, *vj = vb + (size_t)(j0 - k0) * a->ld_v;
        pack_b(w.Kb, FA_BK, kj, 1, a->ld_k, hs, n);
        pack_b(w.Vtb, FA_BK, vj, 1, a->ld_v, hs, n);
        pack_b(w.Kr, hsp, kj, a->ld_k, 1, n, hs);
        memset(w.dKt, 0, (size_t)hs * FA_BK * sizeof(float));
        memset(w.dVt, 0, (size_t)hs * FA_BK * sizeof(float));
        /* query tiles from an even row of the part (the transposed copies' pairs) */
        for (int i0 = q0 + ((fa_max(j0, q0) - q0) & ~1); i0 <= tmax; i0 += FA_BQ) {
            const int i1 = fa_min(i0 + FA_BQ, qend), m = i1 - i0, m2 = up2(m), r0 = i0 - q0;
            const int kept = fa_tile_kept(a, h, i0, i1, j0, j1);
            if (!kept) continue;
            const int full = kept == 2 && j1 - 1 <= i0 && fa_key_lo(a, b, i1 - 1) <= j0;
            if (full) fa_row_keep(keep, a, b, h, i0, j0, n, n16, 1, 2); /* the same for every row */
            gemm(m, n16, hs2 / 2, w.Qa + (size_t)r0 * hs2, hs2, w.Kb, 2 * FA_BK, w.S, FA_BK, 0);
            gemm(m, n16, hs2 / 2, w.dOa + (size_t)r0 * hs2, hs2, w.Vtb, 2 * FA_BK, w.dS, FA_BK, 0);
            /* rows in pairs: P (dropped) and dS as the pairs of rows dV^T's and dK^T's products take, dS
             * also row-major for dQ's */
            for (int r = 0; r < m; r += 2) {
                const int two = r + 1 < m;
                float k1[FA_BK] __attribute__((aligned(64))), dm1[FA_BK] __attribute__((aligned(64)));
                if (!full) fa_row_keep(keep, a, b, h, i0 + r, j0, n, n16, 0, kept);
                const float *kp1 = keep;
                if (two && !full) {
                    fa_row_keep(k1, a, b, h, i0 + r + 1, j0, n, n16, 0, kept);
                    kp1 = k1;
                }
                const float *d0 = fa_drop_row(dmask, a, b, h, i0 + r, j0, n16);
                const float *d1 = two ? fa_drop_row(dm1, a, b, h, i0 + r + 1, j0, n16) : NULL;
                bwd_pair(w.Pi + (size_t)r / 2 * FA_BK, w.dSi + (size_t)r / 2 * FA_BK,
                         w.dSa + (size_t)r * FA_BK, w.S + (size_t)r * FA_BK, w.dS + (size_t)r * FA_BK, keep,
                         kp1, d0, d1, lseb[i0 + r - q0], w.D[i0 + r - q0], two ? lseb[i0 + r + 1 - q0] : 0.0f,
                         two ? w.D[i0 + r + 1 - q0] : 0.0f, two, scale, n16);
            }
            /* dV^T += dO^T P, dK^T += Q^T dS (columns r0.. of the transposed; r0 is even) */
            gemm(hs, n16, m2 / 2, w.dOT + r0, T2, (const uint16_t *)w.Pi, 2 * FA_BK, w.dVt, FA_BK, 1);
            gemm(hs, n16, m2 / 2, w.QT + r0, T2, (const uint16_t *)w.dSi, 2 * FA_BK, w.dKt, FA_BK, 1);
            gemm(m, hsp, n2 / 2, w.dSa, FA_BK, w.Kr, 2 * hsp, w.dQ + (size_t)r0 * hsp, hsp,
                 1); /* dQ += dS K */
        }
        for (int d = 0; d < hs; d++) {
            const float *kt = w.dKt + (size_t)d * FA_BK, *vt = w.dVt + (size_t)d * FA_BK;
            for (int j = 0; j < n; j++) {
                dk[(size_t)(j0 - k0 + j) * ldk + d] = kt[j];
                dv[(size_t)(j0 - k0 + j) * ldv + d] = vt[j];
            }
        }
    }
    float *dqb = dq + (size_t)b * T * a->ld_q + (size_t)h * hs;
    for (int t = 0; t < T; t++)
        memcpy(dqb + (size_t)t * a->ld_q, w.dQ + (size_t)t * hsp, (size_t)hs * sizeof(float));
    gemm_end(gemm);
}

void loom_flash_attention_backward_bf16(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                        const float *lse, const float *q, const float *k, const float *v,
                                        const struct loom_flash_attn *a)
{
    bwd_gemm = gemm_for_units();
    loom_flash_attn_backward_heads(bwd_head, bwd_carve(NULL, NULL, a->hs, fa_tq(a)), dq, dk, dv, dout, out,
                                   lse, q, k, v, a);
}
