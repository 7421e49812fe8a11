/*
 * Unit test of block-sparse attention: the layouts of
 * kernels/sparse_layout.h and the kernels of kernels.h ("block-sparse causal
 * attention").
 *   - layouts: each mode's block mask against hand-worked small examples
 *     (rows written as strings of 0/1 blocks), random blocks deterministic
 *     in the seed and different per head, the token rule of
 *     loom_sparse_allowed against the mask, every block holding an allowed
 *     pair, sizes and the dense flag;
 *   - the kernels against the masked dense `_ref` (out, att expanded from its
 *     panels, dqkv; 1e-5 of the tensor's scale) in every mode, per-head
 *     layouts, odd B, NH 1..4, HS 8..32, block 16 and 32, h0 > 0;
 *   - a tensor-parallel slice of heads against the whole, bit for bit;
 *   - the `_ref` backward (and the fast one) against central finite
 *     differences at small shapes;
 *   - a layout allowing every causal pair (dense mode, window >= T) gives
 *     the table's attention_forward/backward's bits;
 *   - every bad setting is LOOM_ERR_INPUT with one line naming it.
 * Deliberately not: timing (tests/tools/attn_bench.c) or PyTorch.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "check.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"
#include "kernels/sparse_layout.h"

/* The table of the backend under test: the fast kernels are called through
 * it, as the models call them; the `_ref` ones directly. */
static const struct loom_kernels *K;

/* ---- inputs and checks ---------------------------------------------------------- */

static void build_ok(const struct loom_sparse_config *cfg, int NH, int T, struct loom_sparse_layout *l)
{
    const int rc = loom_sparse_layout_build(cfg, NH, T, l);
    if (rc) fprintf(stderr, "  build: %s\n", loom_error_message());
    CHECK(rc == LOOM_OK);
}

static int mask_at(const struct loom_sparse_layout *l, int h, int r, int c)
{
    const int g = l->heads == 1 ? 0 : h;
    return l->mask[((size_t)g * l->nb + r) * l->nb + c];
}

/* Head h's mask against rows: nb strings of nb '0'/'1', space-separated. */
static void expect_rows(const char *name, const struct loom_sparse_layout *l, int h, const char *rows)
{
    char got[1024];
    size_t n = 0;
    for (int r = 0; r < l->nb; r++) {
        for (int c = 0; c < l->nb; c++) got[n++] = mask_at(l, h, r, c) ? '1' : '0';
        got[n++] = r + 1 < l->nb ? ' ' : 0;
    }
    if (strcmp(got, rows)) fprintf(stderr, "  %s head %d:\n    got  %s\n    want %s\n", name, h, got, rows);
    CHECK(strcmp(got, rows) == 0);
}

/* The lists the kernels walk agree with the mask; every block holds an
 * allowed pair; allowed() is the mask and the token rule. */
static void check_consistent(const struct loom_sparse_layout *l)
{
    const int bs = l->block, nb = l->nb, T = l->T;
    int lists_ok = 1, allowed_ok = 1, useful_ok = 1;
    int64_t sum = 0;
    for (int h = 0; h < l->NH; h++) {
        const int g = l->heads == 1 ? 0 : h;
        const int64_t *rp = l->row_ptr + (size_t)g * (nb + 1);
        const int32_t *col = l->col + l->head_off[g];
        for (int r = 0; r < nb; r++) {
            int p = (int)rp[r];
            for (int c = 0; c < nb; c++)
                if (mask_at(l, h, r, c) && (p >= rp[r + 1] || col[p++] != c)) lists_ok = 0;
            if (p != rp[r + 1]) lists_ok = 0;
        }
        sum += loom_sparse_head_blocks(l, h);
        for (int i = 0; i < T; i++)
            for (int j = 0; j < T; j++) {
                int want = mask_at(l, h, i / bs, j / bs) && (!l->unidirectional || j <= i);
                if (l->window) want = want && j > i - l->window && (l->unidirectional || j < i + l->window);
                if (loom_sparse_allowed(l, h, i, j) != want) allowed_ok = 0;
            }
        for (int r = 0; r < nb; r++)
            for (int c = 0; c < nb; c++) {
                if (!mask_at(l, h, r, c)) continue;
                int any = 0;
                for (int i = r * bs; i < r * bs + bs && !any; i++)
                    for (int j = c * bs; j < c * bs + bs && !any; j++) any = loom_sparse_allowed(l, h, i, j);
                if (!any) useful_ok = 0;
            }
    }
    CHECK(lists_ok);
    CHECK(allowed_ok);
    CHECK(useful_ok);
    CHECK(sum == l->nnz);
}

