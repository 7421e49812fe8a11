/*
 * The settings as text: one value as the table prints it, --help (every
 * flag with its help, default and JSON key), the resolved configuration
 * with each value's origin, and the per-setting fingerprints the ranks
 * compare. Longer explanations of the settings are in README.md, not here.
 */
#include <assert.h>
#include <string.h>

#include "base/log.h"
#include "config/config.h"
#include "config/config_impl.h"
#include "model/family.h"

static const char *const origin_names[] = {
    "default", "preset", "json", "flag", "derived", "--load", "plugin", "layout auto", "DeepSpeed's default"};
static_assert(sizeof origin_names / sizeof origin_names[0] == LOOM_ORIGIN_COUNT, "origin_names");

void loom_setting_format(char *buf, size_t n, const struct loom_config *cfg, const struct setting *s)
{
    const char *p = (const char *)cfg + s->offset;
    switch (s->type) {
    case T_INT:
        snprintf(buf, n, "%d", *(const int *)p);
        break;
    case T_INT64:
        snprintf(buf, n, "%lld", (long long)*(const int64_t *)p);
        break;
    case T_DOUBLE:
        snprintf(buf, n, "%.15g", *(const double *)p);
        break;
    case T_STRING:
    case T_PRESET:
        snprintf(buf, n, "%s", *p ? p : "-");
        break;
    case T_ENUM:
        snprintf(buf, n, "%s", s->choices[*(const int *)p]);
        break;
    case T_BOOL:
        snprintf(buf, n, "%s", *(const int *)p ? "true" : "false");
        break;
    case T_PATHS: {
        char *const *paths = (char *const *)p;
        const int cnt = *(const int *)((const char *)cfg + s->count);
        buf[0] = 0;
        for (int i = 0; i < cnt; i++) {
            size_t l = strlen(buf);
            snprintf(buf + l, n - l, "%s%s", i ? " " : "", paths[i]);
        }
        if (!cnt) snprintf(buf, n, "-");
        break;
    }
    default:
        LOOM_ASSERT(0);
    }
}

/* A setting's default as the table prints values. */
static void format_default(char *buf, size_t n, const struct setting *s)
{
    const char *def = loom_setting_default(s);
    if (!def) {
        snprintf(buf, n, "%s", s->type == T_PATHS ? "none" : "set by --model");
        return;
    }
    if (s->type == T_STRING || s->type == T_PRESET) {
        snprintf(buf, n, "%s", *def ? def : "none");
        return;
    }
    struct loom_config scratch;
    memset(&scratch, 0, sizeof scratch);
    LOOM_ASSERT(loom_setting_set(&scratch, s, def) == LOOM_OK);
    loom_setting_format(buf, n, &scratch, s);
}

/* A row's help; a preset row lists the registry's presets after it. */
static void format_help(char *buf, size_t n, const struct setting *s)
{
    snprintf(buf, n, "%s", s->help);
    if (s->type != T_PRESET) return;
    const struct loom_model_family *f;
    int first = 1;
    for (int i = 0; (f = loom_model_family_at(i)); i++)
        for (int k = 0; k < f->npresets; k++, first = 0) {
            size_t l = strlen(buf);
            snprintf(buf + l, n - l, "%s%s", first ? " " : ", ", f->presets[k].name);
        }
}

/* One flag's two lines: its argument and help, its default and JSON key. */
static void print_setting(FILE *f, const struct setting *s)
{
    char arg[96], def[64], help[256];
    snprintf(arg, sizeof arg, "%s %s", s->flag,
             s->type == T_INT || s->type == T_INT64 ? "N"
             : s->type == T_DOUBLE                  ? "X"
             : s->type == T_PATHS                   ? "PATH..."
             : s->type == T_ENUM                    ? "CHOICE"
             : s->type == T_BOOL                    ? ""
             : s->type == T_PRESET                  ? "NAME"
                                                    : "VALUE");
    format_default(def, sizeof def, s);
    format_help(help, sizeof help, s);
    fprintf(f, "  %-36s %s\n  %-36s [default: %s]", arg, help, "", def);
    if (s->json)
        fprintf(f, "  json: %s%s%s", s->json, s->json_alt ? ", " : "", s->json_alt ? s->json_alt : "");
    fputc('\n', f);
}

