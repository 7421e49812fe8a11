/* The attention sparsity of the settings (see sparsity.h). */
#include "model/sparsity.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"

/* "a,b,c" into list (at most LOOM_SPARSE_MAX_LIST); "" is empty. */
static int parse_list(const char *text, const char *flag, int *list, int *n)
{
    *n = 0;
    for (const char *p = text; *p;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > 1 << 30 || (*end && *end != ','))
            return loom_error_set(LOOM_ERR_INPUT, "%s %s: expected comma-separated block indices", flag,
                                  text);
        if (*n == LOOM_SPARSE_MAX_LIST)
            return loom_error_set(LOOM_ERR_INPUT, "%s %s: at most %d entries", flag, text,
                                  LOOM_SPARSE_MAX_LIST);
        list[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return LOOM_OK;
}

int loom_model_sparsity(const struct loom_config *cfg, struct loom_sparse_config *out, int *on)
{
    static const enum loom_sparse_mode modes[LOOM_SPARSE_ATTN_MODE_COUNT] = {
        LOOM_SPARSE_DENSE,   LOOM_SPARSE_DENSE,        LOOM_SPARSE_FIXED,
        LOOM_SPARSE_BIGBIRD, LOOM_SPARSE_BSLONGFORMER, LOOM_SPARSE_VARIABLE};
    *on = 0;
    if (cfg->attention_window > 0) {
        loom_sparse_config_default(out, LOOM_SPARSE_WINDOW);
        out->window = cfg->attention_window;
        out->block = cfg->sparse_block;
        *on = 1;
        return LOOM_OK;
    }
    if (cfg->sparse_mode == LOOM_SPARSE_ATTN_NONE) return LOOM_OK;
    loom_sparse_config_default(out, modes[cfg->sparse_mode]);
    out->block = cfg->sparse_block;
    out->different_layout_per_head = cfg->sparse_different_layout_per_head;
    out->num_local_blocks = cfg->sparse_num_local_blocks;
    out->num_global_blocks = cfg->sparse_num_global_blocks;
    if (cfg->sparse_num_random_blocks >= 0) out->num_random_blocks = cfg->sparse_num_random_blocks;
    out->num_sliding_window_blocks = cfg->sparse_num_sliding_window_blocks;
    out->num_different_global_patterns = cfg->sparse_num_different_global_patterns;
    out->horizontal_global_attention = cfg->sparse_horizontal_global_attention;
    out->unidirectional = cfg->sparse_attention == LOOM_ATTN_UNIDIRECTIONAL;
    out->seed = (uint64_t)cfg->seed;
    int rc = parse_list(cfg->sparse_local_window_blocks, "--sparse-local-window-blocks",
                        out->local_window_blocks, &out->n_local_window_blocks);
    if (!rc)
        rc = parse_list(cfg->sparse_global_block_indices, "--sparse-global-block-indices",
                        out->global_block_indices, &out->n_global_block_indices);
    if (!rc)
        rc = parse_list(cfg->sparse_global_block_end_indices, "--sparse-global-block-end-indices",
                        out->global_block_end_indices, &out->n_global_block_end_indices);
    *on = rc == LOOM_OK;
    return rc;
}

int loom_model_sparsity_check(const struct loom_config *cfg, int NH, int T)
{
    struct loom_sparse_config sc;
    int on, rc = loom_model_sparsity(cfg, &sc, &on);
    if (rc || !on) return rc;
    struct loom_sparse_layout l;
    rc = loom_sparse_layout_build(&sc, NH, T, &l);
    loom_sparse_layout_free(&l);
    return rc;
}

double loom_model_sparsity_share(const struct loom_sparse_layout *l)
{
    if (!l) return 1.0;
    return (double)l->nnz / ((double)l->NH * l->nb * (l->nb + 1) / 2);
}

void loom_model_sparsity_describe(const struct loom_sparse_layout *l, char *buf, size_t n)
{
    if (!l || !n) return;
    const size_t len = strlen(buf);
    if (l->mode == LOOM_SPARSE_WINDOW)
        snprintf(buf + len, n > len ? n - len : 0,
                 ", attention window %d (blocks of %d, %.1f%% of the causal ones)", l->window, l->block,
                 100.0 * loom_model_sparsity_share(l));
    else
        snprintf(buf + len, n > len ? n - len : 0,
                 ", %s sparse attention (blocks of %d, %.1f%% of the causal ones)",
                 loom_sparse_mode_name(l->mode), l->block, 100.0 * loom_model_sparsity_share(l));
}

int loom_model_sparse_layout(const struct loom_sparse_config *sc, int NH, int T,
                             struct loom_sparse_layout **out)
{
    *out = NULL;
    struct loom_sparse_layout *l = loom_alloc(sizeof *l, LOOM_MEM_OTHER);
    int rc = loom_sparse_layout_build(sc, NH, T, l);
    if (rc || l->dense) { /* every causal pair: the dense kernels, as without a layout */
        loom_model_sparse_layout_free(l);
        return rc;
    }
    *out = l;
    return LOOM_OK;
}

void loom_model_sparse_layout_free(struct loom_sparse_layout *l)
{
    if (!l) return;
    loom_sparse_layout_free(l);
    loom_free(l);
}