/* ---- layouts: hand-worked examples -------------------------------------------- */

/* Builds cfg (NH heads, T), checks head h's mask and the layout's
 * consistency, and leaves the layout in l. */
static void layout_is(struct loom_sparse_layout *l, const char *name, const struct loom_sparse_config *cfg,
                      int NH, int T, int h, const char *rows)
{
    build_ok(cfg, NH, T, l);
    expect_rows(name, l, h, rows);
    check_consistent(l);
}

#define FIXED_UNI "10000000 11000000 11100000 11110000 00011000 00011100 00011110 00011111"

static void test_layout_fixed(void)
{
    struct loom_sparse_config cfg;
    struct loom_sparse_layout l;
    /* block 16, 4 local, 1 global: windows [0,4) and [4,8), the global block
     * of each its last (3, 7) */
    loom_sparse_config_default(&cfg, LOOM_SPARSE_FIXED);
    layout_is(&l, "fixed", &cfg, 2, 8 * 16, 1, FIXED_UNI);
    CHECK(l.heads == 1 && l.nnz == 2 * 24 && !l.dense);
    CHECK(loom_sparse_att_numel(&l, 3, 2, 0) == (size_t)3 * 2 * 24 * 16 * 16);
    loom_sparse_layout_free(&l);
    cfg.unidirectional = 0;
    layout_is(&l, "fixed bidirectional", &cfg, 1, 8 * 16, 0,
              "11110001 11110001 11110001 11110001 00011111 00011111 00011111 00011111");
    CHECK(l.nnz == 40);
    loom_sparse_layout_free(&l);

    /* head h takes pattern h % 2: head 1's globals are the blocks before the last */
    loom_sparse_config_default(&cfg, LOOM_SPARSE_FIXED);
    cfg.different_layout_per_head = 1, cfg.num_different_global_patterns = 2;
    layout_is(&l, "fixed head 1", &cfg, 3, 8 * 16, 1,
              "10000000 11000000 11100000 11110000 00101000 00101100 00101110 00101111");
    expect_rows("fixed head 0", &l, 0, FIXED_UNI);
    expect_rows("fixed head 2", &l, 2, FIXED_UNI);
    CHECK(l.heads == 3 && loom_sparse_head_blocks(&l, 1) == 24);
    loom_sparse_layout_free(&l);

    /* a short last window [4,6): its global block moves in to block 5 */
    loom_sparse_config_default(&cfg, LOOM_SPARSE_FIXED);
    layout_is(&l, "fixed short window", &cfg, 1, 6 * 16, 0, "100000 110000 111000 111100 000110 000111");
    loom_sparse_layout_free(&l);
    /* two global blocks (2, 3): block (2, 3) is above the diagonal, dropped */
    cfg.num_global_blocks = 2;
    layout_is(&l, "fixed 2 globals", &cfg, 1, 8 * 16, 0,
              "10000000 11000000 11100000 11110000 00111000 00111100 00111110 00111111");
    loom_sparse_layout_free(&l);
    /* one local window over everything: every causal pair, the dense kernels */
    cfg.num_local_blocks = 8, cfg.num_global_blocks = 1;
    build_ok(&cfg, 2, 8 * 16, &l);
    CHECK(l.dense && loom_sparse_att_numel(&l, 3, 2, 0) == (size_t)3 * 2 * 128 * 128);
    loom_sparse_layout_free(&l);
}

