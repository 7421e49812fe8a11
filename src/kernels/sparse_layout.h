/*
 * Block-sparse attention layouts, with DeepSpeed's sparse_attention
 * settings (sparsity_config.py): which (query block, key block) pairs of the
 * T x T attention matrix a head computes, and the token rule applied inside
 * them. The kernels are in kernels.h ("block-sparse causal attention").
 *
 * A layout is built once for every head of the layer, numbered globally
 * (NH of the whole model, not of a tensor-parallel rank), so ranks holding
 * heads [h0, h1) read the same per-head layouts as one process holding all.
 * Shape letters: T time, NH heads, nb = T / block blocks per side.
 *
 * Modes (one line each; where a DeepSpeed behaviour is changed for a causal
 * language model, it says so):
 *   dense        every block; with unidirectional, the lower triangle.
 *   fixed        Sparse Transformer's: local windows of num_local_blocks
 *                aligned blocks, each attending within itself; in each
 *                window num_global_blocks blocks (counted back from the
 *                window's end; heads shift by h % num_different_global_patterns)
 *                are attended by every later row (every row, bidirectional;
 *                horizontal_global_attention adds their rows).
 *   bigbird      num_random_blocks random key blocks per row, a sliding
 *                window of num_sliding_window_blocks centred on the
 *                diagonal, and the first num_global_blocks blocks as global
 *                rows and columns. Unidirectional rows draw from the blocks
 *                up to the diagonal, at most row + 1 of them (DeepSpeed's
 *                sampling fails there for early rows).
 *   bslongformer the sliding window plus global rows and columns at
 *                global_block_indices (ranges to global_block_end_indices
 *                when given).
 *   variable     random blocks, local windows of the listed sizes (the last
 *                size repeated to the end) and global blocks as
 *                bslongformer's (rows only with horizontal_global_attention).
 *                Unidirectional rows draw random blocks up to the diagonal
 *                (DeepSpeed draws from the whole row and keeps blocks the
 *                causal mask then empties).
 *   window       token-level sliding window: key j allowed for query i iff
 *                i - window < j <= i (bidirectional: |i - j| < window); the
 *                blocks are those the window touches.
 * In every unidirectional layout the blocks above the block diagonal are
 * dropped (DeepSpeed keeps some, e.g. fixed's multi-block globals, which
 * its causal mask then empties) and the token rule j <= i cuts the diagonal
 * blocks. Every row keeps its diagonal block, so no row is fully masked.
 * Random draws come from loom's SplitMix64 stream seeded by (seed, head,
 * row), not from a process-wide generator, so every rank builds the same
 * layout.
 *
 * Deliberately not: DeepSpeed's attention or key-padding masks, relative
 * position terms, or a layout that changes between steps.
 */
#ifndef LOOM_KERNELS_SPARSE_LAYOUT_H
#define LOOM_KERNELS_SPARSE_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

enum loom_sparse_mode {
    LOOM_SPARSE_DENSE = 0,
    LOOM_SPARSE_FIXED = 1,
    LOOM_SPARSE_BIGBIRD = 2,
    LOOM_SPARSE_BSLONGFORMER = 3,
    LOOM_SPARSE_VARIABLE = 4,
    LOOM_SPARSE_WINDOW = 5,
    LOOM_SPARSE_MODE_COUNT
};

#define LOOM_SPARSE_MAX_LIST 16 /* entries of each index list below */

/* DeepSpeed's "sparse_attention" keys; each mode reads only its own
 * (the mode list above), the rest are ignored, but horizontal global
 * attention is refused with unidirectional in every mode. */
