/*
 * GPT-2 (Hugging Face's GPT2LMHeadModel) as a decoder family
 * (model/decoder_def.h): the embedding block (wte, wpe), L layers
 * (LayerNorm, fused c_attn with biases, c_proj, LayerNorm, c_fc, GELU,
 * c_proj), the head block (ln_f; the LM head tied to wte, or lm_head of its
 * own), under Hugging Face GPT-2's names and Conv1D's [in, out] weights. Its
 * presets (a tiny one for the built-in corpus and the four published
 * sizes), its shape settings and its config.json (GPT2Config). The model,
 * its weights formats (llm.c's included) and `loom convert` are generic
 * (decoder.h, hf_decoder.h, source.h, llmc.h, convert.h).
 */
#include <limits.h>
#include <stdio.h>

#include "base/log.h"
#include "model/hf_decoder.h"

/* Presets: the shape and the training defaults that go with it. A preset's
 * micro-batch applies only while no batch setting is given (config/parse.c). */
/* clang-format off */
#define GPT2_REAL(lr) {"--train-iters", "1000"}, {"--lr-warmup-iters", "100"}, {"--eval-interval", "250"}, \
                      {"--log-interval", "10"}, {"--lr", lr}, {"--micro-batch-size", "4"}
#define GPT2_SIZE(L, C, NH) {"--num-layers", L}, {"--hidden-size", C}, {"--num-attention-heads", NH}, \
                            {"--seq-length", "1024"}, {"--max-position-embeddings", "1024"}, \
                            {"--vocab-size", "50257"}
static const struct loom_model_preset presets[] = {
    {.name = "gpt2-tiny", .summary = "GPT-2 shape, 4 layers x 128 channels, bytes: a run in seconds",
     .settings = {{"--num-layers", "4"}, {"--hidden-size", "128"}, {"--num-attention-heads", "4"},
                  {"--seq-length", "64"}, {"--max-position-embeddings", "64"}, {"--vocab-size", "256"},
                  LOOM_TINY_TRAINING}},
    {.name = "gpt2", .summary = "GPT-2 124M", .settings = {GPT2_SIZE("12", "768", "12"), GPT2_REAL("6e-4")}},
    {.name = "gpt2-medium", .summary = "GPT-2 350M", .settings = {GPT2_SIZE("24", "1024", "16"), GPT2_REAL("3e-4")}},
    {.name = "gpt2-large", .summary = "GPT-2 774M", .settings = {GPT2_SIZE("36", "1280", "20"), GPT2_REAL("2.5e-4")}},
    {.name = "gpt2-xl", .summary = "GPT-2 1.5B", .settings = {GPT2_SIZE("48", "1600", "25"), GPT2_REAL("2e-4")}},
};
/* clang-format on */

static const struct loom_decoder_names names = {
    .embedding = "wte",
    .positions = "wpe",
    .layer = "h.%d.",
    .norm1 = "ln_1",
    .qkv = "attn.c_attn",
    .o = "attn.c_proj",
    .norm2 = "ln_2",
    .up = "mlp.c_fc",
    .down = "mlp.c_proj",
    .final_norm = "ln_f",
    .lm_head = "lm_head", /* GPT2LMHeadModel's own head */
    /* a mixture of experts: GPT-2's MLP names under each expert's prefix */
    .router = "mlp.router",
    .expert = "mlp.experts.%d.",
    .expert_up = "c_fc",
    .expert_down = "c_proj",
    .shared = "mlp.shared_experts.",
};

static const struct loom_decoder_spec arch = {
    .names = &names,
    .norm = LOOM_NORM_LAYERNORM,
    .positions = LOOM_POSITION_LEARNED,
    .weights = LOOM_WEIGHTS_IN_OUT,
    .fused_qkv = 1,
    .qkv_bias = 1,
    .o_bias = 1,
    .mlp_bias = 1,
    .mlp = LOOM_MLP_DENSE,
    .init_std = 0.02,
    .scaled_init = 1,
};

/* every head its own key/value head; the MLP 4 x C */
static void finish(struct loom_decoder_spec *s)
{
    s->kv_heads = s->heads;
    s->ffn = 4 * s->hidden;
}

/* The shape settings as files record them: the keys checkpoints' trainer
 * state has always written, then the numerics (absent from older files,
 * which were all GPT-2's defaults). The activation's names are the spec's
 * values (gelu_new: the tanh form). */
static const struct loom_shape_key keys[] = {
    LOOM_SHAPE_KEY("num_layers", num_layers, num_layers, LOOM_SHAPE_INT, 1, INT_MAX),
    LOOM_SHAPE_KEY("hidden_size", hidden_size, hidden, LOOM_SHAPE_INT, 1, INT_MAX),
    LOOM_SHAPE_KEY("num_attention_heads", num_attention_heads, heads, LOOM_SHAPE_INT, 1, INT_MAX),
    LOOM_SHAPE_KEY("max_position_embeddings", max_position_embeddings, max_pos, LOOM_SHAPE_INT, 1, INT_MAX),
    LOOM_SHAPE_KEY("vocab_size", vocab_size, vocab, LOOM_SHAPE_INT, 1, INT_MAX),
    LOOM_SHAPE_KEY_OR("norm_epsilon", norm_epsilon, norm_eps, LOOM_SHAPE_REAL, 0, 1, "1e-5"),
    LOOM_SHAPE_KEY_WORD("activation_function", activation_function, activation, loom_activation_names,
                        "gelu_new"),
    LOOM_SHAPE_KEY_OR("untie_embeddings_and_output_weights", untie_embeddings_and_output_weights, untied,
                      LOOM_SHAPE_INT, 0, 1, "0"),
    LOOM_DECODER_MOE_KEYS,
    LOOM_DECODER_DROPOUT_KEYS,
};
_Static_assert((int)LOOM_ACTIVATION_GELU_NEW == (int)LOOM_MLP_GELU_TANH &&
                   (int)LOOM_ACTIVATION_GELU == (int)LOOM_MLP_GELU,
               "the activation setting's values are the spec's");

