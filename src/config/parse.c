/*
 * Parsing: defaults, the DeepSpeed JSON file (json.c), `--flag value` and
 * `--flag=value`, then the --model preset under all of them, each value's
 * origin (default, preset, json, flag, derived) and the start-up warnings,
 * all kept in the configuration itself (cfg->rec): parsing has no state of
 * its own. Presets come from the model families (model/family.h). Not here:
 * derived values and invariants (resolve.c), printing (print.c).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "config/config.h"
#include "config/config_impl.h"
#include "io/model_shape.h"
#include "model/family.h"

#define F(field) offsetof(struct loom_config, field)

static int origin_of(const struct loom_config *cfg, size_t offset)
{
    return cfg->rec.origin[loom_setting_index(offset)];
}

/* Given by the user, in the JSON file or as a flag. */
static int given_at(const struct loom_config *cfg, int i)
{
    return cfg->rec.origin[i] == LOOM_ORIGIN_JSON || cfg->rec.origin[i] == LOOM_ORIGIN_FLAG;
}

static int *path_count(struct loom_config *cfg, const struct setting *s)
{
    return (int *)((char *)cfg + s->count);
}

void loom_setting_clear_paths(struct loom_config *cfg, const struct setting *s)
{
    char **paths = (char **)((char *)cfg + s->offset);
    int *n = path_count(cfg, s);
    for (int i = 0; i < *n; i++) free(paths[i]);
    *n = 0;
}

int loom_setting_add_path(struct loom_config *cfg, const struct setting *s, const char *path)
{
    char **paths = (char **)((char *)cfg + s->offset);
    int *n = path_count(cfg, s);
    if (*n >= LOOM_MAX_DATA_PATHS)
        return loom_error_set(LOOM_ERR_INPUT, "%s: more than %d paths", s->flag, LOOM_MAX_DATA_PATHS);
    paths[*n] = strdup(path);
    LOOM_ASSERT(paths[*n]);
    (*n)++;
    return LOOM_OK;
}

int loom_setting_set(struct loom_config *cfg, const struct setting *s, const char *v)
{
    char *p = (char *)cfg + s->offset;
    char *end;
    errno = 0;
    switch (s->type) {
    case T_INT:
    case T_INT64: {
        long long x = strtoll(v, &end, 10);
        if (!errno && end != v && *end && !strpbrk(v, "xXpP")) { /* JSON's forms: 1e6, 5.0e8 (whole) */
            const double d = strtod(v, &end);
            x = !*end && d == floor(d) && fabs(d) < 0x1p62 ? (long long)d : 0;
            if (x != d) end = (char *)v;
        }
        if (errno || end == v || *end || x < s->min || x > s->max)
            return loom_error_set(LOOM_ERR_INPUT, "%s: expected an integer in [%.0f, %.0f], got '%s'",
                                  s->flag, s->min, s->max, v);
        if (s->type == T_INT)
            *(int *)p = (int)x;
        else
            *(int64_t *)p = x;
        return LOOM_OK;
    }
    case T_DOUBLE: {
        double x = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(x) || x < s->min || x > s->max) {
            char lo[32], hi[32]; /* exactly: %g would call 0.99999994 1 */
            loom_real_text(s->min, lo, sizeof lo);
            loom_real_text(s->max, hi, sizeof hi);
            return loom_error_set(LOOM_ERR_INPUT, "%s: expected a number in [%s, %s], got '%s'", s->flag, lo,
                                  hi, v);
        }
        *(double *)p = x;
        return LOOM_OK;
    }
    case T_STRING:
    case T_PRESET: /* checked against the registry once every source is read */
        if (strlen(v) >= s->size)
            return loom_error_set(LOOM_ERR_INPUT, "%s: value longer than %zu characters", s->flag,
                                  s->size - 1);
        strcpy(p, v);
        return LOOM_OK;
    case T_BOOL:
        if (strcmp(v, "1") == 0 || strcmp(v, "true") == 0)
            *(int *)p = 1;
        else if (strcmp(v, "0") == 0 || strcmp(v, "false") == 0)
            *(int *)p = 0;
        else
            return loom_error_set(LOOM_ERR_INPUT, "%s: expected true or false, got '%s'", s->flag, v);
        return LOOM_OK;
    case T_ENUM:
        for (int i = 0; s->choices[i]; i++)
            if (strcmp(s->choices[i], v) == 0) {
                *(int *)p = i;
                return LOOM_OK;
            }
        return loom_error_set(LOOM_ERR_INPUT, "%s: unknown value '%s'", s->flag, v);
    case T_PATHS:
        return loom_setting_add_path(cfg, s, v);
    default:
        LOOM_ASSERT(0);
    }
    return LOOM_OK;
}