static void test_layout_bigbird_bslongformer(void)
{
    struct loom_sparse_config cfg;
    struct loom_sparse_layout l;
    const char *bb = "100000 110000 111000 101100 100110 100011";
    loom_sparse_config_default(&cfg, LOOM_SPARSE_BIGBIRD);
    cfg.num_random_blocks = 0; /* window 3 (one block each side), block 0 global */
    layout_is(&l, "bigbird", &cfg, 1, 6 * 16, 0, bb);
    CHECK(l.nnz == 15);
    loom_sparse_layout_free(&l);
    loom_sparse_config_default(&cfg, LOOM_SPARSE_BSLONGFORMER); /* the same by default */
    layout_is(&l, "bslongformer", &cfg, 1, 6 * 16, 0, bb);
    loom_sparse_layout_free(&l);
    /* global range [2, 4), the window the diagonal alone */
    cfg.num_sliding_window_blocks = 1;
    cfg.global_block_indices[0] = 2, cfg.global_block_end_indices[0] = 4, cfg.n_global_block_end_indices = 1;
    layout_is(&l, "bslongformer range", &cfg, 1, 6 * 16, 0, "100000 010000 111000 111100 001110 001101");
    loom_sparse_layout_free(&l);
    loom_sparse_config_default(&cfg, LOOM_SPARSE_BSLONGFORMER);
    cfg.num_sliding_window_blocks = 1, cfg.global_block_indices[0] = 1, cfg.unidirectional = 0;
    layout_is(&l, "bslongformer bidirectional", &cfg, 1, 4 * 16, 0, "1100 1111 0110 0101");
    loom_sparse_layout_free(&l);

    /* random blocks: up to the diagonal, min(2, r + 1) of them, from the seed */
    loom_sparse_config_default(&cfg, LOOM_SPARSE_BIGBIRD);
    cfg.num_random_blocks = 2, cfg.num_sliding_window_blocks = 1, cfg.num_global_blocks = 0;
    cfg.different_layout_per_head = 1, cfg.seed = 7;
    struct loom_sparse_layout l2, l3;
    build_ok(&cfg, 4, 32 * 16, &l);
    build_ok(&cfg, 4, 32 * 16, &l2);
    cfg.seed = 8;
    build_ok(&cfg, 4, 32 * 16, &l3);
    const size_t n = (size_t)4 * 32 * 32;
    CHECK(memcmp(l.mask, l2.mask, n) == 0);
    CHECK(memcmp(l.mask, l3.mask, n) != 0);
    CHECK(memcmp(l.mask, l.mask + 32 * 32, 32 * 32) != 0); /* heads 0 and 1 differ */
    int counts_ok = 1;
    for (int h = 0; h < 4; h++)
        for (int r = 0; r < 32; r++) {
            int cnt = 0;
            for (int c = 0; c < 32; c++) cnt += mask_at(&l, h, r, c);
            const int k = r + 1 < 2 ? r + 1 : 2;
            if (cnt < k || cnt > k + 1 || !mask_at(&l, h, r, r)) counts_ok = 0;
        }
    CHECK(counts_ok);
    check_consistent(&l);
    loom_sparse_layout_free(&l), loom_sparse_layout_free(&l2), loom_sparse_layout_free(&l3);
}

static void test_layout_variable_window_dense(void)
{
    struct loom_sparse_config cfg;
    struct loom_sparse_layout l;
    /* windows [0,2), [2,5), [5,8) (the last size repeated); block 0 global */
    loom_sparse_config_default(&cfg, LOOM_SPARSE_VARIABLE);
    cfg.local_window_blocks[0] = 2, cfg.local_window_blocks[1] = 3, cfg.n_local_window_blocks = 2;
    layout_is(&l, "variable", &cfg, 1, 8 * 16, 0,
              "10000000 11000000 10100000 10110000 10111000 10000100 10000110 10000111");
    loom_sparse_layout_free(&l);
    loom_sparse_config_default(&cfg, LOOM_SPARSE_VARIABLE);
    cfg.unidirectional = 0, cfg.horizontal_global_attention = 1, cfg.global_block_indices[0] = 1;
    layout_is(&l, "variable bidirectional", &cfg, 1, 8 * 16, 0,
              "11110000 11111111 11110000 11110000 01001111 01001111 01001111 01001111");
    loom_sparse_layout_free(&l);

    loom_sparse_config_default(&cfg, LOOM_SPARSE_WINDOW);
    cfg.window = 20; /* row block 2 (queries 32..47) reaches back to key 13 */
    layout_is(&l, "window", &cfg, 1, 64, 0, "1000 1100 1110 0111");
    CHECK(!loom_sparse_allowed(&l, 0, 47, 27) && loom_sparse_allowed(&l, 0, 47, 28));
    CHECK(loom_sparse_allowed(&l, 0, 47, 47) && !loom_sparse_allowed(&l, 0, 47, 48));
    CHECK(loom_sparse_allowed(&l, 0, 32, 13) && !loom_sparse_allowed(&l, 0, 32, 12));
    CHECK(!l.dense);
    loom_sparse_layout_free(&l);
    cfg.unidirectional = 0;
    layout_is(&l, "window bidirectional", &cfg, 1, 64, 0, "1110 1111 1111 0111");
    CHECK(loom_sparse_allowed(&l, 0, 10, 29) && !loom_sparse_allowed(&l, 0, 10, 30));
    loom_sparse_layout_free(&l);
    cfg.unidirectional = 1, cfg.window = 63; /* one short of T: not every pair */
    build_ok(&cfg, 1, 64, &l);
    CHECK(!l.dense);
    loom_sparse_layout_free(&l);
    cfg.window = 64;
    build_ok(&cfg, 1, 64, &l);
    CHECK(l.dense);
    loom_sparse_layout_free(&l);

    loom_sparse_config_default(&cfg, LOOM_SPARSE_DENSE);
    build_ok(&cfg, 1, 64, &l);
    CHECK(l.dense && l.nnz == 10);
    loom_sparse_layout_free(&l);
    cfg.unidirectional = 0;
    build_ok(&cfg, 1, 64, &l);
    CHECK(!l.dense && l.nnz == 16);
    loom_sparse_layout_free(&l);
}

