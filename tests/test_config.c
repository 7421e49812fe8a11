/*
 * The settings table: defaults < preset < JSON config < flags, the batch
 * invariant in each of its forms, bad values named in one line, and DeepSpeed
 * JSON keys read onto the same rows (conversions, "auto", unknown keys,
 * origins in the printed table). The model family's shape settings: the
 * numerics' flags, and files written before they existed.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "config/config.h"
#include "loom/loom.h"
#include "model/family.h"

static int parse(struct loom_config *cfg, const char *line, int dp)
{
    char buf[1024], *argv[64];
    int argc = 0, help;
    snprintf(buf, sizeof buf, "%s", line);
    for (char *tok = strtok(buf, " "); tok && argc < 64; tok = strtok(NULL, " ")) argv[argc++] = tok;
    int rc = loom_config_parse(cfg, argc, argv, &help);
    if (rc == LOOM_OK) rc = loom_config_resolve(cfg, dp);
    return rc;
}

static void expect_error(const char *line, const char *needle)
{
    struct loom_config cfg;
    int rc = parse(&cfg, line, 1);
    CHECK(rc == LOOM_ERR_INPUT);
    if (rc == LOOM_ERR_INPUT && !strstr(loom_error_message(), needle)) {
        fprintf(stderr, "  for '%s': message '%s' lacks '%s'\n", line, loom_error_message(), needle);
        CHECK(0);
    }
    loom_config_free(&cfg);
}

/* A JSON config in a temporary file; returns its path (static). */
static const char *json_file(const char *text)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/loom_test_config_XXXXXX");
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

/* parse "--deepspeed-config FILE <flags>" with the JSON text in FILE */
static int parse_json(struct loom_config *cfg, const char *json, const char *flags, int dp)
{
    const char *path = json_file(json);
    char line[1024];
    snprintf(line, sizeof line, "--deepspeed-config %s %s", path, flags);
    int rc = parse(cfg, line, dp);
    unlink(path);
    return rc;
}

/* The printed configuration's row for a setting: "value (origin)", spaces squeezed. */
static const char *row(const struct loom_config *cfg, const char *name)
{
    static char out[256];
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    loom_config_print(f, cfg, 1);
    fclose(f);
    out[0] = 0;
    char key[64];
    snprintf(key, sizeof key, "\n  %s ", name);
    const char *p = strstr(text, key);
    if (p) {
        p += strlen(key);
        size_t o = 0;
        for (; *p && *p != '\n' && o < sizeof out - 1; p++)
            if (*p != ' ' || (o && out[o - 1] != ' ')) out[o++] = *p;
        out[o] = 0;
    }
    free(text);
    return out;
}

static int warned(const struct loom_config *cfg, const char *needle)
{
    for (int i = 0; loom_config_warning(cfg, i); i++)
        if (strstr(loom_config_warning(cfg, i), needle)) return 1;
    return 0;
}

#define CHECK_ROW(cfg, name, want)                                                                           \
    do {                                                                                                     \
        const char *got_ = row(cfg, name);                                                                   \
        if (strcmp(got_, want)) fprintf(stderr, "  row %s: '%s', want '%s'\n", name, got_, want);            \
        CHECK(strcmp(got_, want) == 0);                                                                      \
    } while (0)

/* loom_config_parse alone (warnings kept, nothing derived) of "<flags>". */
static int parse_only(struct loom_config *cfg, const char *line)
{
    char buf[1024], *argv[64];
    int argc = 0, help;
    snprintf(buf, sizeof buf, "%s", line);
    for (char *tok = strtok(buf, " "); tok && argc < 64; tok = strtok(NULL, " ")) argv[argc++] = tok;
    return loom_config_parse(cfg, argc, argv, &help);
}

/* Origins live in each configuration: loom_config_given, and two parses
 * one after the other keep their own origins, JSON notes and warnings. */
