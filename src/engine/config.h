/*
 * The settings table and what is built from it: flag parsing, presets,
 * derived values (the batch invariant), validation, --help and the printed
 * configuration. JSON configs will read through the same table.
 */
#ifndef LOOM_ENGINE_CONFIG_H
#define LOOM_ENGINE_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "loom/config.h"

/* Fills cfg from defaults, the --model preset and the flags in argv (the
 * arguments after the subcommand), in that order of precedence, then derives
 * and validates. `--help` sets *help and returns LOOM_OK without validating.
 * Errors: LOOM_ERR_INPUT with one line naming the flag and the value. */
int loom_config_parse(struct loom_config *cfg, int argc, char **argv, int *help);

/* Derives the batch settings (global = micro x accumulation x dp) and checks
 * cross-setting invariants; dp is the data-parallel size. */
int loom_config_resolve(struct loom_config *cfg, int dp);

void loom_config_print_help(FILE *f, const char *command);
/* The resolved configuration as one table, each setting with its origin. */
void loom_config_print(FILE *f, const struct loom_config *cfg);
void loom_config_free(struct loom_config *cfg);

/* Per-setting fingerprints, to check that every rank runs the same config. */
int loom_config_count(void);
uint64_t loom_config_hash(const struct loom_config *cfg, int i, const char **flag);

#endif
