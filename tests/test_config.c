/*
 * The settings table: defaults < preset < flags, the batch invariant in each
 * of its forms, and bad values named in one line.
 */
#include <string.h>

#include "check.h"
#include "engine/config.h"
#include "loom/loom.h"

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

int main(void)
{
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
    CHECK(parse(&cfg, "--micro-batch-size 3 --gradient-accumulation-steps 5 --global-batch-size 15", 1) == LOOM_OK);
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
    return check_summary("test_config");
}
