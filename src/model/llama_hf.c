/*
 * Llama's config.json, read and written (llama_hf.h).
 */
#include "model/llama_hf.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "io/hf_config.h"

/* transformers' LlamaConfig (4.39 and later), beside the PretrainedConfig
 * fields io/hf_config.c accepts for every family. */
static const struct loom_hf_field fields[] = {
    {"hidden_size", LOOM_HF_READ, NULL},
    {"intermediate_size", LOOM_HF_READ, NULL},
    {"num_hidden_layers", LOOM_HF_READ, NULL},
    {"num_attention_heads", LOOM_HF_READ, NULL},
    {"num_key_value_heads", LOOM_HF_READ, NULL},
    {"max_position_embeddings", LOOM_HF_READ, NULL},
    {"vocab_size", LOOM_HF_READ, NULL},
    {"rms_norm_eps", LOOM_HF_READ, NULL},
    {"rope_theta", LOOM_HF_READ, NULL},
    {"tie_word_embeddings", LOOM_HF_READ, NULL},
    {"head_dim", LOOM_HF_READ, NULL},
    {"architectures", LOOM_HF_READ, NULL},
    {"model_type", LOOM_HF_ONLY, "\"llama\""},
    /* what changes the function: Llama's value only */
    {"hidden_act", LOOM_HF_ONLY, "\"silu\""},
    {"attention_bias", LOOM_HF_ONLY, "false"},
    {"mlp_bias", LOOM_HF_ONLY, "false"},
    {"rope_scaling", LOOM_HF_ONLY, "null"},
    {"pretraining_tp", LOOM_HF_ONLY, "1"},
    /* no effect on the function loom computes (loom trains without dropout) */
    {"attention_dropout", LOOM_HF_NO_EFFECT, NULL},
    {"initializer_range", LOOM_HF_NO_EFFECT, NULL},
    {"use_cache", LOOM_HF_NO_EFFECT, NULL},
};
#define NFIELDS ((int)(sizeof fields / sizeof fields[0]))

static int refuse(const char *path, const cJSON *v, const char *supported)
{
    char text[80];
    loom_hf_value_text(v, text, sizeof text);
    return loom_error_set(LOOM_ERR_INPUT, "%s: %s is %s; loom's Llama supports %s", path, v->string, text,
                          supported);
}

/* A positive integer field, its LlamaConfig default when absent or null. */
static int read_int(const char *path, const cJSON *j, const char *name, int def, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return LOOM_OK;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 1 && v->valuedouble <= (1 << 24)) ||
        v->valuedouble != floor(v->valuedouble))
        return refuse(path, v, "an integer from 1 to 16777216");
    *out = (int)v->valuedouble;
    return LOOM_OK;
}

static int read_real(const char *path, const cJSON *j, const char *name, double def, double lo, double hi,
                     double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    if (!v) {
        *out = def;
        return LOOM_OK;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) {
        char range[64];
        snprintf(range, sizeof range, "a number from %g to %g", lo, hi);
        return refuse(path, v, range);
    }
    *out = v->valuedouble;
    return LOOM_OK;
}