const char *loom_setting_default(const struct setting *s)
{
    if (s->type == T_PRESET && !s->def) {
        const struct loom_model_family *first = loom_model_family_at(0);
        LOOM_ASSERT(first && first->npresets > 0);
        return first->presets[0].name;
    }
    return s->def;
}

void loom_setting_from_json(struct loom_config *cfg, int i, const char *path)
{
    cfg->rec.origin[i] = LOOM_ORIGIN_JSON;
    cfg->rec.json_path[i] = path;
}

const char *loom_setting_name(const struct loom_config *cfg, int i)
{
    return cfg->rec.origin[i] == LOOM_ORIGIN_JSON && cfg->rec.json_path[i] ? cfg->rec.json_path[i]
                                                                           : loom_settings[i].flag;
}

void loom_config_warn(struct loom_config *cfg, const char *fmt, ...)
{
    struct loom_config_record *r = &cfg->rec;
    if (r->nwarnings == LOOM_CONFIG_MAX_WARNINGS) {
        r->nwarnings_dropped++;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->warnings[r->nwarnings++], sizeof r->warnings[0], fmt, ap);
    va_end(ap);
}

const char *loom_config_warning(const struct loom_config *cfg, int i)
{
    return i >= 0 && i < cfg->rec.nwarnings ? cfg->rec.warnings[i] : NULL;
}

enum loom_origin loom_config_origin(const struct loom_config *cfg, const char *flag)
{
    char name[64];
    snprintf(name, sizeof name, "%s%s", strncmp(flag, "--", 2) == 0 ? "" : "--", flag);
    const struct setting *s = loom_setting_find(name, strlen(name));
    if (!s) {
        char msg[128];
        snprintf(msg, sizeof msg, "loom_config_origin: no setting is named '%s'", flag);
        loom_abort(__FILE__, __LINE__, msg);
    }
    return (enum loom_origin)cfg->rec.origin[s - loom_settings];
}

int loom_config_given(const struct loom_config *cfg, const char *flag)
{
    enum loom_origin o = loom_config_origin(cfg, flag);
    return o == LOOM_ORIGIN_JSON || o == LOOM_ORIGIN_FLAG;
}

void loom_config_adopt(struct loom_config *cfg, const struct loom_config *from, const char *group)
{
    for (int i = 0; i < loom_nsettings; i++) {
        const struct setting *s = &loom_settings[i];
        if (strcmp(s->group, group) != 0 || given_at(cfg, i)) continue;
        LOOM_ASSERT(s->type != T_PATHS); /* the list's strings belong to one configuration */
        size_t n = s->type == T_STRING || s->type == T_PRESET  ? s->size
                   : s->type == T_INT64 || s->type == T_DOUBLE ? 8
                                                               : sizeof(int);
        char *dst = (char *)cfg + s->offset;
        const char *src = (const char *)from + s->offset;
        if (memcmp(dst, src, n) == 0) continue;
        memcpy(dst, src, n);
        cfg->rec.origin[i] = LOOM_ORIGIN_LOAD;
    }
}

/* The presets of every family, for a message: "a, b, c". */
static void preset_names(char *buf, size_t n)
{
    buf[0] = 0;
    const struct loom_model_family *f;
    for (int i = 0; (f = loom_model_family_at(i)); i++)
        for (int k = 0; k < f->npresets; k++) {
            size_t l = strlen(buf);
            snprintf(buf + l, n - l, "%s%s", *buf ? ", " : "", f->presets[k].name);
        }
}

/* Whether a joint row of `group` (the batch invariant) is given. */
static int joint_given(const struct loom_config *cfg, const char *group)
{
    for (int i = 0; i < loom_nsettings; i++)
        if (loom_settings[i].joint && strcmp(loom_settings[i].group, group) == 0 && given_at(cfg, i))
            return 1;
    return 0;
}

/* A preset's settings, each only where its value is still the default; a
 * joint row only while no row of its group is given (a preset's micro-batch
 * does not turn --global-batch-size N into more accumulation steps). */
