/* Pipeline placement and the tied table's copy (see pp_stages.h). */
#include "layers/pp_stages.h"

#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/mem.h"
#include "loom/config.h"

int loom_pp_chunks(const struct loom_config *cfg)
{
    const int pp = cfg->pipeline_model_parallel_size, vl = cfg->num_layers_per_virtual_pipeline_stage;
    if (pp == 1 || cfg->pipeline_schedule != LOOM_PIPELINE_SCHEDULE_INTERLEAVED || vl == 0) return 1;
    return cfg->num_layers / (vl * pp);
}

void loom_pp_stage_layers_init(struct loom_pp_stage_layers *s, int L, int chunks, const int *lo,
                               const int *hi, int embedding, int head)
{
    LOOM_ASSERT(chunks >= 1 && (!embedding || lo[0] == 0) && (!head || hi[chunks - 1] == L - 1));
    s->block = loom_alloc(sizeof(int) * 3 * (size_t)L, LOOM_MEM_OTHER);
    s->lo = s->block + L;
    s->hi = s->lo + L;
    for (int l = 0; l < L; l++) s->block[l] = -1;
    s->nblocks = embedding;
    for (int c = 0; c < chunks; c++) {
        LOOM_ASSERT(lo[c] <= hi[c] && hi[c] < L && (c == 0 || lo[c] > hi[c - 1]));
        for (int l = lo[c]; l <= hi[c]; l++) {
            s->block[l] = s->nblocks++;
            s->lo[l] = lo[c];
            s->hi[l] = hi[c];
        }
    }
    s->nblocks += head;
}

void loom_pp_stage_layers_free(struct loom_pp_stage_layers *s)
{
    loom_free(s->block);
    *s = (struct loom_pp_stage_layers){0};
}

void loom_pp_tied_alloc(const struct loom_backend *b, float **copy, float **grad, size_t n, int holds_head)
{
    *copy = b->alloc(loom_mul_size(n, sizeof(float)), holds_head ? LOOM_MEM_PARAMS : LOOM_MEM_COMM);
    *grad = holds_head ? b->alloc(loom_mul_size(n, sizeof(float)), LOOM_MEM_GRADS) : *copy;
}

void loom_pp_tied_free(const struct loom_backend *b, float *copy, float *grad)
{
    if (grad != copy) b->free(grad);
    b->free(copy);
}

void loom_pp_layers(const struct loom_config *cfg, int stage, int chunk, int *lo, int *hi)
{
    const int pp = cfg->pipeline_model_parallel_size, L = cfg->num_layers, chunks = loom_pp_chunks(cfg);
    LOOM_ASSERT(stage >= 0 && stage < pp && chunk >= 0 && chunk < chunks);
    if (chunks > 1) { /* model chunk chunk x pp + stage, of equal chunks */
        const int per = L / (chunks * pp), c = chunk * pp + stage;
        *lo = c * per;
        *hi = *lo + per - 1;
        return;
    }
    const int first = pp > 1 ? cfg->decoder_first_pipeline_num_layers : 0,
              last = pp > 1 ? cfg->decoder_last_pipeline_num_layers : 0;
    /* the stages without a fixed count share the layers between the fixed ends */
    const int s0 = first > 0, s1 = pp - (last > 0); /* stages [s0, s1) share layers [first, L - last) */
    if (first > 0 && stage == 0) {
        *lo = 0;
        *hi = first - 1;
    } else if (last > 0 && stage == pp - 1) {
        *lo = L - last;
        *hi = L - 1;
    } else {
        const int n = s1 - s0, k = stage - s0, rest = L - first - last;
        *lo = first + (int)((long)k * rest / n);
        *hi = first + (int)((long)(k + 1) * rest / n) - 1;
    }
}
