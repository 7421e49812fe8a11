/*
 * `loom convert IN OUT`: a model's weights from one file format to another.
 * The formats are the model family's converter's (model/convert.h: the
 * decoder families' are llm.c checkpoints, safetensors files and Hugging
 * Face directories); here are the help listing each converter's once, the
 * dispatch, and the reading of a loom checkpoint (any layout) for a
 * converter, which takes the engine.
 *
 * A Hugging Face directory written from a checkpoint that holds the run's
 * tokenizer (tokenizer.json) gets a copy of it, and what AutoTokenizer and
 * generate read beside it (complete_directory).
 *
 * Not here: the formats themselves.
 */
#include "cli/convert.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "engine/checkpoint.h"
#include "io/checkpoint.h"
#include "io/fs.h"
#include "loom/loom.h"
#include "model/convert.h"
#include "model/family.h"
#include "model/hf_decoder.h"
#include "tokenizer/tokenizer.h"

static int read_checkpoint(const char *path, struct loom_model **out)
{
    return loom_checkpoint_read_model(path, 1, 1, out);
}

/* A Hugging Face directory written from a checkpoint or directory that
 * holds a tokenizer.json or tokenizer.model gets it too (loom train
 * --tokenizer saves it in every checkpoint): its path, "" when there is
 * none. */
static int find_tokenizer(const char *in, char *path, size_t n)
{
    int rc = loom_weights_find_tokenizer(in, path, n); /* a checkpoint's held to its trainer state's record */
    if (rc == LOOM_OK && *path && loom_fs_is_dir(path)) *path = 0; /* vocab.json + merges.txt: not copied */
    return rc;
}

static int copy_tokenizer(const char *path, const char *out)
{
    if (!*path) return LOOM_OK;
    const char *name;
    int rc = loom_tokenizer_export(path, NULL, out, &name);
    if (rc == LOOM_OK) printf("copied %s into %s/%s\n", path, out, name);
    return rc;
}