static void test_origins(void)
{
    struct loom_config a, b;
    CHECK(parse(&a, "--num-layers 3 --micro-batch-size 2", 1) == LOOM_OK);
    CHECK(loom_config_given(&a, "--num-layers") && loom_config_given(&a, "num-layers"));
    CHECK(loom_config_given(&a, "micro-batch-size") &&
          loom_config_origin(&a, "micro-batch-size") == LOOM_ORIGIN_FLAG);
    CHECK(!loom_config_given(&a, "hidden-size") &&
          loom_config_origin(&a, "hidden-size") == LOOM_ORIGIN_PRESET);
    CHECK(!loom_config_given(&a, "weight-decay") &&
          loom_config_origin(&a, "weight-decay") == LOOM_ORIGIN_DEFAULT);
    CHECK(!loom_config_given(&a, "global-batch-size") &&
          loom_config_origin(&a, "global-batch-size") == LOOM_ORIGIN_DERIVED);
    loom_config_free(&a);
    /* a JSON key is given too; a flag's prefix is not the flag */
    CHECK(parse_json(&a, "{\"num_layers\": 5, \"train_micro_batch_size_per_gpu\": \"auto\"}", "", 1) ==
          LOOM_OK);
    CHECK(a.num_layers == 5 && loom_config_given(&a, "num-layers") &&
          loom_config_origin(&a, "num-layers") == LOOM_ORIGIN_JSON);
    CHECK(!loom_config_given(&a, "micro-batch-size") && a.micro_batch_size == 16);
    loom_config_free(&a);
    expect_error("--num-layers-x 3", "unknown flag --num-layers-x");

    /* one after the other, different flags: nothing of the first shows in the second */
    CHECK(parse(&a, "--lr 0.5 --seed 7", 1) == LOOM_OK);
    CHECK(parse(&b, "--train-iters 90", 1) == LOOM_OK);
    CHECK(loom_config_given(&a, "lr") && loom_config_given(&a, "seed") &&
          !loom_config_given(&a, "train-iters"));
    CHECK(!loom_config_given(&b, "lr") && !loom_config_given(&b, "seed") &&
          loom_config_given(&b, "train-iters"));
    CHECK(a.lr == 0.5 && a.seed == 7 && a.train_iters == 1200 && b.lr == 3e-3 && b.seed == 1234);
    CHECK_ROW(&a, "lr", "0.5 (flag)");
    CHECK_ROW(&b, "lr", "0.003 (preset)");
    CHECK_ROW(&a, "train-iters", "1200 (preset)");
    CHECK_ROW(&b, "train-iters", "90 (flag)");
    loom_config_free(&a);
    loom_config_free(&b);
    /* a JSON file's notes and warnings stay with its configuration */
    const char *path = json_file("{\"optimizer\": {\"params\": {\"lr\": 0.001}}}");
    char line[256];
    snprintf(line, sizeof line, "--deepspeed-config %s --lr 0.002", path);
    CHECK(parse_only(&a, line) == LOOM_OK);
    CHECK(parse_only(&b, "--lr 0.002") == LOOM_OK);
    unlink(path);
    CHECK(warned(&a, "--lr 0.002 overrides optimizer.params.lr 0.001") && !warned(&b, "overrides"));
    CHECK(!loom_config_warning(&b, 0));
    CHECK_ROW(&a, "lr", "0.002 (flag (json had 0.001))");
    CHECK_ROW(&b, "lr", "0.002 (flag)");
    /* parsing into the same structure again starts from nothing */
    loom_config_free(&a);
    CHECK(parse_only(&a, "--seed 3") == LOOM_OK);
    CHECK(!warned(&a, "overrides") && !loom_config_given(&a, "lr") &&
          !loom_config_given(&a, "deepspeed-config"));
    CHECK_ROW(&a, "lr", "0.003 (preset)");
    loom_config_free(&a);
    loom_config_free(&b);
}

static void expect_json_error(const char *json, const char *flags, const char *needle)
{
    struct loom_config cfg;
    int rc = parse_json(&cfg, json, flags, 1);
    CHECK(rc == LOOM_ERR_INPUT);
    if (rc == LOOM_ERR_INPUT && !strstr(loom_error_message(), needle)) {
        fprintf(stderr, "  for %s: message '%s' lacks '%s'\n", json, loom_error_message(), needle);
        CHECK(0);
    }
    loom_config_free(&cfg);
}

