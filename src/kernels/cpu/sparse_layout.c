/*
 * Block-sparse attention layouts (rules in kernels/sparse_layout.h): the
 * settings checked, each mode's block mask set a layout head at a time in
 * DeepSpeed's order (random, local, global), the unidirectional triangle
 * cut, and the per-row lists of key blocks the kernels walk built from the
 * mask.
 *
 * Backend-independent (no kernels here): it sits beside the CPU kernels
 * because those are its only reader today. Deliberately not: layouts
 * loaded from a file, or a mask given by the caller.
 */
#include "kernels/sparse_layout.h"

#include <assert.h>
#include <limits.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/rng.h"

static const char *const mode_names[] = {
    [LOOM_SPARSE_DENSE] = "dense",       [LOOM_SPARSE_FIXED] = "fixed",
    [LOOM_SPARSE_BIGBIRD] = "bigbird",   [LOOM_SPARSE_BSLONGFORMER] = "bslongformer",
    [LOOM_SPARSE_VARIABLE] = "variable", [LOOM_SPARSE_WINDOW] = "window"};
static_assert(sizeof mode_names / sizeof mode_names[0] == LOOM_SPARSE_MODE_COUNT, "mode_names");

const char *loom_sparse_mode_name(enum loom_sparse_mode m)
{
    return (unsigned)m < LOOM_SPARSE_MODE_COUNT ? mode_names[m] : NULL;
}

int loom_sparse_mode_parse(const char *s, enum loom_sparse_mode *out)
{
    for (int m = 0; m < LOOM_SPARSE_MODE_COUNT; m++)
        if (s && strcmp(s, mode_names[m]) == 0) {
            *out = (enum loom_sparse_mode)m;
            return LOOM_OK;
        }
    return loom_error_set(
        LOOM_ERR_INPUT,
        "sparse attention mode '%s' unknown (dense, fixed, bigbird, bslongformer, variable, "
        "window)",
        s ? s : "(null)");
}

void loom_sparse_config_default(struct loom_sparse_config *cfg, enum loom_sparse_mode mode)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->mode = mode;
    cfg->block = 16;
    cfg->num_local_blocks = 4;
    cfg->num_global_blocks = 1;
    cfg->num_random_blocks = mode == LOOM_SPARSE_BIGBIRD ? 1 : 0;
    cfg->num_sliding_window_blocks = 3;
    cfg->num_different_global_patterns = 1;
    cfg->local_window_blocks[0] = 4;
    cfg->n_local_window_blocks = 1;
    cfg->global_block_indices[0] = 0;
    cfg->n_global_block_indices = 1;
    cfg->unidirectional = 1;
    cfg->window = 3 * cfg->block;
}

/* ---- checking the settings -------------------------------------------------- */

#define BAD(...) loom_error_set(LOOM_ERR_INPUT, "sparse attention: " __VA_ARGS__)

static int check_count(const char *name, int v, int min)
{
    if (v < min) return BAD("%s = %d must be at least %d", name, v, min);
    return LOOM_OK;
}

static int check_not_above_blocks(const char *name, int v, int nb, int T, int block)
{
    if (v > nb) return BAD("%s = %d is more than the %d blocks of T = %d (block %d)", name, v, nb, T, block);
    return LOOM_OK;
}

static int check_horizontal(const struct loom_sparse_config *cfg)
{
    if (cfg->horizontal_global_attention && cfg->unidirectional)
        return BAD("horizontal_global_attention needs bidirectional attention (unidirectional is set)");
    return LOOM_OK;
}