/* dir/name as JSON (NULL: not there, or not JSON), and written back. */
static cJSON *read_json(const char *dir, const char *name)
{
    char path[4400], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (access(path, F_OK) != 0 || loom_fs_read_small(path, 1 << 20, &text, &len) != LOOM_OK) {
        loom_error_clear();
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(text, len);
    loom_free(text);
    return j;
}

static int write_json(const char *dir, const char *name, const cJSON *j)
{
    return loom_hf_write_json(dir, name, cJSON_Print(j));
}

static void set_number(cJSON *j, const char *key, double v)
{
    cJSON_DeleteItemFromObject(j, key);
    cJSON_AddNumberToObject(j, key, v);
}

/* What AutoTokenizer and generate read beside the weights of a directory
 * given a tokenizer: the tokenizer's beginning- and end-of-text ids (and
 * its padding id, where it has one) in
 * config.json and generation_config.json (the family's stay where it has
 * no such token; a tokenizer with an end of text and no beginning, as
 * GPT-2's, begins with its end, as GPT-2's config.json says),
 * tokenizer_config.json and special_tokens_map.json. Over a tokenizer.json
 * the class is PreTrainedTokenizerFast (encode and decode are the file's,
 * as loom's, with no spaces cleaned up); over a SentencePiece model it is
 * LlamaTokenizer, legacy (its encode is the model's own, as loom's), with
 * add_prefix_space, for a model that puts a space before a text, else
 * GemmaTokenizer, with add_bos_token as the template, so the fast tokenizer
 * transformers converts from it encodes alike. */
static int complete_directory(const char *dir)
{
    struct loom_tokenizer *t;
    int rc = loom_tokenizer_load(dir, NULL, &t);
    if (rc) return rc;
    const int32_t eos = loom_tokenizer_eot(t), bos = loom_tokenizer_bos(t) >= 0 ? loom_tokenizer_bos(t) : eos;
    cJSON *special = cJSON_CreateObject(), *tc = cJSON_CreateObject();
    if (bos >= 0) cJSON_AddStringToObject(special, "bos_token", loom_tokenizer_special_text(t, bos));
    if (eos >= 0) cJSON_AddStringToObject(special, "eos_token", loom_tokenizer_special_text(t, eos));
    const int32_t pad = loom_tokenizer_pad(t);
    if (pad >= 0) cJSON_AddStringToObject(special, "pad_token", loom_tokenizer_special_text(t, pad));
    const int spm = loom_tokenizer_is_spm(t);
    int32_t pre[4], post[4];
    int n_pre, n_post, prefix_space = 0;
    loom_tokenizer_template(t, pre, &n_pre, post, &n_post);
    if (spm) { /* whether the model puts a space before a text: "a" encodes to a piece that begins with one */
        struct loom_tokenizer_state *st = loom_tokenizer_state_new(t);
        struct loom_ids ids = {0};
        loom_tokenizer_encode(t, st, "a", 1, &ids);
        size_t len;
        const char *b = ids.n ? loom_tokenizer_token_bytes(t, ids.ids[0], &len) : NULL;
        prefix_space = b && len && b[0] == ' ';
        loom_ids_free(&ids);
        loom_tokenizer_state_free(st);
    }
    loom_tokenizer_free(t);
    double max_len = 0;
    static const char *const configs[] = {"config.json", "generation_config.json"};
    for (int i = 0; i < 2 && rc == LOOM_OK; i++) {
        cJSON *j = read_json(dir, configs[i]);
        if (!j) continue;
        if (bos >= 0) set_number(j, "bos_token_id", bos);
        if (eos >= 0) set_number(j, "eos_token_id", eos);
        if (pad >= 0) set_number(j, "pad_token_id", pad);
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(j, "max_position_embeddings");
        if (!n) n = cJSON_GetObjectItemCaseSensitive(j, "n_positions");
        if (i == 0 && cJSON_IsNumber(n)) max_len = n->valuedouble;
        rc = write_json(dir, configs[i], j);
        cJSON_Delete(j);
    }
    /* a model that puts no space before a text is Gemma's kind: GemmaTokenizer, whose converter also
     * keeps the model's user-defined pieces whole, as sentencepiece does */
    cJSON_AddStringToObject(tc, "tokenizer_class",
                            !spm           ? "PreTrainedTokenizerFast"
                            : prefix_space ? "LlamaTokenizer"
                                           : "GemmaTokenizer");
    cJSON_AddFalseToObject(tc, "clean_up_tokenization_spaces");
    if (spm) {
        cJSON_AddBoolToObject(tc, "add_bos_token", n_pre > 0);
        cJSON_AddBoolToObject(tc, "add_eos_token", n_post > 0);
        if (prefix_space) {
            cJSON_AddTrueToObject(tc, "legacy");
            cJSON_AddTrueToObject(tc, "add_prefix_space");
        }
    }
    if (max_len > 0) cJSON_AddNumberToObject(tc, "model_max_length", max_len);
    for (const cJSON *e = special->child; e; e = e->next)
        cJSON_AddStringToObject(tc, e->string, e->valuestring);
    if (rc == LOOM_OK) rc = write_json(dir, "tokenizer_config.json", tc);
    if (rc == LOOM_OK) rc = write_json(dir, "special_tokens_map.json", special);
    cJSON_Delete(tc);
    cJSON_Delete(special);
    return rc;
}

static const struct loom_convert_env env = {.read_checkpoint = read_checkpoint};

int loom_convert(int argc, char **argv)
{
    const struct loom_model_family *f;
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            for (int k = 0; (f = loom_model_family_at(k)); k++) { /* each converter once */
                int seen = 0;
                for (int j = 0; j < k; j++) seen |= loom_model_family_at(j)->converter == f->converter;
                if (!f->converter || seen) continue;
                printf("%s", k ? "\n" : "");
                f->converter->usage(stdout);
            }
            return LOOM_OK;
        }
    /* the family the input names (a checkpoint's recorded model, config.json's
     * model_type, loom's metadata), else the first with a converter (which
     * reads what names none: llm.c files, bare tensors) */
    const char *in = NULL, *out = NULL;
    for (int i = 0; i < argc && !out; i++)
        if (strncmp(argv[i], "--", 2) != 0)
            *(in ? &out : &in) = argv[i];
        else
            i++; /* a flag's value */
    f = in ? loom_checkpoint_source_family(in) : NULL;
    if (!f || !f->converter)
        for (int k = 0; (f = loom_model_family_at(k)) && !f->converter; k++) {
        }
    if (!f) return loom_error_set(LOOM_ERR_INPUT, "no model family has weights formats to convert");
    char tok[4400] = ""; /* found (and a checkpoint's checked) before anything is written */
    int rc = in ? find_tokenizer(in, tok, sizeof tok) : LOOM_OK;
    struct loom_convert_env e = env;
    e.family = f;
    if (rc == LOOM_OK) rc = f->converter->run(argc, argv, &e);
    if (rc == LOOM_OK && out && loom_fs_is_dir(out)) rc = copy_tokenizer(tok, out);
    if (rc == LOOM_OK && out && *tok && loom_fs_is_dir(out)) rc = complete_directory(out);
    return rc;
}