static void test_json(void)
{
    struct loom_config cfg;
    /* DeepSpeed's keys onto the rows; preset < JSON < flags */
    CHECK(parse_json(
              &cfg,
              "{\"train_batch_size\": 32, \"gradient_accumulation_steps\": 4, \"gradient_clipping\": 0.5,"
              " \"steps_per_print\": 7, \"seed\": 99,"
              " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001, \"betas\": [0.8, 0.99],"
              "   \"eps\": 1e-6, \"weight_decay\": 0.05}},"
              " \"zero_optimization\": {\"stage\": 2, \"overlap_comm\": false, \"reduce_bucket_size\": 5e7,"
              "   \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/nvme\"}},"
              " \"fp16\": {\"enabled\": false, \"initial_scale_power\": 16, \"loss_scale_window\": 500}}",
              "--lr 0.002 --gradient-accumulation-steps 4", 2) == LOOM_OK);
    CHECK(cfg.global_batch_size == 32 && cfg.gradient_accumulation_steps == 4 && cfg.micro_batch_size == 4);
    CHECK(cfg.clip_grad == 0.5 && cfg.log_interval == 7 && cfg.seed == 99);
    CHECK(cfg.optimizer == LOOM_OPTIMIZER_ADAMW && cfg.adam_beta1 == 0.8 && cfg.adam_beta2 == 0.99);
    CHECK(cfg.adam_eps == 1e-6 && cfg.weight_decay == 0.05);
    CHECK(cfg.zero_stage == 2 && cfg.no_overlap == 1 && cfg.ddp_bucket_size == 200); /* 5e7 x 4 bytes */
    CHECK(cfg.offload_optimizer == LOOM_OFFLOAD_NVME && strcmp(cfg.nvme_path, "/nvme") == 0);
    CHECK(cfg.initial_loss_scale == 65536 && cfg.loss_scale_window == 500 && !cfg.fp16);
    CHECK(cfg.lr == 0.002 && cfg.num_layers == 4);
    CHECK_ROW(&cfg, "lr", "0.002 (flag (json had 0.001))");
    CHECK_ROW(&cfg, "gradient-accumulation-steps", "4 (flag)"); /* the same value: no note */
    CHECK_ROW(&cfg, "micro-batch-size", "4 (derived)");
    CHECK_ROW(&cfg, "global-batch-size", "32 (json)");
    CHECK_ROW(&cfg, "num-layers", "4 (preset)");
    CHECK_ROW(&cfg, "ddp-bucket-size", "200 (json)");
    loom_config_free(&cfg);
    /* the override is also a warning, kept for resolve to print: parse alone keeps it */
    struct loom_config c2;
    const char *path = json_file("{\"optimizer\": {\"params\": {\"lr\": 0.001}}}");
    char line[256];
    snprintf(line, sizeof line, "--deepspeed-config %s --lr 0.002", path);
    char *argv[8];
    int argc = 0, help;
    for (char *tok = strtok(line, " "); tok; tok = strtok(NULL, " ")) argv[argc++] = tok;
    CHECK(loom_config_parse(&c2, argc, argv, &help) == LOOM_OK);
    CHECK(warned(&c2, "--lr 0.002 overrides optimizer.params.lr 0.001"));
    loom_config_free(&c2);
    unlink(path);

    /* "auto" is "not given"; the batch triple resolves from flags and preset */
    CHECK(parse_json(
              &cfg,
              "{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": \"auto\","
              " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\", \"betas\": \"auto\"}},"
              " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": \"auto\"}}}",
              "--micro-batch-size 2", 1) == LOOM_OK);
    CHECK(cfg.micro_batch_size == 2 && cfg.global_batch_size == 2 && cfg.lr == 3e-3 &&
          cfg.adam_beta2 == 0.95);
    CHECK(cfg.lr_decay_style == LOOM_LR_WARMUP_LR && cfg.lr_warmup_style == LOOM_LR_WARMUP_LOG);
    CHECK_ROW(&cfg, "lr", "0.003 (preset)");
    CHECK_ROW(&cfg, "lr-warmup-style", "log (derived)");
    loom_config_free(&cfg);

    /* DeepSpeed's scheduler: warmup_max_lr is the lr, total_num_steps the decay end */
    CHECK(parse_json(&cfg,
                     "{\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_min_lr\": 1e-5,"
                     " \"warmup_max_lr\": 2e-3, \"warmup_num_steps\": 10, \"total_num_steps\": 90,"
                     " \"warmup_type\": \"linear\"}}}",
                     "--train-iters 100", 1) == LOOM_OK);
    CHECK(cfg.lr == 2e-3 && cfg.min_lr == 1e-5 && cfg.lr_warmup_iters == 10 && cfg.lr_decay_iters == 90);
    CHECK(cfg.lr_decay_style == LOOM_LR_WARMUP_DECAY_LR && cfg.lr_warmup_style == LOOM_LR_WARMUP_LINEAR);
    loom_config_free(&cfg);

    /* unknown keys warn with the nearest known key in the same object; ignored keys say so */
    {
        const char *p = json_file("{\"zero_optimization\": {\"stgae\": 1, \"contiguous_gradients\": true},"
                                  " \"wall_clock_breakdown\": true, \"optimiser\": {}}");
        char l2[256];
        snprintf(l2, sizeof l2, "--deepspeed-config %s", p);
        char *av[4];
        int ac = 0, h;
        for (char *tok = strtok(l2, " "); tok; tok = strtok(NULL, " ")) av[ac++] = tok;
        CHECK(loom_config_parse(&cfg, ac, av, &h) == LOOM_OK);
        CHECK(
            warned(&cfg, "unknown key zero_optimization.stgae (nearest known key: zero_optimization.stage)"));
        CHECK(warned(&cfg, "unknown key optimiser (nearest known key: optimizer)"));
        CHECK(warned(&cfg, "zero_optimization.contiguous_gradients is accepted, not used"));
        CHECK(warned(&cfg, "wall_clock_breakdown is accepted, not used"));
        loom_config_free(&cfg);
        unlink(p);
    }

    /* wrong types, ranges and disagreements, each named by its JSON path */
    expect_json_error("{\"zero_optimization\": {\"stage\": 4}}", "",
                      "zero_optimization.stage: expected 0-3, got 4");
    expect_json_error("{\"zero_optimization\": {\"stage\": \"two\"}}", "",
                      "zero_optimization.stage: expected an integer");
    expect_json_error("{\"zero_optimization\": {\"stage\": 1.5}}", "",
                      "zero_optimization.stage: expected an integer");
    expect_json_error("{\"optimizer\": {\"params\": {\"lr\": true}}}", "",
                      "optimizer.params.lr: expected a number");
    expect_json_error("{\"optimizer\": {\"params\": {\"betas\": [0.9]}}}", "",
                      "optimizer.params.betas: expected an array of 2");
    expect_json_error("{\"optimizer\": {\"type\": \"Lamb\"}}", "",
                      "optimizer.type: expected one of adamw, adam, got 'Lamb'");
    expect_json_error("{\"optimizer\": 3}", "", "optimizer: expected an object, got 3");
    expect_json_error("{\"fp16\": {\"initial_scale_power\": 200}}", "",
                      "fp16.initial_scale_power: expected 0-127, got 200");
    expect_json_error("{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 4, "
                      "\"gradient_accumulation_steps\": 4}",
                      "",
                      "train_batch_size 32 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps "
                      "4 x data-parallel size 1");
    expect_json_error("{\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}", "",
                      "fp16.enabled and bf16.enabled are both on: choose one");
    expect_json_error("{\"bf16\": {\"enabled\": true}}", "--fp16", "--fp16 and bf16.enabled are both on");
    expect_json_error("{}", "--fp16 --initial-loss-scale 1000",
                      "--initial-loss-scale 1000: the dynamic loss scale must start at a power of 2");
    expect_json_error("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"adam_w_mode\": false}}}", "",
                      "L2-coupled weight decay");
    expect_json_error("{\"train_batch_size\": 8,}", "", "not valid JSON at line 1");
    expect_json_error("[1]", "", "expected a JSON object at the top level");
    expect_error("--deepspeed-config /nonexistent/ds.json",
                 "--deepspeed-config /nonexistent/ds.json: cannot open");
    /* Adam with adam_w_mode false is fine without weight decay: the two updates agree */
    CHECK(parse_json(&cfg,
                     "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"adam_w_mode\": false, "
                     "\"weight_decay\": 0}}}",
                     "", 1) == LOOM_OK);
    loom_config_free(&cfg);
    /* DeepSpeed's old spelling: zero_optimization true is stage 1 */
    CHECK(parse_json(&cfg, "{\"zero_optimization\": true}", "", 1) == LOOM_OK && cfg.zero_stage == 1);
    loom_config_free(&cfg);
}

