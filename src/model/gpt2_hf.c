/*
 * GPT-2's config.json, read and written (gpt2_hf.h).
 */
#include "model/gpt2_hf.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "io/hf_config.h"

/* transformers' GPT2Config and the PretrainedConfig fields every config
 * may carry. */
static const struct loom_hf_field fields[] = {
    /* the model: read below */
    {"n_layer", LOOM_HF_READ, NULL},
    {"n_embd", LOOM_HF_READ, NULL},
    {"n_head", LOOM_HF_READ, NULL},
    {"n_positions", LOOM_HF_READ, NULL},
    {"vocab_size", LOOM_HF_READ, NULL},
    {"layer_norm_epsilon", LOOM_HF_READ, NULL},
    {"activation_function", LOOM_HF_READ, NULL},
    {"tie_word_embeddings", LOOM_HF_READ, NULL},
    {"n_inner", LOOM_HF_READ, NULL},
    {"architectures", LOOM_HF_READ, NULL},
    {"model_type", LOOM_HF_ONLY, "\"gpt2\""},
    /* switches that change the function: GPT-2's value only */
    {"scale_attn_weights", LOOM_HF_ONLY, "true"},
    {"scale_attn_by_inverse_layer_idx", LOOM_HF_ONLY, "false"},
    {"add_cross_attention", LOOM_HF_ONLY, "false"},
    {"is_encoder_decoder", LOOM_HF_ONLY, "false"},
    {"tie_encoder_decoder", LOOM_HF_ONLY, "false"},
    {"cross_attention_hidden_size", LOOM_HF_ONLY, "null"},
    {"pruned_heads", LOOM_HF_ONLY, "{}"},
    /* no effect on the function loom computes */
    {"reorder_and_upcast_attn", LOOM_HF_NO_EFFECT, NULL},
    {"n_ctx", LOOM_HF_NO_EFFECT, NULL},
    {"attn_pdrop", LOOM_HF_NO_EFFECT, NULL},
    {"embd_pdrop", LOOM_HF_NO_EFFECT, NULL},
    {"resid_pdrop", LOOM_HF_NO_EFFECT, NULL},
    {"summary_type", LOOM_HF_NO_EFFECT, NULL},
    {"summary_use_proj", LOOM_HF_NO_EFFECT, NULL},
    {"summary_activation", LOOM_HF_NO_EFFECT, NULL},
    {"summary_proj_to_labels", LOOM_HF_NO_EFFECT, NULL},
    {"summary_first_dropout", LOOM_HF_NO_EFFECT, NULL},
};
#define NFIELDS ((int)(sizeof fields / sizeof fields[0]))

/* A positive integer field (its GPT2Config default when absent). */
static int read_int(const char *path, const cJSON *j, const char *name, int def, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    if (!v) {
        *out = def;
        return LOOM_OK;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 1 && v->valuedouble <= (1 << 24)) ||
        v->valuedouble != floor(v->valuedouble)) {
        char text[80];
        loom_hf_value_text(v, text, sizeof text);
        return loom_error_set(LOOM_ERR_INPUT, "%s: %s is %s; expected an integer from 1 to %d", path, name,
                              text, 1 << 24);
    }
    *out = (int)v->valuedouble;
    return LOOM_OK;
}

static int refuse(const char *path, const cJSON *v, const char *supported)
{
    char text[80];
    loom_hf_value_text(v, text, sizeof text);
    return loom_error_set(LOOM_ERR_INPUT, "%s: %s is %s; loom's GPT-2 supports %s", path, v->string, text,
                          supported);
}

/* The fields read beside the shape: epsilon, activation, tying, the MLP
 * width, the architectures. */
static int read_numerics(const char *path, const cJSON *j, int C, double *eps, int *activation, int *untied)
{
    const cJSON *v;
    *eps = 1e-5; /* GPT2Config's defaults */
    *activation = LOOM_ACTIVATION_GELU_NEW;
    *untied = 0;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "layer_norm_epsilon"))) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 1))
            return refuse(path, v, "a number from 0 to 1");
        *eps = v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "activation_function"))) {
        const char *a = cJSON_IsString(v) ? v->valuestring : "";
        if (strcmp(a, "gelu_new") == 0 || strcmp(a, "gelu_pytorch_tanh") == 0)
            *activation = LOOM_ACTIVATION_GELU_NEW;
        else if (strcmp(a, "gelu") == 0)
            *activation = LOOM_ACTIVATION_GELU;
        else
            return refuse(path, v, "gelu_new and gelu_pytorch_tanh (GELU, tanh form) and gelu (exact)");
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings"))) {
        if (!cJSON_IsBool(v)) return refuse(path, v, "true or false");
        *untied = cJSON_IsFalse(v);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "n_inner")) && !cJSON_IsNull(v) &&
        !(cJSON_IsNumber(v) && v->valuedouble == 4.0 * C)) {
        char four_c[64];
        snprintf(four_c, sizeof four_c, "null or 4 x n_embd = %d (its MLP width is fixed)", 4 * C);
        return refuse(path, v, four_c);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "architectures")) && !cJSON_IsNull(v)) {
        const cJSON *a;
        int ok = cJSON_IsArray(v);
        cJSON_ArrayForEach(a, v) ok =
            ok && cJSON_IsString(a) &&
            (strcmp(a->valuestring, "GPT2LMHeadModel") == 0 || strcmp(a->valuestring, "GPT2Model") == 0);
        if (!ok) return refuse(path, v, "[\"GPT2LMHeadModel\"] and [\"GPT2Model\"] (a language model)");
    }
    return LOOM_OK;
}

