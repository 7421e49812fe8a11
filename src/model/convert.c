/* The registry of weights converters (see convert.h). */
#include "model/convert.h"

static const struct loom_model_converter *const converters[] = {&loom_gpt2_converter};
#define NCONVERTERS ((int)(sizeof converters / sizeof converters[0]))

const struct loom_model_converter *loom_model_converter_at(int i)
{
    return i >= 0 && i < NCONVERTERS ? converters[i] : NULL;
}
