/*
 * The configuration inside loom: derived values and invariants once the
 * data-parallel size is known, the start-up warnings parsing kept, --help,
 * the printed configuration and the per-setting fingerprints the ranks
 * compare. loom_config_parse, loom_config_free, loom_config_origin and
 * loom_config_given are public: loom/config.h.
 */
#ifndef LOOM_CONFIG_CONFIG_H
#define LOOM_CONFIG_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "loom/config.h"

/* Prints the parse warnings (rank 0), derives the batch settings (global =
 * micro x accumulation x dp) and the other derived values, and checks
 * cross-setting invariants; dp is the data-parallel size. */
int loom_config_resolve(struct loom_config *cfg, int dp);
/* For the settings checks outside src/config/ (the parallelism kinds',
 * parallel/kinds.h), by a field's offsetof in struct loom_config: how
 * messages name the setting (its flag, or the JSON key that gave it),
 * whether the user gave it (flag or JSON), marking its value derived, and
 * the name of an enum setting's value. */
const char *loom_config_name_of(const struct loom_config *cfg, size_t offset);
int loom_config_given_at(const struct loom_config *cfg, size_t offset);
void loom_config_set_derived(struct loom_config *cfg, size_t offset);
const char *loom_config_choice_of(size_t offset, int value);
/* Sets the setting of flag to value (its text form) with origin, unless
 * the user gave it (flag or JSON): then the value given stays, and another
 * value than this is LOOM_ERR_INPUT naming who (e.g. "--plugin torch_ddp")
 * and both values. */
int loom_config_set_as(struct loom_config *cfg, const char *flag, const char *value, enum loom_origin origin,
                       const char *who);

/* The i-th warning kept by loom_config_parse and not yet printed, or NULL. */
const char *loom_config_warning(const struct loom_config *cfg, int i);

/* Takes from `from` every setting of `group` ("model") whose value differs
 * and that cfg's flags and JSON did not give; their origin becomes
 * LOOM_ORIGIN_LOAD (the model --load names). */
void loom_config_adopt(struct loom_config *cfg, const struct loom_config *from, const char *group);

/* COMMAND's usage: its own flags first (train's common ones, eval's and
 * sample's), then how to see the rest; all: every flag with its help,
 * default and JSON key, by group. */
void loom_config_print_help(FILE *f, const char *command, int all);
/* The resolved configuration as one table, each setting with its origin:
 * default, preset, json, flag, "flag (json had X)" or derived. */
/* The settings table: every setting when all, else those not at their
 * defaults and a line counting the rest. */
void loom_config_print(FILE *f, const struct loom_config *cfg, int all);
/* Setting i (of loom_config_count()): its flag without the dashes, and its
 * value as the table prints it, into value (n bytes). */
void loom_config_setting(const struct loom_config *cfg, int i, const char **name, char *value, size_t n);

/* --moe-layer-freq (moe_layers.c): text as an integer N (freq N, list "")
 * or as a Python list expression of one 0 or 1 a layer (freq 0, the list
 * as '0'/'1' characters, at most LOOM_MOE_MAX_LAYERS); LOOM_ERR_INPUT with
 * one line naming what is wrong. */
int loom_moe_layers_parse(const char *text, struct loom_moe_layers *out);
/* Whether layer l is an MoE layer, and how many of num_layers are. */
int loom_moe_layers_is(const struct loom_moe_layers *m, int l);
int loom_moe_layers_count(const struct loom_moe_layers *m, int num_layers);
/* The setting as text: "N", or the shortest list expression of the layers
 * ("[1,0]*4", "[0]+[1]*3"), as Megatron's flag takes it. */
void loom_moe_layers_text(const struct loom_moe_layers *m, char *buf, size_t cap);

/* Per-setting fingerprints, to check that every rank runs the same config. */
int loom_config_count(void);
uint64_t loom_config_hash(const struct loom_config *cfg, int i, const char **flag);

#endif