int loom_gpt2_hf_read_config(const char *path, struct loom_model_shape *out)
{
    cJSON *j;
    int rc = loom_hf_config_read(path, fields, NFIELDS, "GPT-2", &j);
    if (rc) return rc;
    int L = 0, C = 0, NH = 0, P = 0, V = 0, activation = 0, untied = 0;
    double eps;
    if ((rc = read_int(path, j, "n_layer", 12, &L)) || (rc = read_int(path, j, "n_embd", 768, &C)) ||
        (rc = read_int(path, j, "n_head", 12, &NH)) || (rc = read_int(path, j, "n_positions", 1024, &P)) ||
        (rc = read_int(path, j, "vocab_size", 50257, &V)) ||
        (rc = read_numerics(path, j, C, &eps, &activation, &untied))) {
        cJSON_Delete(j);
        return rc;
    }
    cJSON_Delete(j);
    memset(out, 0, sizeof *out);
    snprintf(out->type, sizeof out->type, "gpt2");
    loom_model_shape_add_int(out, "num_layers", L);
    loom_model_shape_add_int(out, "hidden_size", C);
    loom_model_shape_add_int(out, "num_attention_heads", NH);
    loom_model_shape_add_int(out, "max_position_embeddings", P);
    loom_model_shape_add_int(out, "vocab_size", V);
    loom_model_shape_add_real(out, "norm_epsilon", eps);
    loom_model_shape_add_word(out, "activation_function", loom_activation_names[activation]);
    loom_model_shape_add_int(out, "untie_embeddings_and_output_weights", untied);
    return LOOM_OK;
}

/* config.json as transformers' GPT2Config writes it (keys sorted), for the
 * model loom computes. Dropouts keep GPT2Config's defaults; GPT-2's
 * <|endoftext|> is its last token (50256 of 50257). */
char *loom_gpt2_hf_config_json(const struct loom_gpt2_config *cfg)
{
    cJSON *j = cJSON_CreateObject();
    const char *arch[] = {"GPT2LMHeadModel"};
    cJSON_AddStringToObject(j, "activation_function", loom_activation_names[cfg->activation]);
    cJSON_AddItemToObject(j, "architectures", cJSON_CreateStringArray(arch, 1));
    cJSON_AddNumberToObject(j, "attn_pdrop", 0.1);
    cJSON_AddNumberToObject(j, "bos_token_id", cfg->vocab - 1);
    cJSON_AddNumberToObject(j, "embd_pdrop", 0.1);
    cJSON_AddNumberToObject(j, "eos_token_id", cfg->vocab - 1);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    char eps[40]; /* exactly: cJSON's printing may round */
    loom_real_text(cfg->norm_eps, eps, sizeof eps);
    cJSON_AddRawToObject(j, "layer_norm_epsilon", eps);
    cJSON_AddStringToObject(j, "model_type", "gpt2");
    cJSON_AddNumberToObject(j, "n_ctx", cfg->max_pos);
    cJSON_AddNumberToObject(j, "n_embd", cfg->hidden);
    cJSON_AddNumberToObject(j, "n_head", cfg->heads);
    cJSON_AddNullToObject(j, "n_inner");
    cJSON_AddNumberToObject(j, "n_layer", cfg->num_layers);
    cJSON_AddNumberToObject(j, "n_positions", cfg->max_pos);
    cJSON_AddFalseToObject(j, "reorder_and_upcast_attn");
    cJSON_AddNumberToObject(j, "resid_pdrop", 0.1);
    cJSON_AddFalseToObject(j, "scale_attn_by_inverse_layer_idx");
    cJSON_AddTrueToObject(j, "scale_attn_weights");
    cJSON_AddNullToObject(j, "summary_activation");
    cJSON_AddNumberToObject(j, "summary_first_dropout", 0.1);
    cJSON_AddTrueToObject(j, "summary_proj_to_labels");
    cJSON_AddStringToObject(j, "summary_type", "cls_index");
    cJSON_AddTrueToObject(j, "summary_use_proj");
    cJSON_AddBoolToObject(j, "tie_word_embeddings", !cfg->untied);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    cJSON_AddTrueToObject(j, "use_cache");
    cJSON_AddNumberToObject(j, "vocab_size", cfg->vocab);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    return text;
}

/* generation_config.json as transformers derives it from the model's
 * config: the end-of-text token begins and ends a sequence. */
char *loom_gpt2_hf_generation_config_json(const struct loom_gpt2_config *cfg)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddTrueToObject(j, "_from_model_config");
    cJSON_AddNumberToObject(j, "bos_token_id", cfg->vocab - 1);
    cJSON_AddNumberToObject(j, "eos_token_id", cfg->vocab - 1);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    return text;
}