/* global_block_indices and their optional end indices (variable, bslongformer). */
static int check_globals(const struct loom_sparse_config *cfg)
{
    const int n = cfg->n_global_block_indices, ne = cfg->n_global_block_end_indices;
    if (n < 0 || n > LOOM_SPARSE_MAX_LIST)
        return BAD("n_global_block_indices = %d must be in [0, %d]", n, LOOM_SPARSE_MAX_LIST);
    if (ne != 0 && ne != n)
        return BAD("global_block_end_indices has %d entries, global_block_indices %d: give none or as many",
                   ne, n);
    for (int g = 0; g < n; g++) {
        const int s = cfg->global_block_indices[g];
        if (s < 0) return BAD("global_block_indices[%d] = %d is negative", g, s);
        if (ne && cfg->global_block_end_indices[g] <= s)
            return BAD("global_block_end_indices[%d] = %d must be greater than global_block_indices[%d] = %d",
                       g, cfg->global_block_end_indices[g], g, s);
    }
    return LOOM_OK;
}

static int check_config(const struct loom_sparse_config *cfg, int NH, int T)
{
    int rc;
    if ((unsigned)cfg->mode >= LOOM_SPARSE_MODE_COUNT)
        return BAD("mode %d unknown (0..%d)", (int)cfg->mode, LOOM_SPARSE_MODE_COUNT - 1);
    if (NH < 1) return BAD("%d heads: need at least 1", NH);
    if (T < 1) return BAD("sequence length %d: need at least 1", T);
    if (cfg->block < 1) return BAD("block = %d must be at least 1", cfg->block);
    if (T % cfg->block) return BAD("sequence length %d is not a multiple of block = %d", T, cfg->block);
    const int nb = T / cfg->block;
    if ((int64_t)nb * nb > INT_MAX)
        return BAD("%d blocks per side (T = %d, block = %d) is too many: raise block", nb, T, cfg->block);
    if ((rc = check_horizontal(cfg))) return rc;
    switch (cfg->mode) {
    case LOOM_SPARSE_DENSE:
        return LOOM_OK;
    case LOOM_SPARSE_FIXED: {
        const int nl = cfg->num_local_blocks, ng = cfg->num_global_blocks;
        const int np = cfg->num_different_global_patterns;
        if ((rc = check_count("num_local_blocks", nl, 1)) || (rc = check_count("num_global_blocks", ng, 1)) ||
            (rc = check_count("num_different_global_patterns", np, 1)))
            return rc;
        if (nl % ng) return BAD("num_local_blocks = %d is not a multiple of num_global_blocks = %d", nl, ng);
        if (np > 1 && !cfg->different_layout_per_head)
            return BAD("num_different_global_patterns = %d needs different_layout_per_head", np);
        if (np > nl / ng)
            return BAD(
                "num_different_global_patterns = %d is more than num_local_blocks / num_global_blocks = %d",
                np, nl / ng);
        return check_not_above_blocks("num_global_blocks", ng, nb, T, cfg->block);
    }
    case LOOM_SPARSE_BIGBIRD:
        if ((rc = check_count("num_random_blocks", cfg->num_random_blocks, 0)) ||
            (rc = check_count("num_sliding_window_blocks", cfg->num_sliding_window_blocks, 0)) ||
            (rc = check_count("num_global_blocks", cfg->num_global_blocks, 0)) ||
            (rc = check_not_above_blocks("num_random_blocks", cfg->num_random_blocks, nb, T, cfg->block)) ||
            (rc = check_not_above_blocks("num_sliding_window_blocks", cfg->num_sliding_window_blocks, nb, T,
                                         cfg->block)))
            return rc;
        return check_not_above_blocks("num_global_blocks", cfg->num_global_blocks, nb, T, cfg->block);
    case LOOM_SPARSE_BSLONGFORMER:
        if ((rc = check_count("num_sliding_window_blocks", cfg->num_sliding_window_blocks, 0)) ||
            (rc = check_not_above_blocks("num_sliding_window_blocks", cfg->num_sliding_window_blocks, nb, T,
                                         cfg->block)))
            return rc;
        return check_globals(cfg);
    case LOOM_SPARSE_VARIABLE: {
        const int n = cfg->n_local_window_blocks;
        if ((rc = check_count("num_random_blocks", cfg->num_random_blocks, 0)) ||
            (rc = check_not_above_blocks("num_random_blocks", cfg->num_random_blocks, nb, T, cfg->block)) ||
            (rc = check_globals(cfg)))
            return rc;
        if (n < 1 || n > LOOM_SPARSE_MAX_LIST)
            return BAD("n_local_window_blocks = %d must be in [1, %d]", n, LOOM_SPARSE_MAX_LIST);
        for (int w = 0; w < n; w++)
            if (cfg->local_window_blocks[w] < 1)
                return BAD("local_window_blocks[%d] = %d must be at least 1", w, cfg->local_window_blocks[w]);
        return LOOM_OK;
    }
    case LOOM_SPARSE_WINDOW:
        return check_count("window", cfg->window, 1);
    case LOOM_SPARSE_MODE_COUNT:
        break;
    }
    return BAD("mode %d unknown", (int)cfg->mode);
}