/* GPT-2's shape settings as files record them: every setting survives
 * shape_of -> apply_shape; a file from before the numerics (five integers)
 * gives GPT-2's; an unknown key, a word that names no activation, a
 * missing size are refused naming the setting. */
static void test_shape_settings(void)
{
    const struct loom_model_family *f = &loom_gpt2_family;
    struct loom_config cfg, back;
    CHECK(parse(&cfg,
                "--norm-epsilon 0.1 --activation-function gelu --untie-embeddings-and-output-weights "
                "--num-attention-heads 8",
                1) == LOOM_OK);
    CHECK(cfg.norm_epsilon == 0.1 && cfg.activation_function == LOOM_ACTIVATION_GELU &&
          cfg.untie_embeddings_and_output_weights == 1);
    struct loom_model_shape s;
    f->shape_of(&cfg, &s);
    memset(&back, 0, sizeof back);
    CHECK(f->apply_shape(&s, &back) == LOOM_OK);
    CHECK(back.norm_epsilon == 0.1 && back.activation_function == LOOM_ACTIVATION_GELU &&
          back.untie_embeddings_and_output_weights == 1 && back.num_attention_heads == 8 &&
          back.hidden_size == cfg.hidden_size && back.vocab_size == cfg.vocab_size);
    /* an older file: the five sizes only */
    s.n = 5;
    memset(&back, 0, sizeof back);
    CHECK(f->apply_shape(&s, &back) == LOOM_OK);
    CHECK(back.norm_epsilon == 1e-5 && back.activation_function == LOOM_ACTIVATION_GELU_NEW &&
          back.untie_embeddings_and_output_weights == 0 && back.num_layers == cfg.num_layers);
    /* refusals name the setting */
    f->shape_of(&cfg, &s);
    snprintf(s.kv[6].word, sizeof s.kv[6].word, "relu");
    CHECK(f->apply_shape(&s, &back) == LOOM_ERR_INPUT && strstr(loom_error_message(), "activation_function"));
    f->shape_of(&cfg, &s);
    snprintf(s.kv[0].key, sizeof s.kv[0].key, "rope_scaling");
    CHECK(f->apply_shape(&s, &back) == LOOM_ERR_INPUT && strstr(loom_error_message(), "rope_scaling"));
    f->shape_of(&cfg, &s);
    s.kv[5].real = 2.0; /* eps outside [0, 1] */
    CHECK(f->apply_shape(&s, &back) == LOOM_ERR_INPUT && strstr(loom_error_message(), "norm_epsilon"));
    f->shape_of(&cfg, &s);
    s.kv[1] = s.kv[--s.n]; /* hidden_size missing */
    CHECK(f->apply_shape(&s, &back) == LOOM_ERR_INPUT && strstr(loom_error_message(), "hidden_size"));
    loom_config_free(&cfg);
    /* the flags' values are checked as any setting's */
    expect_error("--norm-epsilon -1", "--norm-epsilon");
    expect_error("--activation-function relu", "--activation-function");
}