/* ---- the kernels against the masked dense reference ----------------------------- */

/* att's panels written out as the dense (B,NH,T,T), zero elsewhere. */
static void expand_att(float *dense, const float *att, const struct loom_sparse_layout *l, int B, int NH,
                       int h0)
{
    const int bs = l->block, nb = l->nb, T = l->T;
    memset(dense, 0, (size_t)B * NH * T * T * sizeof(float));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const int g = l->heads == 1 ? 0 : h0 + h;
            const int64_t *rp = l->row_ptr + (size_t)g * (nb + 1);
            const int32_t *col = l->col + l->head_off[g];
            float *d = dense + ((size_t)b * NH + h) * T * T;
            for (int r = 0; r < nb; r++) {
                const int width = (int)(rp[r + 1] - rp[r]) * bs;
                for (int p = (int)rp[r]; p < rp[r + 1]; p++)
                    for (int i = 0; i < bs; i++)
                        for (int t = 0; t < bs; t++)
                            d[(size_t)(r * bs + i) * T + col[p] * bs + t] =
                                att[(size_t)rp[r] * bs * bs + (size_t)i * width + (p - rp[r]) * bs + t];
            }
            att += (size_t)loom_sparse_head_blocks(l, h0 + h) * bs * bs;
        }
}

static void test_vs_ref(const char *what, const struct loom_sparse_config *cfg, int B, int T, int NHall,
                        int h0, int NH, int HS)
{
    struct loom_sparse_layout l;
    build_ok(cfg, NHall, T, &l);
    const int C = NH * HS;
    const size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, ndense = (size_t)B * NH * T * T;
    const size_t natt = loom_sparse_att_numel(&l, B, NH, h0);
    float *qkv = check_rand(nqkv, 2.0f), *dout = check_rand(nout, 1.0f);
    float *out = check_const(nout, NAN), *out_ref = check_const(nout, NAN);
    float *att = check_const(natt, NAN), *att_ref = check_const(ndense, NAN),
          *att_x = check_const(ndense, NAN);
    float *dqkv = check_const(nqkv, NAN), *dqkv_ref = check_const(nqkv, NAN);
    float *datt = check_const(natt, NAN), *datt_ref = check_const(ndense, NAN);
    K->sparse_attention_forward(out, att, qkv, B, T, C, NH, h0, &l);
    loom_sparse_attention_forward_ref(out_ref, att_ref, qkv, B, T, C, NH, h0, &l);
    char name[160];
    /* float32 sums of up to T <= 256 keys (and HS channels) against the
     * reference's double sums: a sequential order errs by about u sqrt(T)
     * of the scale, 4 u sqrt(256) = 3.8e-6 with a 4x margin (see
     * tests/test_kernels.c, sum_tol), under 1e-5; measured at most 6.8e-7
     * (fixed bidirectional att, T = 192), at 1 and 2 threads and under
     * OPENBLAS_CORETYPE Prescott and SkylakeX. */
    snprintf(name, sizeof name, "%s out (B=%d T=%d NH=%d h0=%d HS=%d)", what, B, T, NH, h0, HS);
    check_scaled(name, out, out_ref, nout, 1e-5);
    if (l.dense)
        memcpy(att_x, att, ndense * sizeof(float));
    else
        expand_att(att_x, att, &l, B, NH, h0);
    snprintf(name, sizeof name, "%s att (B=%d T=%d NH=%d h0=%d HS=%d)", what, B, T, NH, h0, HS);
    check_scaled(name, att_x, att_ref, ndense, 1e-5);
    K->sparse_attention_backward(dqkv, datt, dout, att, qkv, B, T, C, NH, h0, &l);
    loom_sparse_attention_backward_ref(dqkv_ref, datt_ref, dout, att_ref, qkv, B, T, C, NH, h0, &l);
    snprintf(name, sizeof name, "%s dqkv (B=%d T=%d NH=%d h0=%d HS=%d)", what, B, T, NH, h0, HS);
    check_scaled(name, dqkv, dqkv_ref, nqkv, 1e-5);
    free(qkv), free(dout), free(out), free(out_ref), free(att), free(att_ref), free(att_x);
    free(dqkv), free(dqkv_ref), free(datt), free(datt_ref);
    loom_sparse_layout_free(&l);
}