/* ---- block masks, one layout head at a time ---------------------------------
 * m: this head's (nb, nb) mask, zero on entry; rows r, key blocks c. */

static void set_rect(uint8_t *m, int nb, int r0, int r1, int c0, int c1)
{
    r0 = r0 < 0 ? 0 : r0, c0 = c0 < 0 ? 0 : c0;
    r1 = r1 > nb ? nb : r1, c1 = c1 > nb ? nb : c1;
    for (int r = r0; r < r1; r++)
        for (int c = c0; c < c1; c++) m[(size_t)r * nb + c] = 1;
}

/* Windows [w0, w1) of blocks attending within themselves. */
static void set_local_window(uint8_t *m, int nb, int w0, int w1)
{
    set_rect(m, nb, w0, w1, w0, w1); /* the triangle is cut later when unidirectional */
}

/* k distinct random key blocks in [0, n) for row r (Floyd's sampling), the
 * row being empty on entry; the stream is (seed, head, row). */
static void set_random_row(uint8_t *row, int n, int k, uint64_t seed, int head, int r)
{
    struct loom_rng rng;
    loom_rng_seed(&rng, loom_hash3(seed, (uint64_t)head, (uint64_t)r));
    for (int j = n - k; j < n; j++) {
        const int t = (int)loom_rng_below(&rng, (uint64_t)j + 1);
        row[row[t] ? j : t] = 1;
    }
}

static void set_random(uint8_t *m, int nb, const struct loom_sparse_config *cfg, int head)
{
    for (int r = 0; r < nb; r++) {
        const int n = cfg->unidirectional ? r + 1 : nb; /* causal rows draw up to the diagonal */
        const int k = cfg->num_random_blocks < n ? cfg->num_random_blocks : n;
        set_random_row(m + (size_t)r * nb, n, k, cfg->seed, head, r);
    }
}

/* Rows [r - w, r + w] around the diagonal, w = num_sliding_window_blocks / 2. */
static void set_sliding(uint8_t *m, int nb, int nsw)
{
    const int w = nsw / 2;
    for (int r = 0; r < nb; r++) set_rect(m, nb, r, r + 1, r - w, r + w + 1);
}

/* Global blocks [s, e): attended by every row (from s on when
 * unidirectional; the triangle cut removes the rest anyway) and, when
 * horizontal, attending to every block. */
static void set_global(uint8_t *m, int nb, int s, int e, int horizontal)
{
    set_rect(m, nb, 0, nb, s, e);
    if (horizontal) set_rect(m, nb, s, e, 0, nb);
}

static void set_fixed(uint8_t *m, int nb, const struct loom_sparse_config *cfg, int head)
{
    const int nl = cfg->num_local_blocks, ng = cfg->num_global_blocks, hz = cfg->horizontal_global_attention;
    for (int w0 = 0; w0 < nb; w0 += nl) set_local_window(m, nb, w0, w0 + nl);
    /* the global blocks of each window count back from its end; head h uses
     * pattern h % num_different_global_patterns */
    const int first = nl - (1 + head % cfg->num_different_global_patterns) * ng;
    const int full_end = nb - nb % nl; /* windows [0, full_end) are whole */
    for (int s = first; s < full_end; s += nl) set_global(m, nb, s, s + ng, hz);
    if (full_end < nb) { /* a short last window: its globals moved in so they fit */
        const int s = full_end + first < nb - ng ? full_end + first : nb - ng;
        set_global(m, nb, s, s + ng, hz);
    }
}

