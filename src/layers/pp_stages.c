/* Pipeline placement and the tied embedding's exchange (see pp_stages.h). */
#include "layers/pp_stages.h"

#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/mem.h"
#include "comm/comm.h"
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

/* The sends in flight: the first stage's table, the last stage's gradient.
 * A send's buffer stays the model's and untouched until loom_pp_flush. */
static struct loom_comm_handle *weights_sending, *grads_sending;
enum { TAG_WEIGHTS = 3, TAG_GRADS = 4 }; /* group ranks: 0 the first stage, 1 the last */

void loom_pp_tied_weights_send(const float *table, size_t n)
{
    LOOM_ASSERT(!weights_sending);
    weights_sending = loom_comm_send(LOOM_GROUP_EMBEDDING, loom_buf_f32((float *)table, n), 1, TAG_WEIGHTS);
}

void loom_pp_tied_weights_recv(float *copy, size_t n)
{
    loom_comm_wait(loom_comm_recv(LOOM_GROUP_EMBEDDING, loom_buf_f32(copy, n), 0, TAG_WEIGHTS));
}

/* Sends of a micro-batch's share, each from a copy of its own. */
static struct loom_comm_handle **copies_sending;
static int ncopies, capcopies;

float **loom_pp_tied_copies_alloc(const struct loom_backend *b, size_t n, int micros)
{
    float **c = loom_alloc(sizeof *c * (size_t)micros, LOOM_MEM_OTHER);
    for (int i = 0; i < micros; i++) c[i] = b->alloc(loom_mul_size(n, sizeof(float)), LOOM_MEM_COMM);
    return c;
}

void loom_pp_tied_copies_free(const struct loom_backend *b, float **copies, int micros)
{
    if (!copies) return;
    for (int i = 0; i < micros; i++) b->free(copies[i]);
    loom_free(copies);
}

void loom_pp_tied_grads_send_copy(const struct loom_backend *b, const float *grad, float *copy, size_t n)
{
    if (ncopies == capcopies) {
        capcopies = capcopies ? 2 * capcopies : 8;
        copies_sending = realloc(copies_sending, sizeof *copies_sending * (size_t)capcopies);
        if (!copies_sending) loom_die("out of memory for the tied table's sends");
    }
    b->copy(copy, grad, n * sizeof(float));
    copies_sending[ncopies++] = loom_comm_send(LOOM_GROUP_EMBEDDING, loom_buf_f32(copy, n), 0, TAG_GRADS);
}

void loom_pp_tied_grads_send(const float *grad, size_t n)
{
    LOOM_ASSERT(!grads_sending);
    grads_sending = loom_comm_send(LOOM_GROUP_EMBEDDING, loom_buf_f32((float *)grad, n), 0, TAG_GRADS);
}

void loom_pp_tied_grads_add(const struct loom_kernels *k, float *grad, float *scratch, size_t n)
{
    if (weights_sending) { /* scratch may be the table's send buffer: that send is long done */
        loom_comm_wait(weights_sending);
        weights_sending = NULL;
    }
    loom_comm_wait(loom_comm_recv(LOOM_GROUP_EMBEDDING, loom_buf_f32(scratch, n), 1, TAG_GRADS));
    k->accumulate(grad, scratch, n);
}

double loom_pp_flush(void)
{
    double t = 0;
    if (weights_sending) t += loom_comm_wait(weights_sending);
    if (grads_sending) t += loom_comm_wait(grads_sending);
    weights_sending = grads_sending = NULL;
    for (int i = 0; i < ncopies; i++) t += loom_comm_wait(copies_sending[i]);
    ncopies = 0;
    return t;
}