static void test_modes_vs_ref(void)
{
    struct loom_sparse_config c;
    loom_sparse_config_default(&c, LOOM_SPARSE_FIXED);
    test_vs_ref("fixed", &c, 3, 128, 2, 0, 2, 8);
    c.different_layout_per_head = 1, c.num_different_global_patterns = 4;
    test_vs_ref("fixed per head", &c, 1, 128, 4, 1, 3, 16);
    loom_sparse_config_default(&c, LOOM_SPARSE_FIXED);
    c.unidirectional = 0, c.horizontal_global_attention = 1, c.block = 32, c.num_local_blocks = 2;
    test_vs_ref("fixed bidirectional", &c, 1, 192, 1, 0, 1, 32);

    loom_sparse_config_default(&c, LOOM_SPARSE_BIGBIRD);
    c.num_random_blocks = 2, c.block = 32, c.different_layout_per_head = 1, c.seed = 3;
    test_vs_ref("bigbird per head", &c, 1, 256, 3, 1, 2, 16);
    c.unidirectional = 0, c.different_layout_per_head = 0;
    test_vs_ref("bigbird bidirectional", &c, 3, 128, 1, 0, 1, 8);

    loom_sparse_config_default(&c, LOOM_SPARSE_BSLONGFORMER);
    c.global_block_indices[1] = 5, c.n_global_block_indices = 2;
    test_vs_ref("bslongformer", &c, 3, 160, 4, 0, 4, 8);
    c.global_block_indices[0] = 1, c.global_block_end_indices[0] = 3;
    c.global_block_indices[1] = 9, c.global_block_end_indices[1] = 12, c.n_global_block_end_indices = 2;
    c.block = 32, c.num_sliding_window_blocks = 1;
    test_vs_ref("bslongformer ranges", &c, 1, 128, 2, 1, 1, 24);

    loom_sparse_config_default(&c, LOOM_SPARSE_VARIABLE);
    c.local_window_blocks[0] = 2, c.local_window_blocks[1] = 3, c.n_local_window_blocks = 2;
    c.num_random_blocks = 1, c.different_layout_per_head = 1, c.seed = 11;
    test_vs_ref("variable per head", &c, 1, 128, 5, 2, 3, 24);

    loom_sparse_config_default(&c, LOOM_SPARSE_WINDOW);
    c.window = 40;
    test_vs_ref("window 40", &c, 3, 128, 2, 0, 2, 8);
    c.window = 16;
    test_vs_ref("window 16", &c, 1, 64, 1, 0, 1, 16);
    c.window = 100, c.block = 32;
    test_vs_ref("window 100", &c, 1, 256, 4, 0, 4, 32);
    c.window = 20, c.block = 16, c.unidirectional = 0;
    test_vs_ref("window bidirectional", &c, 3, 64, 2, 0, 2, 8);

    loom_sparse_config_default(&c, LOOM_SPARSE_DENSE);
    c.unidirectional = 0;
    test_vs_ref("dense bidirectional", &c, 1, 64, 1, 0, 1, 8);
    c.unidirectional = 1;
    test_vs_ref("dense", &c, 3, 64, 2, 0, 2, 8);
}

/* Heads [1, 3) of 4 on their own (a tensor-parallel rank's slice) give the
 * whole layer's numbers for those heads, bit for bit. */