struct loom_sparse_config {
    enum loom_sparse_mode mode;
    int block;                                     /* tokens per block side (16) */
    int different_layout_per_head;                 /* a layout per head (fixed's patterns, random draws) */
    int num_local_blocks;                          /* fixed (4) */
    int num_global_blocks;                         /* fixed, bigbird (1) */
    int num_random_blocks;                         /* bigbird (1), variable (0) */
    int num_sliding_window_blocks;                 /* bigbird, bslongformer (3) */
    int num_different_global_patterns;             /* fixed (1) */
    int horizontal_global_attention;               /* fixed, variable; bidirectional only */
    int local_window_blocks[LOOM_SPARSE_MAX_LIST]; /* variable ({4}) */
    int n_local_window_blocks;
    int global_block_indices[LOOM_SPARSE_MAX_LIST]; /* variable, bslongformer ({0}) */
    int n_global_block_indices;
    int global_block_end_indices[LOOM_SPARSE_MAX_LIST]; /* exclusive ends; none by default */
    int n_global_block_end_indices;
    int unidirectional; /* 1: causal ("unidirectional", a language model's); 0: bidirectional */
    int window;         /* window: tokens (3 * block) */
    uint64_t seed;      /* random blocks (0) */
};

struct loom_sparse_layout {
    enum loom_sparse_mode mode;
    int block;          /* tokens per block side */
    int nb;             /* T / block */
    int T;              /* sequence length it was built for */
    int NH;             /* heads it was built for (all of the layer's) */
    int heads;          /* 1 (one layout for every head) or NH */
    int unidirectional; /* token rule j <= i */
    int window;         /* token rule of window mode; 0: none */
    int dense;          /* every causal pair allowed: the kernels run the dense ones */
    uint8_t *mask;      /* (heads, nb, nb) 1: block computed */
    int64_t
        *row_ptr; /* (heads, nb + 1) the blocks of row block r are [row_ptr[r], row_ptr[r+1]) of its head */
    int32_t *col; /* (head_off[heads]) key block of each, ascending in a row; head g's from head_off[g] */
    int64_t *head_off; /* (heads + 1) blocks before each layout head */
    int64_t nnz;       /* blocks summed over all NH heads */
};

/* DeepSpeed's defaults for mode (in the comments above), unidirectional. */
void loom_sparse_config_default(struct loom_sparse_config *cfg, enum loom_sparse_mode mode);

/* Builds the layout of cfg for NH heads at sequence length T. LOOM_OK, or
 * LOOM_ERR_INPUT with one line naming the setting (T not a multiple of
 * block, window < 1, negative counts, lists too long, horizontal global
 * attention with unidirectional, counts larger than the blocks of T, ...);
 * out is then empty (loom_sparse_layout_free is safe on it). */
int loom_sparse_layout_build(const struct loom_sparse_config *cfg, int NH, int T,
                             struct loom_sparse_layout *out);
void loom_sparse_layout_free(struct loom_sparse_layout *l);

/* Whether query i of head h (global) attends to key j: the block mask and
 * the token rule (j <= i when unidirectional; window mode's window). */
int loom_sparse_allowed(const struct loom_sparse_layout *l, int h, int i, int j);
/* The keys [*lo, *hi) the token rule allows for query i, before the block
 * mask: the allowed keys of any block are those in this range. */
void loom_sparse_token_range(const struct loom_sparse_layout *l, int i, int *lo, int *hi);

/* Floats of the kernels' att buffer (and of datt) for B sequences of the NH
 * heads from global head h0: B * (blocks of those heads) * block * block,
 * or, for a layout that allows every causal pair (l->dense), the dense
 * kernels' B * NH * T * T. Exits on size_t overflow. */
size_t loom_sparse_att_numel(const struct loom_sparse_layout *l, int B, int NH, int h0);
/* Blocks of the layout's head h (global). */
int64_t loom_sparse_head_blocks(const struct loom_sparse_layout *l, int h);

/* "dense", "fixed", "bigbird", "bslongformer", "variable", "window"; NULL
 * for a value out of range. */
const char *loom_sparse_mode_name(enum loom_sparse_mode m);
/* LOOM_OK, or LOOM_ERR_INPUT naming the choices. */
int loom_sparse_mode_parse(const char *s, enum loom_sparse_mode *out);

#endif
