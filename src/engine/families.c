/*
 * loom/families.h: a built-in family's model for a user's own loop, made
 * as the trainer makes it (app/train.c), for the engine's layout.
 */
#include "loom/families.h"

#include "engine/engine_impl.h"
#include "loom/loom.h"
#include "model/family.h"

int loom_family_model_create(const struct loom_engine *e, const struct loom_config *cfg,
                             struct loom_model **out)
{
    *out = NULL;
    const struct loom_model_family *f = loom_model_family_of_preset(cfg->model, NULL);
    if (!f) return loom_error_set(LOOM_ERR_INPUT, "--model %s: no model family has this preset", cfg->model);
    int rc = f->check(cfg, cfg->seq_length);
    if (rc) return rc;
    *out = f->create(cfg, cfg->micro_batch_size, cfg->seq_length, 1, e->topo.tp_rank, e->topo.pp_rank);
    return LOOM_OK;
}

void loom_family_model_free(struct loom_model *m)
{
    const struct loom_model_family *f = m ? loom_model_family_of(m) : NULL;
    if (f) f->destroy(m);
}

double loom_family_model_flops_per_token(const struct loom_model *m)
{
    const struct loom_model_family *f = loom_model_family_of(m);
    return f ? f->flops_per_token(m) : 0;
}
