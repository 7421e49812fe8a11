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

/* loom_config_parse and loom_config_free are public:
 * loom/config.h. */

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

/* Per-setting fingerprints, to check that every rank runs the same config. */
int loom_config_count(void);
uint64_t loom_config_hash(const struct loom_config *cfg, int i, const char **flag);

#endif
