/*
 * Inside the settings table: the row type, the table, each row's origin and
 * the start-up warnings, shared by the flag parser (config.c) and the
 * DeepSpeed JSON reader (config_json.c). Nothing else includes this.
 */
#ifndef LOOM_ENGINE_CONFIG_IMPL_H
#define LOOM_ENGINE_CONFIG_IMPL_H

#include <stddef.h>

#include "loom/config.h"

enum setting_type {
    T_INT = 0,
    T_INT64 = 1,
    T_DOUBLE = 2,
    T_STRING = 3,
    T_PATHS = 4,
    T_ENUM = 5,
    T_BOOL = 6,
    T_TYPE_COUNT
};

/* Where a value came from, in rising precedence (derived: computed from others). */
enum origin { O_DEFAULT = 0, O_PRESET = 1, O_JSON = 2, O_FLAG = 3, O_DERIVED = 4, O_ORIGIN_COUNT };

/* How a JSON value becomes the setting's value. */
enum json_conv {
    J_SAME = 0,
    J_NOT = 1,         /* a boolean, inverted (overlap_comm -> --no-overlap) */
    J_ELEMENTS_MB = 2, /* a count of fp32 elements -> MB (4 bytes each, 1 MB = 1e6 bytes) */
    J_POW2 = 3,        /* an integer power P -> 2^P (initial_scale_power) */
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
    const char *def; /* default, parsed like a flag value; NULL: set by the --model preset */
    const char *const *choices;
    const char *help;
    enum json_conv conv;  /* optional, J_SAME by default */
    const char *json_alt; /* optional: a second path, applied after json (it wins) */
};

extern const struct setting loom_settings[];
extern const int loom_nsettings;

/* Records that setting i was set from the JSON file at `path`. */
void loom_setting_from_json(int i, const char *path);
/* The T_PATHS list of a setting; clearing frees the strings. */
void loom_setting_clear_paths(struct loom_config *cfg, const struct setting *s);
int loom_setting_add_path(struct loom_config *cfg, const struct setting *s, const char *path);
/* The value as the configuration table prints it. */
void loom_setting_format(char *buf, size_t n, const struct loom_config *cfg, const struct setting *s);

/* Levenshtein distance of two short strings (99 past 63 characters). */
int loom_edit_distance(const char *a, const char *b);

/* A start-up warning, printed once (rank 0) when the configuration is
 * resolved: at parse time every rank would print it. */
void loom_config_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Reads a DeepSpeed JSON config onto cfg (config_json.c). */
int loom_config_read_json(struct loom_config *cfg, const char *file);

#endif