int loom_llama_hf_read_config(const char *path, struct loom_model_shape *out)
{
    cJSON *j;
    int rc = loom_hf_config_read(path, fields, NFIELDS, "Llama", &j);
    if (rc) return rc;
    int C = 0, F = 0, L = 0, NH = 0, G = 0, P = 0, V = 0, hd = 0, untied = 1;
    double eps = 0, theta = 0;
    const cJSON *v;
    if ((rc = read_int(path, j, "hidden_size", 4096, &C)) ||
        (rc = read_int(path, j, "intermediate_size", 11008, &F)) ||
        (rc = read_int(path, j, "num_hidden_layers", 32, &L)) ||
        (rc = read_int(path, j, "num_attention_heads", 32, &NH)) ||
        (rc = read_int(path, j, "num_key_value_heads", NH, &G)) ||
        (rc = read_int(path, j, "max_position_embeddings", 2048, &P)) ||
        (rc = read_int(path, j, "vocab_size", 32000, &V)) ||
        (rc = read_int(path, j, "head_dim", C / NH, &hd)) ||
        (rc = read_real(path, j, "rms_norm_eps", 1e-6, 0, 1, &eps)) ||
        (rc = read_real(path, j, "rope_theta", 10000.0, 1, 1e12, &theta)))
        goto done;
    if (hd * NH != C) {
        char want[64];
        snprintf(want, sizeof want, "hidden_size / num_attention_heads = %d", C / NH);
        rc = refuse(path, cJSON_GetObjectItemCaseSensitive(j, "head_dim"), want);
        goto done;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings"))) {
        if (!cJSON_IsBool(v)) {
            rc = refuse(path, v, "true or false");
            goto done;
        }
        untied = cJSON_IsFalse(v);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "architectures")) && !cJSON_IsNull(v)) {
        const cJSON *a;
        int ok = cJSON_IsArray(v);
        cJSON_ArrayForEach(a, v) ok =
            ok && cJSON_IsString(a) &&
            (strcmp(a->valuestring, "LlamaForCausalLM") == 0 || strcmp(a->valuestring, "LlamaModel") == 0);
        if (!ok) {
            rc = refuse(path, v, "[\"LlamaForCausalLM\"] and [\"LlamaModel\"] (a language model)");
            goto done;
        }
    }
    memset(out, 0, sizeof *out);
    snprintf(out->type, sizeof out->type, "llama");
    loom_model_shape_add_int(out, "num_layers", L);
    loom_model_shape_add_int(out, "hidden_size", C);
    loom_model_shape_add_int(out, "num_attention_heads", NH);
    loom_model_shape_add_int(out, "num_query_groups", G);
    loom_model_shape_add_int(out, "ffn_hidden_size", F);
    loom_model_shape_add_int(out, "max_position_embeddings", P);
    loom_model_shape_add_int(out, "vocab_size", V);
    loom_model_shape_add_real(out, "norm_epsilon", eps);
    loom_model_shape_add_real(out, "rotary_base", theta);
    loom_model_shape_add_int(out, "untie_embeddings_and_output_weights", untied);
done:
    cJSON_Delete(j);
    return rc;
}

/* A double exactly (cJSON's printing may round). */
static void add_real(cJSON *j, const char *key, double x)
{
    char text[40];
    loom_real_text(x, text, sizeof text);
    cJSON_AddRawToObject(j, key, text);
}

char *loom_llama_hf_config_json(const struct loom_llama_config *cfg)
{
    cJSON *j = cJSON_CreateObject();
    const char *arch[] = {"LlamaForCausalLM"};
    cJSON_AddItemToObject(j, "architectures", cJSON_CreateStringArray(arch, 1));
    cJSON_AddFalseToObject(j, "attention_bias");
    cJSON_AddNumberToObject(j, "attention_dropout", 0.0);
    cJSON_AddNumberToObject(j, "bos_token_id", 1);
    cJSON_AddNumberToObject(j, "eos_token_id", 2);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNumberToObject(j, "hidden_size", cfg->hidden);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddNumberToObject(j, "intermediate_size", cfg->ffn);
    cJSON_AddNumberToObject(j, "max_position_embeddings", cfg->max_pos);
    cJSON_AddStringToObject(j, "model_type", "llama");
    cJSON_AddNumberToObject(j, "num_attention_heads", cfg->heads);
    cJSON_AddNumberToObject(j, "num_hidden_layers", cfg->num_layers);
    cJSON_AddNumberToObject(j, "num_key_value_heads", cfg->kv_heads);
    cJSON_AddNumberToObject(j, "pretraining_tp", 1);
    add_real(j, "rms_norm_eps", cfg->norm_eps);
    cJSON_AddNullToObject(j, "rope_scaling");
    add_real(j, "rope_theta", cfg->rope_theta);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", !cfg->untied);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    cJSON_AddTrueToObject(j, "use_cache");
    cJSON_AddNumberToObject(j, "vocab_size", cfg->vocab);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    return text;
}

char *loom_llama_hf_generation_config_json(const struct loom_llama_config *cfg)
{
    (void)cfg;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddTrueToObject(j, "_from_model_config");
    cJSON_AddNumberToObject(j, "bos_token_id", 1);
    cJSON_AddNumberToObject(j, "eos_token_id", 2);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    return text;
}