static void set_bigbird(uint8_t *m, int nb, const struct loom_sparse_config *cfg, int head)
{
    set_random(m, nb, cfg, head);
    set_sliding(m, nb, cfg->num_sliding_window_blocks);
    set_global(m, nb, 0, cfg->num_global_blocks, 1);
}

/* The global list of variable and bslongformer; indices past the last block
 * are skipped, ranges clipped to it. */
static void set_global_list(uint8_t *m, int nb, const struct loom_sparse_config *cfg, int horizontal)
{
    for (int g = 0; g < cfg->n_global_block_indices; g++) {
        const int s = cfg->global_block_indices[g];
        const int e = cfg->n_global_block_end_indices ? cfg->global_block_end_indices[g] : s + 1;
        if (s < nb) set_global(m, nb, s, e, horizontal);
    }
}

static void set_variable(uint8_t *m, int nb, const struct loom_sparse_config *cfg, int head)
{
    set_random(m, nb, cfg, head);
    int w0 = 0, size = 0;
    for (int w = 0; w < cfg->n_local_window_blocks && w0 < nb; w++) {
        size = cfg->local_window_blocks[w];
        set_local_window(m, nb, w0, w0 + size);
        w0 += size;
    }
    for (; w0 < nb; w0 += size) set_local_window(m, nb, w0, w0 + size); /* the last size repeated */
    set_global_list(m, nb, cfg, cfg->horizontal_global_attention);
}

/* Window mode: the key blocks holding any key of the row block's queries. */
static void set_window(uint8_t *m, int nb, int block, int window, int unidirectional)
{
    for (int r = 0; r < nb; r++) {
        const int lo = r * block - window + 1,
                  hi = unidirectional ? r * block + block : r * block + block - 1 + window;
        const int c0 = lo < 0 ? 0 : lo / block, c1 = (hi + block - 1) / block; /* keys [lo, hi) */
        set_rect(m, nb, r, r + 1, c0, c1);
    }
}

static void set_head(uint8_t *m, int nb, const struct loom_sparse_config *cfg, int head)
{
    switch (cfg->mode) {
    case LOOM_SPARSE_DENSE:
        set_rect(m, nb, 0, nb, 0, nb);
        break;
    case LOOM_SPARSE_FIXED:
        set_fixed(m, nb, cfg, head);
        break;
    case LOOM_SPARSE_BIGBIRD:
        set_bigbird(m, nb, cfg, head);
        break;
    case LOOM_SPARSE_BSLONGFORMER:
        set_sliding(m, nb, cfg->num_sliding_window_blocks);
        set_global_list(m, nb, cfg, 1);
        break;
    case LOOM_SPARSE_VARIABLE:
        set_variable(m, nb, cfg, head);
        break;
    case LOOM_SPARSE_WINDOW:
        set_window(m, nb, cfg->block, cfg->window, cfg->unidirectional);
        break;
    case LOOM_SPARSE_MODE_COUNT:
        LOOM_ASSERT(0);
    }
    if (cfg->unidirectional)
        for (int r = 0; r < nb; r++) memset(m + (size_t)r * nb + r + 1, 0, (size_t)(nb - r - 1));
    for (int r = 0; r < nb; r++) LOOM_ASSERT(m[(size_t)r * nb + r]); /* no fully masked row */
}

/* ---- the layout ---------------------------------------------------------------- */