/* --moe-layer-freq: an integer or Megatron's list expressions, their
 * refusals, the shortest text that reads back the same, and JSON's forms. */
static void test_moe_layers(void)
{
    static const struct {
        const char *text, *layers, *canonical;
    } ok[] = {
        {"[1,0,1,1]", "1011", "[1,0,1,1]"},
        {"[0]*3+[1]*5", "00011111", "[0]*3+[1]*5"},
        {"([1]*3+[0]*1)*3", "111011101110", "[1,1,1,0]*3"},
        {" ( [1] + [0] ) * 2 ", "1010", "[1,0]*2"},
        {"2*[1,0]+[1]", "10101", "[1,0,1,0,1]"},
        {"[1]*2*2", "1111", "[1]*4"},
        {"[0]+[1]*30", "0111111111111111111111111111111", "[0]+[1]*30"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        struct loom_moe_layers m, back;
        char text[LOOM_MOE_FREQ_TEXT];
        CHECK(loom_moe_layers_parse(ok[i].text, &m) == LOOM_OK && m.freq == 0 &&
              strcmp(m.list, ok[i].layers) == 0);
        loom_moe_layers_text(&m, text, sizeof text);
        CHECK(strcmp(text, ok[i].canonical) == 0);
        CHECK(loom_moe_layers_parse(text, &back) == LOOM_OK && strcmp(back.list, m.list) == 0);
        if (strcmp(text, ok[i].canonical)) fprintf(stderr, "  %s -> %s\n", ok[i].text, text);
    }
    struct loom_moe_layers m;
    CHECK(loom_moe_layers_parse("3", &m) == LOOM_OK && m.freq == 3 && loom_moe_layers_is(&m, 6) &&
          !loom_moe_layers_is(&m, 7) && loom_moe_layers_count(&m, 8) == 3);
    CHECK(loom_moe_layers_parse("[0,1,1]", &m) == LOOM_OK && !loom_moe_layers_is(&m, 0) &&
          loom_moe_layers_is(&m, 2) && !loom_moe_layers_is(&m, 3) && loom_moe_layers_count(&m, 3) == 2);
    static const struct {
        const char *text, *needle;
    } bad[] = {{"0", "in [1, 1024]"},
               {"[1,2]", "0 (dense) or 1"},
               {"[1,0", "',' or ']'"},
               {"([1]", "')' expected"},
               {"[1]*", "a count"},
               {"[1]+", "a list"},
               {"[1]*2000", "above the layers"},
               {"[1]*600*2", "more layers than"},
               {"abc", "a list"},
               {"[]", "a 0 or 1"},
               {"[1] [0]", "unexpected text"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(loom_moe_layers_parse(bad[i].text, &m) == LOOM_ERR_INPUT &&
              strstr(loom_error_message(), "--moe-layer-freq") &&
              strstr(loom_error_message(), bad[i].needle));
        if (!strstr(loom_error_message(), bad[i].needle)) fprintf(stderr, "  %s\n", loom_error_message());
    }
    /* JSON: an integer or a string; anything else named */
    struct loom_config cfg;
    CHECK(parse_json(&cfg, "{\"moe_layer_freq\": 2}", "", 1) == LOOM_OK &&
          strcmp(cfg.moe_layer_freq, "2") == 0);
    loom_config_free(&cfg);
    CHECK(parse_json(&cfg, "{\"moe_layer_freq\": \"[1,0]*2\"}", "", 1) == LOOM_OK &&
          strcmp(cfg.moe_layer_freq, "[1,0]*2") == 0);
    loom_config_free(&cfg);
    expect_json_error("{\"moe_layer_freq\": 1.5}", "", "an integer or a string");
}

int main(void)
{
    test_shape_settings();
    test_moe_layers();
    struct loom_config cfg;
    /* preset, then flags over it */
    CHECK(parse(&cfg, "--model gpt2 --num-layers 2", 1) == LOOM_OK);
    CHECK(cfg.num_layers == 2 && cfg.hidden_size == 768 && cfg.vocab_size == 50257);
    loom_config_free(&cfg);
    CHECK(parse(&cfg, "", 1) == LOOM_OK);
    CHECK(strcmp(cfg.model, "gpt2-tiny") == 0 && cfg.vocab_size == 256);
    CHECK(cfg.lr_decay_iters == cfg.train_iters);
    loom_config_free(&cfg);
    /* --flag=value and repeated path flags */
    CHECK(parse(&cfg, "--lr=0.5 --data-path a b --data-path c", 1) == LOOM_OK);
    CHECK(cfg.lr == 0.5 && cfg.ndata_paths == 3 && strcmp(cfg.data_paths[2], "c") == 0);
    loom_config_free(&cfg);
    /* batch invariant: any two give the third */
    CHECK(parse(&cfg, "--micro-batch-size 4 --global-batch-size 32", 2) == LOOM_OK);
    CHECK(cfg.gradient_accumulation_steps == 4);
    CHECK(parse(&cfg, "--global-batch-size 32 --gradient-accumulation-steps 2", 4) == LOOM_OK);
    CHECK(cfg.micro_batch_size == 4);
    CHECK(parse(&cfg, "--micro-batch-size 3 --gradient-accumulation-steps 5", 1) == LOOM_OK);
    CHECK(cfg.global_batch_size == 15);
    CHECK(parse(&cfg, "--micro-batch-size 3 --gradient-accumulation-steps 5 --global-batch-size 15", 1) ==
          LOOM_OK);
    expect_error("--micro-batch-size 3 --gradient-accumulation-steps 5 --global-batch-size 16",
                 "--global-batch-size 16 != --micro-batch-size 3 x --gradient-accumulation-steps 5");
    expect_error("--micro-batch-size 3 --global-batch-size 16", "not divisible");
    /* bad input, each named */
    expect_error("--num-layer 2", "did you mean --num-layers");
    expect_error("--lr abc", "--lr");
    expect_error("--num-layers 0", "--num-layers");
    expect_error("--num-layers 2.5", "--num-layers");
    expect_error("--lr-decay-style exp", "--lr-decay-style");
    expect_error("--model gpt5", "gpt5");
    expect_error("--lr", "--lr needs a value");
    expect_error("--hidden-size 100 --num-attention-heads 3", "not divisible by --num-attention-heads");
    expect_error("--seq-length 128 --max-position-embeddings 64", "exceeds --max-position-embeddings");
    expect_error("--lr 1e-3 --min-lr 1e-2", "--min-lr");
    expect_error("stray", "stray");
    expect_error("--lr-warmup-style log", "--lr-warmup-style log is for DeepSpeed's schedulers");
    test_json();
    test_origins();
    return check_summary("test_config");
}