/* ---- config.json: transformers' GPT2Config ---- */

/* gelu_new and gelu_pytorch_tanh: the tanh form; gelu: exact */
static const struct loom_hf_word activations[] = {
    {"gelu_new", "gelu_new"}, {"gelu_pytorch_tanh", "gelu_new"}, {"gelu", "gelu"}, {NULL, NULL}};

static const struct loom_hf_key hf_keys[] = {
    LOOM_HF_KEY("n_layer", "num_layers", LOOM_HF_INT, 12),
    LOOM_HF_KEY("n_embd", "hidden_size", LOOM_HF_INT, 768),
    LOOM_HF_KEY("n_head", "num_attention_heads", LOOM_HF_INT, 12),
    LOOM_HF_KEY("n_positions", "max_position_embeddings", LOOM_HF_INT, 1024),
    LOOM_HF_KEY("vocab_size", "vocab_size", LOOM_HF_INT, 50257),
    LOOM_HF_KEY_REAL("layer_norm_epsilon", "norm_epsilon", 1e-5, 0, 1),
    /* dropout while training: GPT2Config's 0.1 unless the file says */
    LOOM_HF_KEY_REAL("resid_pdrop", "hidden_dropout", 0.1, 0, 1),
    LOOM_HF_KEY_REAL("attn_pdrop", "attention_dropout", 0.1, 0, 1),
    LOOM_HF_KEY_REAL("embd_pdrop", "embedding_dropout", 0.1, 0, 1),
    LOOM_HF_KEY_WORD("activation_function", "activation_function", activations, 0),
    LOOM_HF_KEY("tie_word_embeddings", "untie_embeddings_and_output_weights", LOOM_HF_UNTIED, 0), /* tied */
};

static const struct loom_hf_field hf_fields[] = {
    {"n_inner", LOOM_HF_READ, NULL},
    /* switches that change the function: GPT-2's value only */
    {"scale_attn_weights", LOOM_HF_ONLY, "true"},
    {"scale_attn_by_inverse_layer_idx", LOOM_HF_ONLY, "false"},
    {"add_cross_attention", LOOM_HF_ONLY, "false"},
    {"is_encoder_decoder", LOOM_HF_ONLY, "false"},
    {"tie_encoder_decoder", LOOM_HF_ONLY, "false"},
    {"cross_attention_hidden_size", LOOM_HF_ONLY, "null"},
    {"pruned_heads", LOOM_HF_ONLY, "{}"},
    /* no effect on the function loom computes (reorder_and_upcast_attn: the
     * same products in float32; the summary head's, which loom has none of),
     * written with GPT2Config's defaults */
    {"reorder_and_upcast_attn", LOOM_HF_NO_EFFECT, "false"},
    {"n_ctx", LOOM_HF_NO_EFFECT, NULL},
    {"summary_type", LOOM_HF_NO_EFFECT, "\"cls_index\""},
    {"summary_use_proj", LOOM_HF_NO_EFFECT, "true"},
    {"summary_activation", LOOM_HF_NO_EFFECT, "null"},
    {"summary_proj_to_labels", LOOM_HF_NO_EFFECT, "true"},
    {"summary_first_dropout", LOOM_HF_NO_EFFECT, "0.1"},
};

/* n_inner, where given, is the MLP's one width: 4 x n_embd */
static int hf_read(const char *path, const cJSON *j, struct loom_model_shape *shape)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "n_inner");
    const int C = (int)loom_model_shape_find(shape, "hidden_size")->value;
    if (!v || cJSON_IsNull(v) || (cJSON_IsNumber(v) && v->valuedouble == 4.0 * C)) return LOOM_OK;
    char four_c[64];
    snprintf(four_c, sizeof four_c, "null or 4 x n_embd = %d (its MLP width is fixed)", 4 * C);
    return loom_hf_refuse(path, "GPT-2", v, four_c);
}

static void hf_write(cJSON *j, const struct loom_model_shape *shape)
{
    cJSON_AddNumberToObject(j, "n_ctx",
                            (double)loom_model_shape_find(shape, "max_position_embeddings")->value);
    cJSON_AddNullToObject(j, "n_inner");
}

static const struct loom_hf_width widths[] = {{768, 12}, {1024, 16}, {1280, 20}, {1600, 25}, {0, 0}};

static const char *const architectures[] = {"GPT2LMHeadModel", "GPT2Model", NULL};
static const struct loom_hf_map hf = {
    .model_type = "gpt2",
    .architectures = architectures,
    .keys = hf_keys,
    .nkeys = (int)(sizeof hf_keys / sizeof hf_keys[0]),
    .fields = hf_fields,
    .nfields = (int)(sizeof hf_fields / sizeof hf_fields[0]),
    .end_of_text_last = 1, /* <|endoftext|>, 50256 of 50257 */
    .config_class = "GPT2Config",
    .prefix = "transformer.",
    .widths = widths,
    .read = hf_read,
    .write = hf_write,
};

static const struct loom_decoder_def def = {
    .family = &loom_gpt2_family,
    .arch = &arch,
    .keys = keys,
    .nkeys = (int)(sizeof keys / sizeof keys[0]),
    .finish = finish,
    .hf = &hf,
};

LOOM_HF_DECODER_FAMILY(loom_gpt2_family, def, "gpt2", "GPT-2", presets);