int loom_sparse_layout_build(const struct loom_sparse_config *cfg, int NH, int T,
                             struct loom_sparse_layout *out)
{
    memset(out, 0, sizeof *out);
    const int rc = check_config(cfg, NH, T);
    if (rc) return rc;
    const int nb = T / cfg->block;
    const int heads = cfg->different_layout_per_head ? NH : 1;
    const size_t per_head = (size_t)nb * nb;
    struct loom_sparse_layout l = {
        .mode = cfg->mode,
        .block = cfg->block,
        .nb = nb,
        .T = T,
        .NH = NH,
        .heads = heads,
        .unidirectional = cfg->unidirectional != 0,
        .window = cfg->mode == LOOM_SPARSE_WINDOW ? cfg->window : 0,
    };
    l.mask = loom_alloc(loom_mul_size((size_t)heads, per_head), LOOM_MEM_OTHER);
    l.row_ptr = loom_alloc(loom_mul_size((size_t)heads * (nb + 1), sizeof(int64_t)), LOOM_MEM_OTHER);
    l.head_off = loom_alloc(((size_t)heads + 1) * sizeof(int64_t), LOOM_MEM_OTHER);
    int full_causal = l.unidirectional && (l.window == 0 || l.window >= T);
    for (int g = 0; g < heads; g++) {
        uint8_t *m = l.mask + (size_t)g * per_head;
        set_head(m, nb, cfg, g);
        int64_t *rp = l.row_ptr + (size_t)g * (nb + 1);
        rp[0] = 0;
        for (int r = 0; r < nb; r++) {
            int n = 0;
            for (int c = 0; c < nb; c++) n += m[(size_t)r * nb + c];
            rp[r + 1] = rp[r] + n;
            if (n != r + 1) full_causal = 0;
        }
        l.head_off[g + 1] = l.head_off[g] + rp[nb];
    }
    l.col = loom_alloc(loom_mul_size((size_t)l.head_off[heads], sizeof(int32_t)), LOOM_MEM_OTHER);
    for (int g = 0; g < heads; g++) {
        const uint8_t *m = l.mask + (size_t)g * per_head;
        int32_t *col = l.col + l.head_off[g];
        for (size_t e = 0; e < per_head; e++)
            if (m[e]) *col++ = (int32_t)(e % nb);
    }
    l.nnz = heads == 1 ? (int64_t)NH * l.head_off[1] : l.head_off[heads];
    l.dense = full_causal;
    *out = l;
    return LOOM_OK;
}

void loom_sparse_layout_free(struct loom_sparse_layout *l)
{
    loom_free(l->mask);
    loom_free(l->row_ptr);
    loom_free(l->col);
    loom_free(l->head_off);
    memset(l, 0, sizeof *l);
}

void loom_sparse_token_range(const struct loom_sparse_layout *l, int i, int *lo, int *hi)
{
    int a = 0, e = l->unidirectional ? i + 1 : l->T;
    if (l->window) {
        a = i - l->window + 1 > 0 ? i - l->window + 1 : 0;
        if (!l->unidirectional && i + l->window < e) e = i + l->window;
    }
    *lo = a, *hi = e;
}

int loom_sparse_allowed(const struct loom_sparse_layout *l, int h, int i, int j)
{
    LOOM_ASSERT(h >= 0 && h < l->NH && i >= 0 && i < l->T && j >= 0 && j < l->T);
    const int g = l->heads == 1 ? 0 : h;
    if (!l->mask[((size_t)g * l->nb + i / l->block) * l->nb + j / l->block]) return 0;
    int lo, hi;
    loom_sparse_token_range(l, i, &lo, &hi);
    return j >= lo && j < hi;
}

int64_t loom_sparse_head_blocks(const struct loom_sparse_layout *l, int h)
{
    LOOM_ASSERT(h >= 0 && h < l->NH);
    const int g = l->heads == 1 ? 0 : h;
    return l->head_off[g + 1] - l->head_off[g];
}

size_t loom_sparse_att_numel(const struct loom_sparse_layout *l, int B, int NH, int h0)
{
    LOOM_ASSERT(B >= 0 && NH >= 1 && h0 >= 0 && h0 + NH <= l->NH);
    if (l->dense) return loom_mul_size(loom_mul_size((size_t)B * NH, (size_t)l->T), (size_t)l->T);
    size_t blocks = 0;
    for (int h = h0; h < h0 + NH; h++) blocks += (size_t)loom_sparse_head_blocks(l, h);
    return loom_mul_size(loom_mul_size((size_t)B, blocks), (size_t)l->block * l->block);
}