static void apply_preset(struct loom_config *cfg, const struct loom_model_preset *p)
{
    for (int k = 0; k < LOOM_PRESET_MAX_SETTINGS && p->settings[k].flag; k++) {
        const char *flag = p->settings[k].flag;
        const struct setting *s = loom_setting_find(flag, strlen(flag));
        LOOM_ASSERT(s && s->type != T_PATHS && s->type != T_PRESET);
        const int i = (int)(s - loom_settings);
        if (cfg->rec.origin[i] != LOOM_ORIGIN_DEFAULT || (s->joint && joint_given(cfg, s->group))) continue;
        LOOM_ASSERT(loom_setting_set(cfg, s, p->settings[k].value) == LOOM_OK);
        cfg->rec.origin[i] = LOOM_ORIGIN_PRESET;
    }
    /* a preset's position table grows to a longer sequence given */
    if (origin_of(cfg, F(max_position_embeddings)) == LOOM_ORIGIN_PRESET &&
        cfg->seq_length > cfg->max_position_embeddings && given_at(cfg, loom_setting_index(F(seq_length))))
        cfg->max_position_embeddings = cfg->seq_length;
}

/* The JSON file named by the last --deepspeed-config in argv, or NULL. */
static const char *find_json_file(int argc, char **argv)
{
    const char *file = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const struct setting *s = strncmp(a, "--", 2) == 0 ? loom_setting_find(a, len) : NULL;
        if (!s || s->offset != F(deepspeed_config)) continue;
        if (eq)
            file = eq + 1;
        else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
            file = argv[++i];
    }
    return file;
}

static int parse_flags(struct loom_config *cfg, int argc, char **argv)
{
    int rc;
    /* a path list flag takes every value up to the next flag */
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0)
            return loom_error_set(LOOM_ERR_INPUT, "unexpected argument '%s' (flags start with --)", a);
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const struct setting *s = loom_setting_find(a, len);
        const int megatron = s ? 0 : loom_megatron_flag(cfg, argc, argv, &i);
        if (megatron < 0) return LOOM_ERR_INPUT;
        if (megatron) continue;
        if (!s) {
            char flag[128];
            snprintf(flag, sizeof flag, "%.*s", (int)len, a);
            const char *near = loom_setting_nearest(flag);
            if (near) return loom_error_set(LOOM_ERR_INPUT, "unknown flag %s (did you mean %s?)", flag, near);
            return loom_error_set(LOOM_ERR_INPUT, "unknown flag %s (see loom train --help)", flag);
        }
        const int idx = (int)(s - loom_settings);
        /* a repeated path flag adds to the list; the first one replaces the default or the JSON's */
        if (s->type == T_PATHS && cfg->rec.origin[idx] != LOOM_ORIGIN_FLAG) loom_setting_clear_paths(cfg, s);
        if (eq) {
            if ((rc = loom_setting_set(cfg, s, eq + 1))) return rc;
        } else if (s->type == T_BOOL) {
            *(int *)((char *)cfg + s->offset) = 1;
        } else {
            if (i + 1 >= argc || (strncmp(argv[i + 1], "--", 2) == 0))
                return loom_error_set(LOOM_ERR_INPUT, "%s needs a value", s->flag);
            if ((rc = loom_setting_set(cfg, s, argv[++i]))) return rc;
            while (s->type == T_PATHS && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
                if ((rc = loom_setting_set(cfg, s, argv[++i]))) return rc;
        }
        cfg->rec.origin[idx] = LOOM_ORIGIN_FLAG;
    }
    return LOOM_OK;
}

/* Megatron's pretrain_gpt.py has no --model: its shape flags say the model.
 * Without --model, flags that only Llama's kind of decoder has (RMSNorm,
 * SwiGLU, rotary positions) take llama-tiny's family, and experts
 * mixtral-tiny's, so a Megatron script's flags build that model; said in
 * one line. */
