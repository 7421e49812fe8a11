/*
 * The settings table and what is built from it: flag parsing, DeepSpeed JSON
 * configs (--deepspeed-config), presets, derived values (the batch
 * invariant), validation, --help and the printed configuration.
 */
#ifndef LOOM_ENGINE_CONFIG_H
#define LOOM_ENGINE_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "loom/config.h"

/* Fills cfg from defaults, the --model preset, the JSON file of
 * --deepspeed-config and the flags in argv (the arguments after the
 * subcommand), in that order of precedence. `--help` sets *help and returns
 * LOOM_OK without reading anything. Errors: LOOM_ERR_INPUT with one line
 * naming the flag, JSON key or file and the value. Warnings (unknown JSON
 * keys, keys accepted but ignored, flags overriding the file) are kept and
 * printed once by loom_config_resolve, when the ranks are known. */
int loom_config_parse(struct loom_config *cfg, int argc, char **argv, int *help);

/* Prints the parse warnings (rank 0), derives the batch settings (global =
 * micro x accumulation x dp) and checks cross-setting invariants; dp is the
 * data-parallel size. */
int loom_config_resolve(struct loom_config *cfg, int dp);

/* The i-th warning kept by loom_config_parse and not yet printed, or NULL. */
const char *loom_config_warning(int i);

/* Every flag with its help, default and JSON key. */
void loom_config_print_help(FILE *f, const char *command);
/* The resolved configuration as one table, each setting with its origin:
 * default, preset, json, flag, "flag (json had X)" or derived. */
void loom_config_print(FILE *f, const struct loom_config *cfg);
void loom_config_free(struct loom_config *cfg);

/* Per-setting fingerprints, to check that every rank runs the same config. */
int loom_config_count(void);
uint64_t loom_config_hash(const struct loom_config *cfg, int i, const char **flag);

#endif
