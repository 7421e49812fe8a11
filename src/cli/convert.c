/*
 * `loom convert IN OUT`: a model's weights from one file format to another.
 * The formats are the model family's converter's (model/convert.h: the
 * decoder families' are llm.c checkpoints, safetensors files and Hugging
 * Face directories); here are the help listing each converter's once, the
 * dispatch, and the reading of a loom checkpoint (any layout) for a
 * converter, which takes the engine.
 *
 * A Hugging Face directory written from a checkpoint that holds the run's
 * tokenizer (tokenizer.json) gets a copy of it.
 *
 * Not here: the formats themselves.
 */
#include "cli/convert.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "engine/checkpoint.h"
#include "io/checkpoint.h"
#include "io/fs.h"
#include "loom/loom.h"
#include "model/convert.h"
#include "model/family.h"
#include "tokenizer/bpe.h"

static int read_checkpoint(const char *path, struct loom_model **out)
{
    return loom_checkpoint_read_model(path, 1, 1, out);
}

/* A Hugging Face directory written from a checkpoint or directory that
 * holds a tokenizer.json gets it too (loom train --tokenizer saves it in
 * every checkpoint): its path, "" when there is none. */
static int find_tokenizer(const char *in, char *path, size_t n)
{
    int rc = loom_weights_find_tokenizer(in, path, n); /* a checkpoint's held to its trainer state's record */
    if (rc == LOOM_OK && *path && loom_fs_is_dir(path)) *path = 0; /* vocab.json + merges.txt: not copied */
    return rc;
}

static int copy_tokenizer(const char *path, const char *out)
{
    if (!*path) return LOOM_OK;
    int rc = loom_bpe_export(path, out);
    if (rc == LOOM_OK) printf("copied %s into %s\n", path, out);
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
    return rc;
}