static void test_head_slice(void)
{
    struct loom_sparse_config c;
    loom_sparse_config_default(&c, LOOM_SPARSE_BIGBIRD);
    c.num_random_blocks = 2, c.different_layout_per_head = 1, c.seed = 5;
    struct loom_sparse_layout l;
    const int B = 3, T = 128, NHall = 4, HS = 8, h0 = 1, NH = 2, Call = NHall * HS, C = NH * HS;
    build_ok(&c, NHall, T, &l);
    float *qkv = check_rand((size_t)B * T * 3 * Call, 2.0f), *dout = check_rand((size_t)B * T * Call, 1.0f);
    float *out = check_const((size_t)B * T * Call, NAN), *dqkv = check_const((size_t)B * T * 3 * Call, NAN);
    float *att = check_const(loom_sparse_att_numel(&l, B, NHall, 0), NAN);
    float *datt = check_const(loom_sparse_att_numel(&l, B, NHall, 0), NAN);
    K->sparse_attention_forward(out, att, qkv, B, T, Call, NHall, 0, &l);
    K->sparse_attention_backward(dqkv, datt, dout, att, qkv, B, T, Call, NHall, 0, &l);

    float *qkv_s = malloc((size_t)B * T * 3 * C * sizeof(float)),
          *dout_s = malloc((size_t)B * T * C * sizeof(float));
    for (size_t n = 0; n < (size_t)B * T; n++) {
        for (int part = 0; part < 3; part++)
            memcpy(qkv_s + n * 3 * C + part * C, qkv + n * 3 * Call + part * Call + h0 * HS,
                   C * sizeof(float));
        memcpy(dout_s + n * C, dout + n * Call + h0 * HS, C * sizeof(float));
    }
    float *out_s = check_const((size_t)B * T * C, NAN), *dqkv_s = check_const((size_t)B * T * 3 * C, NAN);
    float *att_s = check_const(loom_sparse_att_numel(&l, B, NH, h0), NAN);
    float *datt_s = check_const(loom_sparse_att_numel(&l, B, NH, h0), NAN);
    K->sparse_attention_forward(out_s, att_s, qkv_s, B, T, C, NH, h0, &l);
    K->sparse_attention_backward(dqkv_s, datt_s, dout_s, att_s, qkv_s, B, T, C, NH, h0, &l);
    int out_same = 1, dqkv_same = 1;
    for (size_t n = 0; n < (size_t)B * T; n++) {
        if (memcmp(out_s + n * C, out + n * Call + h0 * HS, C * sizeof(float))) out_same = 0;
        for (int part = 0; part < 3; part++)
            if (memcmp(dqkv_s + n * 3 * C + part * C, dqkv + n * 3 * Call + part * Call + h0 * HS,
                       C * sizeof(float)))
                dqkv_same = 0;
    }
    CHECK(out_same);
    CHECK(dqkv_same);
    free(qkv), free(dout), free(out), free(dqkv), free(att), free(datt), free(qkv_s), free(dout_s);
    free(out_s), free(dqkv_s), free(att_s), free(datt_s);
    loom_sparse_layout_free(&l);
}

/* A layout allowing every causal pair is the dense kernels, bit for bit. */
static void test_dense_bits(const struct loom_sparse_config *cfg, int B, int T, int NH, int HS)
{
    struct loom_sparse_layout l;
    build_ok(cfg, NH, T, &l);
    CHECK(l.dense);
    const int C = NH * HS;
    const size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
    CHECK(loom_sparse_att_numel(&l, B, NH, 0) == natt);
    float *qkv = check_rand(nqkv, 2.0f), *dout = check_rand(nout, 1.0f);
    float *out[2], *att[2], *dqkv[2], *datt[2];
    for (int k = 0; k < 2; k++) {
        out[k] = check_const(nout, NAN), att[k] = check_const(natt, NAN);
        dqkv[k] = check_const(nqkv, NAN), datt[k] = check_const(natt, NAN);
    }
    K->sparse_attention_forward(out[0], att[0], qkv, B, T, C, NH, 0, &l);
    K->sparse_attention_backward(dqkv[0], datt[0], dout, att[0], qkv, B, T, C, NH, 0, &l);
    K->attention_forward(out[1], att[1], qkv, B, T, C, NH);
    K->attention_backward(dqkv[1], datt[1], dout, att[1], qkv, B, T, C, NH);
    CHECK(memcmp(out[0], out[1], nout * sizeof(float)) == 0);
    CHECK(memcmp(att[0], att[1], natt * sizeof(float)) == 0);
    CHECK(memcmp(dqkv[0], dqkv[1], nqkv * sizeof(float)) == 0);
    for (int k = 0; k < 2; k++) free(out[k]), free(att[k]), free(dqkv[k]), free(datt[k]);
    free(qkv), free(dout);
    loom_sparse_layout_free(&l);
}

/* ---- finite differences ----------------------------------------------------------- */

struct fd_ctx {
    const struct loom_sparse_layout *l;
    float *qkv, *out, *att, *w;
    int B, T, C, NH, h0;
};

static double fd_obj(struct fd_ctx *c)
{
    loom_sparse_attention_forward_ref(c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH, c->h0, c->l);
    double s = 0.0;
    for (size_t i = 0; i < (size_t)c->B * c->T * c->C; i++) s += (double)c->out[i] * c->w[i];
    return s;
}

/* The reference backward and the fast one against Richardson-extrapolated
 * central differences (steps 2^-6, 2^-7) of sum(out * w); tolerance 2e-4 of
 * the gradient's max, as tests/test_kernels.c. */
