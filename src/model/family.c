/* The registry of model families (see family.h). */
#include "model/family.h"

#include <string.h>

static const struct loom_model_family *const families[] = {&loom_gpt2_family,    &loom_llama_family,
                                                           &loom_mistral_family, &loom_mixtral_family,
                                                           &loom_qwen2_family,   &loom_gemma_family};
#define NFAMILIES ((int)(sizeof families / sizeof families[0]))

const struct loom_model_family *loom_model_family_at(int i)
{
    return i >= 0 && i < NFAMILIES ? families[i] : NULL;
}

const struct loom_model_family *loom_model_family_find(const char *name)
{
    for (int i = 0; i < NFAMILIES; i++)
        if (strcmp(families[i]->name, name) == 0) return families[i];
    return NULL;
}

const struct loom_model_family *loom_model_family_of_preset(const char *preset,
                                                            const struct loom_model_preset **out)
{
    for (int i = 0; i < NFAMILIES; i++)
        for (int p = 0; p < families[i]->npresets; p++)
            if (strcmp(families[i]->presets[p].name, preset) == 0) {
                if (out) *out = &families[i]->presets[p];
                return families[i];
            }
    return NULL;
}

const struct loom_model_family *loom_model_family_of(const struct loom_model *m)
{
    return m->family;
}
