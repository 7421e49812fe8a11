/*
 * Llama's weights converter (model/convert.h), `loom convert IN OUT`:
 *
 *   safetensors  one file under Hugging Face's names, with loom's metadata
 *   hf           a directory with model.safetensors, config.json and
 *                generation_config.json, which LlamaForCausalLM loads
 *   checkpoint   (input only) a loom checkpoint, any layout
 *
 * Every input is read into one loom Llama model in memory and written from
 * it, so converting loom's own output again gives the same bytes.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "base/mem.h"
#include "io/checkpoint.h"
#include "io/fs.h"
#include "model/convert.h"
#include "model/family.h"
#include "model/llama.h"
#include "model/llama_hf.h"
#include "model/llama_io.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: loom convert IN OUT [--to safetensors|hf]\n\n"
               "Converts Llama weights. IN is a Hugging Face directory (model.safetensors, config.json),\n"
               "a safetensors file with loom's metadata or a config.json beside it, or a loom checkpoint\n"
               "(any parallel layout). OUT's kind comes from --to, else its name:\n"
               "  NAME.safetensors  one safetensors file (with loom's metadata)\n"
               "  DIR               Hugging Face directory: model.safetensors + config.json +\n"
               "                    generation_config.json\n");
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int read_input(const char *path, const struct loom_convert_env *env, struct loom_decoder **out)
{
    if (loom_ckpt_is_checkpoint(path)) {
        struct loom_model *m;
        int rc = env->read_checkpoint(path, &m);
        if (rc) return rc;
        if (loom_model_family_of(m) != &loom_llama_family) {
            rc = loom_error_set(LOOM_ERR_INPUT, "%s holds a %s model, not Llama", path, m->name);
            loom_model_family_of(m)->destroy(m);
            return rc;
        }
        *out = loom_decoder_of(m);
        return LOOM_OK;
    }
    struct loom_model_shape shape;
    struct loom_llama_config cfg;
    int rc = loom_llama_source_shape(path, &shape);
    if (rc == LOOM_OK && (rc = loom_llama_config_of_shape(&shape, &cfg)) == LOOM_OK)
        rc = loom_llama_config_check(&cfg, 1);
    if (rc) return rc;
    *out = loom_llama_create(&cfg, 1, 1);
    loom_model_alloc_arenas(&(*out)->base, 1, LOOM_MODEL_PARAM_ARENA);
    if ((rc = loom_llama_load(*out, path))) {
        loom_decoder_free(*out);
        *out = NULL;
    }
    return rc;
}

/* A JSON text written crash-safely, with a final newline; consumes text. */
static int write_json(const char *dir, const char *name, char *text)
{
    char path[4200];
    snprintf(path, sizeof path, "%s%s%s", dir, ends_with(dir, "/") ? "" : "/", name);
    if (!text) return loom_error_set(LOOM_ERR_RUNTIME, "out of memory formatting %s", path);
    const void *parts[] = {text, "\n"};
    const size_t sizes[] = {strlen(text), 1};
    int rc = loom_fs_write_atomic(path, parts, sizes, 2);
    cJSON_free(text);
    return rc;
}

static int write_hf_dir(const char *dir, const struct loom_decoder *m)
{
    int rc = loom_fs_mkdir_p(dir);
    if (rc) return rc;
    char weights[4200];
    snprintf(weights, sizeof weights, "%s%smodel.safetensors", dir, ends_with(dir, "/") ? "" : "/");
    const struct loom_llama_config c = loom_llama_config_of(m);
    if ((rc = loom_llama_save(m, weights)) == LOOM_OK &&
        (rc = write_json(dir, "config.json", loom_llama_hf_config_json(&c))) == LOOM_OK)
        rc = write_json(dir, "generation_config.json", loom_llama_hf_generation_config_json(&c));
    return rc;
}

static int run(int argc, char **argv, const struct loom_convert_env *env)
{
    const char *in = NULL, *out = NULL, *to = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return LOOM_OK;
        }
        if (strcmp(argv[i], "--to") == 0 && i + 1 < argc) {
            to = argv[++i];
            if (strcmp(to, "safetensors") != 0 && strcmp(to, "hf") != 0)
                return loom_error_set(LOOM_ERR_INPUT, "--to: Llama converts to safetensors or hf, got '%s'",
                                      to);
        } else if (strncmp(argv[i], "--", 2) == 0) {
            return loom_error_set(LOOM_ERR_INPUT, "unknown flag %s for loom convert of Llama weights (--to)",
                                  argv[i]);
        } else if (!in) {
            in = argv[i];
        } else if (!out) {
            out = argv[i];
        } else {
            return loom_error_set(LOOM_ERR_INPUT, "loom convert takes IN and OUT; extra argument '%s'",
                                  argv[i]);
        }
    }
    if (!in || !out) return loom_error_set(LOOM_ERR_INPUT, "usage: loom convert IN OUT [flags] (see --help)");
    const int to_file = to ? strcmp(to, "safetensors") == 0 : ends_with(out, ".safetensors");
    if (!to && !to_file && ends_with(out, ".bin"))
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: llm.c checkpoints hold GPT-2 models only; give a .safetensors "
                              "file or a directory",
                              out);
    struct loom_decoder *m = NULL;
    int rc = read_input(in, env, &m);
    if (rc) return rc;
    rc = to_file ? loom_llama_save(m, out) : write_hf_dir(out, m);
    if (rc == LOOM_OK)
        printf("converted %s\n       to %s (%s, L=%d C=%d NH=%d G=%d F=%d V=%d)\n", in, out,
               to_file ? "safetensors" : "Hugging Face directory", m->spec.num_layers, m->spec.hidden,
               m->spec.heads, m->spec.kv_heads, m->spec.ffn, m->spec.vocab);
    loom_decoder_free(m);
    return rc;
}

const struct loom_model_converter loom_llama_converter = {
    .usage = usage,
    .run = run,
};