static void test_fd(const char *what, const struct loom_sparse_config *cfg, int NHall, int h0)
{
    struct loom_sparse_layout l;
    const int B = 2, T = 8, NH = 2, HS = 4, C = NH * HS;
    build_ok(cfg, NHall, T, &l);
    const size_t nqkv = (size_t)B * T * 3 * C, ndense = (size_t)B * NH * T * T;
    const size_t natt = loom_sparse_att_numel(&l, B, NH, h0);
    struct fd_ctx c = {&l,
                       check_rand(nqkv, 1.0f),
                       check_const((size_t)B * T * C, 0.0f),
                       check_const(ndense, 0.0f),
                       check_rand((size_t)B * T * C, 1.0f),
                       B,
                       T,
                       C,
                       NH,
                       h0};
    fd_obj(&c);
    float *dqkv_ref = check_const(nqkv, NAN), *datt_ref = check_const(ndense, NAN);
    loom_sparse_attention_backward_ref(dqkv_ref, datt_ref, c.w, c.att, c.qkv, B, T, C, NH, h0, &l);
    float *out = check_const((size_t)B * T * C, NAN), *att = check_const(natt, NAN),
          *datt = check_const(natt, NAN);
    float *dqkv = check_const(nqkv, NAN);
    K->sparse_attention_forward(out, att, c.qkv, B, T, C, NH, h0, &l);
    K->sparse_attention_backward(dqkv, datt, c.w, att, c.qkv, B, T, C, NH, h0, &l);
    float *fd = malloc(nqkv * sizeof(float));
    for (size_t i = 0; i < nqkv; i++) {
        const float x0 = c.qkv[i];
        double d[2];
        for (int k = 0; k < 2; k++) {
            const float h = k == 0 ? 0x1p-6f : 0x1p-7f;
            c.qkv[i] = x0 + h;
            const double fp = fd_obj(&c);
            c.qkv[i] = x0 - h;
            d[k] = (fp - fd_obj(&c)) / (2.0 * h);
        }
        c.qkv[i] = x0;
        fd[i] = (float)((4.0 * d[1] - d[0]) / 3.0);
    }
    char name[128];
    /* as tests/test_kernels.c's FD_TOL: truncation O(h^4), rounding noise
     * ~1e-5 of the gradient's scale; measured at most 8.9e-6 (bigbird) */
    snprintf(name, sizeof name, "%s ref dqkv vs fd", what);
    check_scaled(name, dqkv_ref, fd, nqkv, 2e-4);
    snprintf(name, sizeof name, "%s dqkv vs fd", what);
    check_scaled(name, dqkv, fd, nqkv, 2e-4);
    free(c.qkv), free(c.out), free(c.att), free(c.w), free(dqkv_ref), free(datt_ref), free(out), free(att);
    free(datt), free(dqkv), free(fd);
    loom_sparse_layout_free(&l);
}

/* ---- bad settings ------------------------------------------------------------------ */

static void expect_bad(const struct loom_sparse_config *cfg, int NH, int T, const char *names)
{
    struct loom_sparse_layout l;
    loom_error_clear();
    const int rc = loom_sparse_layout_build(cfg, NH, T, &l);
    const char *msg = loom_error_message();
    const int ok = rc == LOOM_ERR_INPUT && msg && strstr(msg, names) && !strchr(msg, '\n') && !l.mask;
    if (!ok) fprintf(stderr, "  expected an error naming '%s', got %d: %s\n", names, rc, msg ? msg : "");
    CHECK(ok);
    loom_sparse_layout_free(&l);
}

