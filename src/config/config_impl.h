/*
 * Inside the settings table: the row type, the table, and the helpers the
 * parts of the configuration share: flag and JSON parsing (parse.c,
 * json.c), derived values (resolve.c), help and printing (print.c). Every
 * helper takes the configuration it works on; none keeps state. Nothing
 * outside src/config/ includes this.
 */
#ifndef LOOM_CONFIG_CONFIG_IMPL_H
#define LOOM_CONFIG_CONFIG_IMPL_H

#include <stddef.h>

#include "loom/config.h"

enum setting_type {
    T_INT = 0,
    T_INT64 = 1,
    T_DOUBLE = 2,
    T_STRING = 3,
    T_PATHS = 4, /* char *[LOOM_MAX_DATA_PATHS], its count at .count */
    T_ENUM = 5,  /* an enum field, its names in .choices */
    T_BOOL = 6,
    T_PRESET = 7, /* a string naming a preset of a model family (model/family.h) */
    T_TYPE_COUNT
};

/* How a JSON value becomes the setting's value. */
enum json_conv {
    J_SAME = 0,
    J_NOT = 1,         /* a boolean, inverted (overlap_comm -> --no-overlap) */
    J_ELEMENTS_MB = 2, /* a count of fp32 elements -> MB (4 bytes each, 1 MB = 1e6 bytes) */
    J_POW2 = 3,        /* an integer power P -> 2^P (initial_scale_power) */
    J_INT_LIST = 4,    /* an array of integers (or null) -> "a,b,c" text (sparse_attention's lists) */
    J_INT_TEXT = 5,    /* an integer -> its text, or a string as it is (moe_layer_freq: N or a list) */
    J_CONV_COUNT
};

struct setting {
    const char *flag;
    const char *json; /* JSON path: DeepSpeed's key where it has one, else the flag's name
                         with '_' at the top level; NULL: flag only */
    const char *group;
    enum setting_type type;
    size_t offset, size; /* size: capacity of a T_STRING field */
    double min, max;
    const char *def; /* default, parsed like a flag value; NULL: set by the --model preset
                        (T_PRESET: the registry's first preset) */
    const char *const *choices;
    const char *help;     /* one line; README's settings section explains more */
    enum json_conv conv;  /* optional, J_SAME by default */
    const char *json_alt; /* optional: a second path, applied after json (it wins) */
    size_t count;         /* T_PATHS: offset of the int that counts the list */
    int joint;            /* optional: resolved together with the other joint rows of its group
                             (the batch invariant), so a preset sets it only while none is given */
};

extern const struct setting loom_settings[];
extern const int loom_nsettings;

/* ---- the table (table.c) ---- */

/* The row of a loom_config field, by its offset (a bug if none). */
int loom_setting_index(size_t offset);
/* The row of a flag (its first len characters; aliases included), or NULL. */
const struct setting *loom_setting_find(const char *flag, size_t len);
/* The flag nearest to an unknown one, or NULL when none is near. */
const char *loom_setting_nearest(const char *flag);
/* Levenshtein distance of two short strings (99 past 63 characters). */
int loom_edit_distance(const char *a, const char *b);

/* ---- values (parse.c) ---- */

/* Sets a row from text, as a flag gives it; LOOM_ERR_INPUT naming the flag. */
int loom_setting_set(struct loom_config *cfg, const struct setting *s, const char *text);
/* The T_PATHS list of a row; clearing frees the strings. */
void loom_setting_clear_paths(struct loom_config *cfg, const struct setting *s);
int loom_setting_add_path(struct loom_config *cfg, const struct setting *s, const char *path);
/* A row's default as text (NULL: the preset sets it). */
const char *loom_setting_default(const struct setting *s);
/* Records that row i was set from the JSON file at `path` (static text). */
void loom_setting_from_json(struct loom_config *cfg, int i, const char *path);
/* How messages name a row: by the JSON key its value came from, else by its flag. */
const char *loom_setting_name(const struct loom_config *cfg, int i);
/* A start-up warning, kept in cfg and printed once (rank 0) when the
 * configuration is resolved: at parse time every rank would print it. */
void loom_config_warn(struct loom_config *cfg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* argv[*i] when it is one of Megatron-LM's flags that loom has no setting
 * for (megatron_flags.c): 1 when taken with no effect (its values read,
 * *i past them, a warning saying why), -1 when refused (the error set), 0
 * when it is not one of them. */
int loom_megatron_flag(struct loom_config *cfg, int argc, char **argv, int *i);

/* ---- printing (print.c) ---- */

/* The value as the configuration table prints it. */
void loom_setting_format(char *buf, size_t n, const struct loom_config *cfg, const struct setting *s);
/* --plugin's settings (plugin.c), after the flags and the JSON. */
int loom_config_apply_plugin(struct loom_config *cfg);

/* ---- DeepSpeed JSON (json.c) ---- */

/* Reads a DeepSpeed JSON config onto cfg. */
int loom_config_read_json(struct loom_config *cfg, const char *file);

#endif
