/*
 * `loom convert IN OUT`: a model's weights from one file format to another.
 * The formats are the model family's (model/convert.h: GPT-2's are llm.c
 * checkpoints, safetensors files and Hugging Face directories); here are
 * the help listing every family's, the dispatch, and the reading of a loom
 * checkpoint (any layout) for a converter, which takes the engine.
 *
 * Not here: the formats themselves.
 */
#include "cli/convert.h"

#include <stdio.h>
#include <string.h>

#include "engine/checkpoint.h"
#include "loom/loom.h"
#include "model/convert.h"
#include "model/family.h"

static int read_checkpoint(const char *path, struct loom_model **out)
{
    return loom_checkpoint_read_model(path, 1, 1, out);
}

static const struct loom_convert_env env = {.read_checkpoint = read_checkpoint};

int loom_convert(int argc, char **argv)
{
    const struct loom_model_family *f;
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            int shown = 0;
            for (int k = 0; (f = loom_model_family_at(k)); k++)
                if (f->converter) {
                    printf("%s%s weights:\n", shown++ ? "\n" : "", f->title);
                    f->converter->usage(stdout);
                }
            return LOOM_OK;
        }
    /* the family the input names (a checkpoint's recorded model, config.json's
     * model_type, loom's metadata), else the first with a converter (GPT-2's
     * reads what names none: llm.c files, bare tensors) */
    const char *in = NULL;
    for (int i = 0; i < argc && !in; i++)
        if (strncmp(argv[i], "--", 2) != 0)
            in = argv[i];
        else
            i++; /* a flag's value */
    f = in ? loom_checkpoint_source_family(in) : NULL;
    if (f && f->converter) return f->converter->run(argc, argv, &env);
    for (int k = 0; (f = loom_model_family_at(k)); k++)
        if (f->converter) return f->converter->run(argc, argv, &env);
    return loom_error_set(LOOM_ERR_INPUT, "no model family has weights formats to convert");
}