static void test_bad_settings(void)
{
    struct loom_sparse_config c;
    const enum loom_sparse_mode F = LOOM_SPARSE_FIXED, BB = LOOM_SPARSE_BIGBIRD, L = LOOM_SPARSE_BSLONGFORMER;
    const enum loom_sparse_mode V = LOOM_SPARSE_VARIABLE, W = LOOM_SPARSE_WINDOW;
#define BAD_CASE(mode, edit, NH, T, names)                                                                   \
    do {                                                                                                     \
        loom_sparse_config_default(&c, mode);                                                                \
        edit;                                                                                                \
        expect_bad(&c, NH, T, names);                                                                        \
    } while (0)
    BAD_CASE(F, (void)0, 2, 100, "multiple of block");
    BAD_CASE(F, c.block = 0, 2, 64, "block");
    BAD_CASE(F, c.mode = (enum loom_sparse_mode)99, 2, 64, "mode");
    BAD_CASE(F, (void)0, 0, 64, "heads");
    BAD_CASE(W, c.window = 0, 2, 64, "window");
    BAD_CASE(F, c.num_local_blocks = -1, 2, 64, "num_local_blocks");
    BAD_CASE(F, c.num_global_blocks = 3, 2, 64, "num_global_blocks");
    BAD_CASE(F, c.horizontal_global_attention = 1, 2, 64, "horizontal_global_attention");
    BAD_CASE(F, c.num_different_global_patterns = 2, 2, 64, "different_layout_per_head");
    BAD_CASE(F, (c.num_different_global_patterns = 5, c.different_layout_per_head = 1), 2, 64,
             "num_different_global_patterns");
    BAD_CASE(F, (c.num_local_blocks = 8, c.num_global_blocks = 8), 2, 64, "num_global_blocks");
    BAD_CASE(BB, c.num_random_blocks = -1, 2, 64, "num_random_blocks");
    BAD_CASE(BB, c.num_random_blocks = 5, 2, 64, "num_random_blocks");
    BAD_CASE(BB, c.num_sliding_window_blocks = 5, 2, 64, "num_sliding_window_blocks");
    BAD_CASE(BB, c.num_global_blocks = 5, 2, 64, "num_global_blocks");
    BAD_CASE(L, c.num_sliding_window_blocks = -3, 2, 64, "num_sliding_window_blocks");
    BAD_CASE(L, c.n_global_block_indices = 17, 2, 64, "n_global_block_indices");
    BAD_CASE(L, c.n_global_block_end_indices = 2, 2, 64, "global_block_end_indices");
    BAD_CASE(L, (c.global_block_end_indices[0] = 0, c.n_global_block_end_indices = 1), 2, 64,
             "global_block_end_indices");
    BAD_CASE(L, c.global_block_indices[0] = -1, 2, 64, "global_block_indices");
    BAD_CASE(V, c.n_local_window_blocks = 17, 2, 64, "n_local_window_blocks");
    BAD_CASE(V, c.n_local_window_blocks = 0, 2, 64, "n_local_window_blocks");
    BAD_CASE(V, c.local_window_blocks[0] = 0, 2, 64, "local_window_blocks");
    BAD_CASE(V, c.horizontal_global_attention = 1, 2, 64, "horizontal_global_attention");
    BAD_CASE(V, c.num_random_blocks = 5, 2, 64, "num_random_blocks");
    BAD_CASE(W, c.horizontal_global_attention = 1, 2, 64, "horizontal_global_attention");
#undef BAD_CASE

    enum loom_sparse_mode m;
    for (int k = 0; k < LOOM_SPARSE_MODE_COUNT; k++)
        CHECK(loom_sparse_mode_parse(loom_sparse_mode_name((enum loom_sparse_mode)k), &m) == LOOM_OK &&
              (int)m == k);
    CHECK(loom_sparse_mode_name(LOOM_SPARSE_MODE_COUNT) == NULL);
    loom_error_clear();
    CHECK(loom_sparse_mode_parse("strided", &m) == LOOM_ERR_INPUT &&
          strstr(loom_error_message(), "strided") && !strchr(loom_error_message(), '\n'));
    loom_error_clear();
}

int main(void)
{
    *check_rng() = 0x2545f4914f6cdd1dull;
    test_layout_fixed();
    test_layout_bigbird_bslongformer();
    test_layout_variable_window_dense();
    for (int i = 0; i < loom_backend_count(); i++) {
        K = loom_backend_at(i)->k;
        printf("backend %s\n", loom_backend_at(i)->name);
        test_modes_vs_ref();
        test_head_slice();

        struct loom_sparse_config c;
        loom_sparse_config_default(&c, LOOM_SPARSE_WINDOW);
        c.window = 128;
        test_dense_bits(&c, 3, 128, 2, 16); /* window = T */
        c.window = 1000, c.block = 32;
        test_dense_bits(&c, 1, 160, 3, 8); /* window > T; T over two of the dense kernel's row blocks */
        loom_sparse_config_default(&c, LOOM_SPARSE_DENSE);
        test_dense_bits(&c, 1, 64, 1, 32);

        loom_sparse_config_default(&c, LOOM_SPARSE_WINDOW);
        c.block = 2, c.window = 3;
        test_fd("window", &c, 2, 0);
        loom_sparse_config_default(&c, LOOM_SPARSE_FIXED);
        c.block = 2, c.num_local_blocks = 2, c.different_layout_per_head = 1,
        c.num_different_global_patterns = 2;
        test_fd("fixed per head", &c, 3, 1);
        loom_sparse_config_default(&c, LOOM_SPARSE_BIGBIRD);
        c.block = 2, c.unidirectional = 0, c.num_sliding_window_blocks = 1;
        test_fd("bigbird bidirectional", &c, 2, 0);
    }

    test_bad_settings();
    return check_summary("test_sparse_attention");
}
