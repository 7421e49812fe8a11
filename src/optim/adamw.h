/*
 * AdamW over runs of the model's parameter arena: first and second moments
 * for the elements it owns only (the whole arena without sharding; this
 * rank's shard under ZeRO; under expert parallelism with ZeRO the shard's
 * expert elements and this rank's share of its dense ones, see
 * parallel/zero.h). Its state is the runs' elements one after another: a
 * run's element x is state element (x - run.lo) + the lengths of the runs
 * before it. Weight decay on tensors of two or
 * more dimensions only, and global-norm gradient clipping. The state lives
 * on the model's backend and every step runs there: the update is the
 * backend's adamw_update kernel. Under mixed precision it keeps the
 * float32 master weights of its range and rounds the 16-bit parameters from
 * them after each step (the backend's convert). Host code reaches the state
 * only through the copies in and out below.
 */
#ifndef LOOM_OPTIM_ADAMW_H
#define LOOM_OPTIM_ADAMW_H

#include "base/buf.h"
#include "base/dtype.h"
#include "loom/model.h"

struct loom_backend; /* kernels/backend.h */

struct loom_adamw {
    const struct loom_backend *backend; /* whose memory holds the state: the model's */
    double beta1, beta2, eps, weight_decay;
    size_t begin, end;     /* the span of its runs: the parameters and gradients it is given */
    struct loom_run *runs; /* (nruns) the elements it owns, in arena order, within [begin, end) */
    int nruns;
    size_t n;     /* state elements: the runs' lengths summed */
    float *m, *v; /* (n) each on the backend; NULL with offload */
    int t;        /* optimizer steps taken */
    /* (n) float32 master weights on the backend under mixed
     * precision; NULL with offload */
    float *master;
    int has_master;
    enum loom_dtype dtype; /* of the parameters the master weights are rounded to */
    int fd;                /* offloaded: the offload file's buffered descriptor; -1 in memory */
    size_t chunk;          /* elements per streamed chunk */
    /* offloaded: the file (m, then v, then the master weights, each region
     * elements from an aligned offset); two host buffer sets of chunk
     * elements per array, the staging that file I/O reads into (set 0) and
     * writes from (set 1), the pinned host memory of a GPU; and the chunk
     * being updated on the backend (dev_m, dev_v, dev_master) */
    struct loom_offload_file *io;
    size_t region;
    float *set_m[2], *set_v[2], *set_master[2];
    void *sets; /* their one host allocation */
    float *dev_m, *dev_v, *dev_master;
    void *dev; /* their one allocation on the backend */
    /* the parameters and gradients it is given are these file mappings
     * (ZeRO-3's offloaded shards; NULL: memory): each chunk's are read
     * ahead and dropped once updated */
    const struct loom_offload_map *param_map, *grad_map;
    int streamed; /* made for an offload file: no state in memory */
    /* the gradients (parameters) it is given hold the runs' elements one
     * after another (a strategy's view with grads_runs, params_runs; as its
     * state does), not the span */
    int grads_by_state, params_by_state;
};

/* The state of the elements in [begin, end) that runs name (sorted, not
 * overlapping, within [begin, end); NULL: one run, all of it), on backend
 * b's memory (the model's). streamed: the state will live in an offload
 * file (loom_adamw_offload follows, or loom_adamw_offload_buffers when
 * counting): nothing of it is allocated in memory. */
void loom_adamw_init(struct loom_adamw *opt, const struct loom_backend *b, size_t begin, size_t end,
                     const struct loom_run *runs, int nruns, double beta1, double beta2, double eps,
                     double weight_decay, int streamed);
/* The state element of arena element x, which a run holds. */
size_t loom_adamw_state_at(const struct loom_adamw *opt, size_t x);
/* The place of arena element x among runs[0..n)'s elements one after
 * another; x must be in one of them. */
size_t loom_run_index(const struct loom_run *runs, int n, size_t x);
/* Keeps the moments (and master weights) in a file in dir instead,
 * streamed through buffers of buffer_bytes in all: while one chunk is
 * updated the next is read and the previous written (io_uring; O_DIRECT
 * when direct). LOOM_ERR_INPUT naming dir when it cannot (space: the bytes
 * needed). */
int loom_adamw_offload(struct loom_adamw *opt, const char *dir, size_t buffer_bytes, int direct);
/* The memory that stays with offload: the chunk buffers (moments, and the
 * master weights), two sets in host memory and one on the backend, a
 * third of buffer_bytes each; what loom_adamw_offload keeps, without the
 * file. */
void loom_adamw_offload_buffers(struct loom_adamw *opt, size_t buffer_bytes);
void loom_adamw_free(struct loom_adamw *opt);

/* Mixed precision: the float32 master weights of the runs, from the 16-bit
 * parameters (params: (end - begin) from begin, in BF16 or F16 on the backend),
 * as DeepSpeed creates them from the model's bf16/fp16 parameters. With
 * offload they live in the file too. */
void loom_adamw_set_master(struct loom_adamw *opt, struct loom_buf params);
/* Their buffer alone (set_master allocates it when it is not there). */
void loom_adamw_alloc_master(struct loom_adamw *opt);
/* Master weights of state elements [k, k + n), wherever they live,
 * copied in from host memory src (resume; loom_adamw_get copies them out). */
void loom_adamw_set_master_range(struct loom_adamw *opt, size_t k, size_t n, const float *src);

/* One part of the state of state elements [k, k + n) (loom_adamw_state_at),
 * wherever it lives (the backend or the offload file), copied out
 * into host memory dst for checkpoints; the numbers are the parts' order
 * in the offload file. */
enum loom_adamw_part { LOOM_ADAMW_EXP_AVG = 0, LOOM_ADAMW_EXP_AVG_SQ = 1, LOOM_ADAMW_MASTER = 2 };
void loom_adamw_get(const struct loom_adamw *opt, enum loom_adamw_part part, size_t k, size_t n, float *dst);
/* The moments of state elements [k, k + n) copied in from host memory, to resume. */
void loom_adamw_set_state(struct loom_adamw *opt, size_t k, size_t n, const float *m, const float *v);

/* L2 norm of all gradients of the blocks, on backend b's memory (its
 * sum_squares kernel, double accumulation). */
double loom_grad_norm(const struct loom_backend *b, const struct loom_block *blocks, int nblocks);

/* Clip coefficient as torch.nn.utils.clip_grad_norm_: min(1, max/(norm+1e-6)),
 * 1 when max_norm is 0 (clipping off). */
float loom_clip_coef(double norm, double max_norm);

/* One step at learning rate lr on the runs' elements of the model's arena:
 * params and grads (end - begin each from begin, or with grads_by_state
 * grads the n of the runs; one dtype) hold them (slices of
 * the arenas, or ZeRO shards); gradients are multiplied by grad_scale
 * first. float32 updates the parameters in place; BF16/F16 (mixed
 * precision) updates the float32 master weights and rounds the parameters
 * from them. The model gives the tensor layout (which elements decay). */
void loom_adamw_step(struct loom_adamw *opt, const struct loom_model *m, struct loom_buf params,
                     struct loom_buf grads, double lr, float grad_scale);

#endif
