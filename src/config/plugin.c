/*
 * --plugin NAME (and "plugin" in the JSON): ColossalAI's Booster plugins and
 * Accelerate's strategy names, each mapped onto the settings of one of
 * loom's layouts. A plugin sets what its layout means; each value it sets
 * shows the origin "plugin" in the printed settings, and one the user gave
 * (flag or JSON) with another value is an error naming both.
 *
 *   torch_ddp        DDP: --zero-stage 0, no tensor or pipeline parallelism
 *   torch_fsdp       FSDP (ZeRO-3 by its names): --fsdp-sharding-strategy
 *                    FULL_SHARD unless another of FSDP's strategies is given
 *   low_level_zero   ZeRO-1 or 2 (--plugin-stage, ColossalAI's stage=)
 *   gemini           ZeRO-3 with --offload auto: what goes to NVMe decided
 *                    from --mem-per-rank (app/placement.c); in memory when
 *                    everything fits, and --nvme-path asked for only when
 *                    the placement must offload
 *   hybrid_parallel  --tp, --pp (ColossalAI's tp_size, pp_size) and
 *                    --zero-stage as given
 *   deepspeed        the JSON (--deepspeed-config) decides; needs one
 *   megatron         the flags decide
 *
 * Not here: the layouts themselves, which the engine builds from these
 * settings as from any others.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "config/config.h"
#include "config/config_impl.h"

int loom_config_set_as(struct loom_config *cfg, const char *flag, const char *value, enum loom_origin origin,
                       const char *who)
{
    const struct setting *s = loom_setting_find(flag, strlen(flag));
    LOOM_ASSERT(s != NULL);
    const int i = (int)(s - loom_settings);
    const enum loom_origin had = (enum loom_origin)cfg->rec.origin[i];
    if (had == LOOM_ORIGIN_FLAG || had == LOOM_ORIGIN_JSON) {
        /* the value given stays; another one than this contradicts it */
        struct loom_config want = *cfg;
        char now[160], asked[160];
        int rc = loom_setting_set(&want, s, value);
        LOOM_ASSERT(rc == LOOM_OK);
        loom_setting_format(now, sizeof now, cfg, s);
        loom_setting_format(asked, sizeof asked, &want, s);
        if (strcmp(now, asked) != 0)
            return loom_error_set(LOOM_ERR_INPUT, "%s sets %s %s, but %s %s is given%s", who, s->flag, asked,
                                  s->flag, now, had == LOOM_ORIGIN_JSON ? " (in the JSON file)" : "");
        return LOOM_OK;
    }
    int rc = loom_setting_set(cfg, s, value);
    if (rc == LOOM_OK) cfg->rec.origin[i] = (uint8_t)origin;
    return rc;
}

/* The settings of a plugin that runs one data-parallel group of whole
 * models: no tensor or pipeline parallelism. */
static int data_parallel_only(struct loom_config *cfg, const char *who)
{
    int rc = loom_config_set_as(cfg, "--tensor-model-parallel-size", "1", LOOM_ORIGIN_PLUGIN, who);
    if (rc == LOOM_OK)
        rc = loom_config_set_as(cfg, "--pipeline-model-parallel-size", "1", LOOM_ORIGIN_PLUGIN, who);
    return rc;
}

int loom_config_apply_plugin(struct loom_config *cfg)
{
    /* the name as the settings table spells it */
    const char *name =
        loom_settings[loom_setting_index(offsetof(struct loom_config, plugin))].choices[cfg->plugin];
    char who[64], stage[8];
    snprintf(who, sizeof who, "--plugin %s", name);
    if (cfg->layout_auto && cfg->plugin != LOOM_PLUGIN_NONE && cfg->plugin != LOOM_PLUGIN_MEGATRON)
        return loom_error_set(LOOM_ERR_INPUT, "--layout auto and %s both set the layout: choose one", who);
    if (cfg->plugin != LOOM_PLUGIN_LOW_LEVEL_ZERO && loom_config_given(cfg, "--plugin-stage"))
        return loom_error_set(LOOM_ERR_INPUT, "--plugin-stage is low_level_zero's ZeRO stage; %s",
                              cfg->plugin ? who : "no --plugin is given");
    int rc = LOOM_OK;
    switch (cfg->plugin) {
    case LOOM_PLUGIN_NONE:
    case LOOM_PLUGIN_MEGATRON:
    case LOOM_PLUGIN_HYBRID_PARALLEL:
        return LOOM_OK;
    case LOOM_PLUGIN_TORCH_DDP:
        if ((rc = data_parallel_only(cfg, who))) return rc;
        return loom_config_set_as(cfg, "--zero-stage", "0", LOOM_ORIGIN_PLUGIN, who);
    case LOOM_PLUGIN_TORCH_FSDP:
        if ((rc = data_parallel_only(cfg, who))) return rc;
        if (loom_config_given(cfg, "--fsdp-sharding-strategy")) return LOOM_OK; /* FSDP's own names decide */
        return loom_config_set_as(cfg, "--fsdp-sharding-strategy", "FULL_SHARD", LOOM_ORIGIN_PLUGIN, who);
    case LOOM_PLUGIN_LOW_LEVEL_ZERO:
        if ((rc = data_parallel_only(cfg, who))) return rc;
        snprintf(stage, sizeof stage, "%d", cfg->plugin_stage);
        return loom_config_set_as(cfg, "--zero-stage", stage, LOOM_ORIGIN_PLUGIN, who);
    case LOOM_PLUGIN_GEMINI: /* without --nvme-path it runs in memory when all fits, as Gemini does */
        if ((rc = data_parallel_only(cfg, who))) return rc;
        if ((rc = loom_config_set_as(cfg, "--zero-stage", "3", LOOM_ORIGIN_PLUGIN, who))) return rc;
        return loom_config_set_as(cfg, "--offload", "auto", LOOM_ORIGIN_PLUGIN, who);
    case LOOM_PLUGIN_DEEPSPEED:
        if (!*cfg->deepspeed_config)
            return loom_error_set(LOOM_ERR_INPUT,
                                  "%s: the DeepSpeed JSON decides the layout; give --deepspeed-config "
                                  "FILE",
                                  who);
        return LOOM_OK;
    case LOOM_PLUGIN_COUNT:
        break;
    }
    LOOM_ASSERT(!"a plugin without settings");
    return LOOM_ERR_INPUT;
}