static void infer_family(struct loom_config *cfg)
{
    if (origin_of(cfg, F(model)) != LOOM_ORIGIN_DEFAULT) return;
    const int llama =
        (given_at(cfg, loom_setting_index(F(normalization))) && cfg->normalization == LOOM_NORM_RMSNORM) ||
        (given_at(cfg, loom_setting_index(F(swiglu))) && cfg->swiglu) ||
        (given_at(cfg, loom_setting_index(F(position_embedding_type))) &&
         cfg->position_embedding_type == LOOM_POSITION_ROPE);
    if (!llama) return;
    const char *preset = cfg->num_experts > 0 ? "mixtral-tiny" : "llama-tiny";
    snprintf(cfg->model, sizeof cfg->model, "%s", preset);
    cfg->rec.origin[loom_setting_index(F(model))] = LOOM_ORIGIN_DERIVED;
    loom_config_warn(cfg,
                     "no --model: the flags (RMSNorm, SwiGLU or rotary positions%s) build %s's family, as "
                     "Megatron's pretrain_gpt.py builds its model from them",
                     cfg->num_experts > 0 ? ", experts" : "", preset);
}

int loom_config_parse(struct loom_config *cfg, int argc, char **argv, int *help)
{
    memset(cfg, 0, sizeof *cfg); /* every origin LOOM_ORIGIN_DEFAULT, no warnings */
    *help = 0;
    int rc;
    for (int i = 0; i < loom_nsettings; i++) {
        const char *def = loom_setting_default(&loom_settings[i]);
        if (def && (rc = loom_setting_set(cfg, &loom_settings[i], def))) return rc;
    }
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) { /* 2: --help all */
            *help = i + 1 < argc && strcmp(argv[i + 1], "all") == 0 ? 2 : 1;
            return LOOM_OK;
        }
    /* the JSON file first, then every flag over it; json_had keeps the file's
     * values until the flags show which of them were replaced */
    struct loom_config_record *r = &cfg->rec;
    const char *file = find_json_file(argc, argv);
    if (file && (rc = loom_config_read_json(cfg, file))) return rc;
    /* where the file enables fp16 and leaves its scale out, DeepSpeed starts at 2^16, not at
     * Megatron's 2^32 (loom's default under flags) */
    const int fp16_i = loom_setting_index(F(fp16)), scale_i = loom_setting_index(F(initial_loss_scale));
    if (file && cfg->fp16 && r->origin[fp16_i] == LOOM_ORIGIN_JSON &&
        r->origin[scale_i] == LOOM_ORIGIN_DEFAULT) {
        cfg->initial_loss_scale = 65536;
        r->origin[scale_i] = LOOM_ORIGIN_DS_DEFAULT;
    }
    for (int i = 0; i < loom_nsettings; i++)
        if (r->origin[i] == LOOM_ORIGIN_JSON)
            loom_setting_format(r->json_had[i], sizeof r->json_had[i], cfg, &loom_settings[i]);
    if ((rc = parse_flags(cfg, argc, argv))) return rc;
    for (int i = 0; i < loom_nsettings; i++) {
        char now[sizeof r->json_had[0]];
        if (r->origin[i] == LOOM_ORIGIN_FLAG && r->json_path[i]) {
            loom_setting_format(now, sizeof now, cfg, &loom_settings[i]);
            if (strcmp(now, r->json_had[i]) != 0) {
                loom_config_warn(cfg, "%s %s overrides %s %s from %s", loom_settings[i].flag, now,
                                 r->json_path[i], r->json_had[i], file);
                continue;
            }
        }
        r->json_had[i][0] = 0;
    }
    infer_family(cfg);
    const struct loom_model_preset *p;
    if (!loom_model_family_of_preset(cfg->model, &p)) {
        char names[256];
        preset_names(names, sizeof names);
        return loom_error_set(LOOM_ERR_INPUT, "%s: unknown preset '%s' (%s)",
                              loom_setting_name(cfg, loom_setting_index(F(model))), cfg->model, names);
    }
    apply_preset(cfg, p);
    return loom_config_apply_plugin(cfg);
}

void loom_config_free(struct loom_config *cfg)
{
    for (int i = 0; i < cfg->ndata_paths; i++) free(cfg->data_paths[i]);
    for (int i = 0; i < cfg->nvalid_paths; i++) free(cfg->valid_data_paths[i]);
    for (int i = 0; i < cfg->ntrain_paths; i++) free(cfg->train_data_paths[i]);
    for (int i = 0; i < cfg->ntest_paths; i++) free(cfg->test_data_paths[i]);
    cfg->ndata_paths = cfg->nvalid_paths = cfg->ntrain_paths = cfg->ntest_paths = 0;
}
