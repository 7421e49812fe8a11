// clang-format off
/*
 * libFuzzer target for the DeepSpeed JSON config reader (config/json.c):
 * each input is written to a file and read onto a configuration holding the
 * defaults, as `--deepspeed-config FILE` does before the flags. It must
 * either accept the file or refuse it with LOOM_ERR_INPUT on one line
 * naming the file; an accepted file leaves every setting it gave inside
 * its documented bounds (each prints as text the flag parser takes back). A broken
 * promise aborts, which libFuzzer reports with the input.
 *
 * Not here: presets and flags (parse.c's loom_config_parse, which needs the
 * model families; they are stubbed out below as having no presets).
 *
 * The fuzz-sources line is read whole by the Makefile: formatting is off here.
 *
 * fuzz-sources: src/config/json.c src/config/table.c src/config/parse.c src/config/megatron_flags.c src/config/print.c src/config/plugin.c src/io/fs.c src/io/model_shape.c src/base/log.c src/base/mem.c
 * fuzz-libs: -lcjson
 */
// clang-format on
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "config/config_impl.h"
#include "loom/loom.h"
#include "model/family.h"

#define REQUIRE(cond)                                                                                        \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "fuzz_config_json: broken promise at line %d: %s\n", __LINE__, #cond);           \
            abort();                                                                                         \
        }                                                                                                    \
    } while (0)

/* The reader does not consult the model families; parse.c links against
 * them (the --model default is the first family's first preset): one
 * family of one preset, with no settings, stands in. */
static const struct loom_model_preset preset = {.name = "gpt2-tiny", .summary = "stand-in"};
static const struct loom_model_family family = {.name = "gpt2", .presets = &preset, .npresets = 1};

const struct loom_model_family *loom_model_family_at(int i)
{
    return i == 0 ? &family : NULL;
}
const struct loom_model_family *loom_model_family_of_preset(const char *name,
                                                            const struct loom_model_preset **out)
{
    const int found = strcmp(name, preset.name) == 0;
    if (out) *out = found ? &preset : NULL;
    return found ? &family : NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[64];
    if (!path[0]) snprintf(path, sizeof path, "fuzz-config-%d.json", (int)getpid());
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    REQUIRE(fwrite(data, 1, size, f) == size);
    REQUIRE(fclose(f) == 0);
    struct loom_config *cfg = calloc(1, sizeof *cfg);
    REQUIRE(cfg);
    for (int i = 0; i < loom_nsettings; i++) {
        const char *def = loom_setting_default(&loom_settings[i]);
        if (def) REQUIRE(loom_setting_set(cfg, &loom_settings[i], def) == LOOM_OK);
    }
    loom_error_clear();
    int rc = loom_config_read_json(cfg, path);
    if (rc != LOOM_OK) {
        const char *msg = loom_error_message();
        REQUIRE(rc == LOOM_ERR_INPUT);
        REQUIRE(msg[0] && !strchr(msg, '\n') && strstr(msg, path));
    } else { /* every setting the file set prints as text its own parser takes back (bounds included) */
        for (int i = 0; i < loom_nsettings; i++) {
            if (cfg->rec.origin[i] != LOOM_ORIGIN_JSON) continue;
            char text[1024];
            loom_setting_format(text, sizeof text, cfg, &loom_settings[i]);
            struct loom_config *again = calloc(1, sizeof *again);
            REQUIRE(again);
            if (loom_setting_set(again, &loom_settings[i], text) != LOOM_OK) {
                fprintf(stderr, "fuzz_config_json: %s: '%s': %s\n", loom_settings[i].flag, text,
                        loom_error_message());
                abort();
            }
            loom_config_free(again);
            free(again);
        }
    }
    loom_config_free(cfg);
    free(cfg);
    unlink(path);
    return 0;
}