/* The flags a command's short help shows first, in this order. */
static const char *const train_flags[] = {"--model",
                                          "--num-layers",
                                          "--hidden-size",
                                          "--num-attention-heads",
                                          "--seq-length",
                                          "--vocab-size",
                                          "--data-path",
                                          "--valid-data-path",
                                          "--tokenizer",
                                          "--micro-batch-size",
                                          "--global-batch-size",
                                          "--train-iters",
                                          "--lr",
                                          "--min-lr",
                                          "--lr-warmup-iters",
                                          "--lr-decay-style",
                                          "--weight-decay",
                                          "--clip-grad",
                                          "--bf16",
                                          "--fp16",
                                          "--zero-stage",
                                          "--tensor-model-parallel-size",
                                          "--pipeline-model-parallel-size",
                                          "--sequence-parallel",
                                          "--recompute-granularity",
                                          "--layout",
                                          "--deepspeed-config",
                                          "--save",
                                          "--save-interval",
                                          "--load",
                                          "--eval-interval",
                                          "--eval-iters",
                                          "--log-interval",
                                          "--metrics",
                                          "--seed",
                                          "--threads",
                                          NULL};
static const char *const eval_flags[] = {"--load",
                                         "--valid-data-path",
                                         "--mock-data",
                                         "--tokenizer",
                                         "--eval-iters",
                                         "--micro-batch-size",
                                         "--global-batch-size",
                                         "--seq-length",
                                         "--bf16",
                                         "--threads",
                                         NULL};
static const char *const sample_flags[] = {"--load",        "--prompt",  "--max-new-tokens",
                                           "--temperature", "--top-k",   "--tokenizer",
                                           "--seed",        "--threads", NULL};

void loom_config_print_help(FILE *f, const char *command, int all)
{
    const int train = strcmp(command, "train") == 0, eval = strcmp(command, "eval") == 0;
    fprintf(f, "usage: loom %s [flags]\n", command);
    fprintf(f, "%s\n",
            train  ? "Trains a model: one process, or one rank of many under mpirun or loom launch."
            : eval ? "The validation loss of a checkpoint or weights (--load) on --valid-data-path."
                   : "Continues --prompt from a checkpoint or weights (--load).");
    fprintf(f, "Precedence: defaults < --model preset < --deepspeed-config FILE < flags. Each flag's\n"
               "DeepSpeed JSON key follows it (json: PATH; \"auto\" in the file means not given).\n");
    if (all) {
        const char *group = "";
        for (int i = 0; i < loom_nsettings; i++) {
            const struct setting *s = &loom_settings[i];
            if (strcmp(group, s->group) != 0) fprintf(f, "\n%s:\n", group = s->group);
            print_setting(f, s);
        }
        return;
    }
    const char *const *own = train ? train_flags : eval ? eval_flags : sample_flags;
    fprintf(f, "\n%s flags:\n", train ? "common" : command);
    for (int k = 0; own[k]; k++)
        for (int i = 0; i < loom_nsettings; i++)
            if (strcmp(loom_settings[i].flag, own[k]) == 0) print_setting(f, &loom_settings[i]);
    fprintf(
        f,
        "\nloom %s --help all lists every flag (%d, by group: model, parallelism, precision, data, ...).\n",
        command, loom_nsettings);
}

void loom_config_print(FILE *f, const struct loom_config *cfg, int all)
{
    const struct loom_config_record *r = &cfg->rec;
    fprintf(f, "configuration:\n");
    int hidden = 0;
    for (int i = 0; i < loom_nsettings; i++) {
        if (!all && r->origin[i] == LOOM_ORIGIN_DEFAULT) {
            hidden++;
            continue;
        }
        char v[1024], origin[sizeof r->json_had[0] + 32];
        loom_setting_format(v, sizeof v, cfg, &loom_settings[i]);
        if (r->origin[i] == LOOM_ORIGIN_FLAG && r->json_had[i][0])
            snprintf(origin, sizeof origin, "flag (json had %s)", r->json_had[i]);
        else
            snprintf(origin, sizeof origin, "%s", origin_names[r->origin[i]]);
        fprintf(f, "  %-30s %-24s (%s)\n", loom_settings[i].flag + 2, v, origin);
    }
    if (hidden) fprintf(f, "  and %d settings at their defaults (--print-config lists every one)\n", hidden);
}

void loom_config_setting(const struct loom_config *cfg, int i, const char **name, char *value, size_t n)
{
    LOOM_ASSERT(i >= 0 && i < loom_nsettings);
    *name = loom_settings[i].flag + 2;
    loom_setting_format(value, n, cfg, &loom_settings[i]);
}

int loom_config_count(void)
{
    return loom_nsettings;
}

uint64_t loom_config_hash(const struct loom_config *cfg, int i, const char **flag)
{
    LOOM_ASSERT(i >= 0 && i < loom_nsettings);
    char v[4096];
    loom_setting_format(v, sizeof v, cfg, &loom_settings[i]);
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *c = v; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    if (flag) *flag = loom_settings[i].flag;
    return h;
}
