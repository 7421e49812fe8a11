/*
 * The `loom` command: dispatches subcommands, turns statuses into one-line
 * errors and exit codes (0 done, 2 bad input, 1 failure while running).
 * Subcommands not built yet (plan, report) say so.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "app/html_report.h"
#include "app/plan.h"
#include "app/sample.h"
#include "app/stop.h"
#include "base/blas_env.h"
#include "base/log.h"
#include "cli/convert.h"
#include "cli/data.h"
#include "cli/launch.h"
#include "comm/comm.h"
#include "config/config.h"
#include "engine/checkpoint.h"
#include "io/checkpoint.h"
#include "io/fs.h"
#include "io/synth.h"
#include "loom/loom.h"
#include "loom/train.h"
#include "model/family.h"
#include "parallel/kinds.h"

static void usage(FILE *f)
{
    const struct loom_model_family *fam;
    fprintf(
        f,
        "loom %s: training for transformer language models\n\n"
        "usage: loom COMMAND [flags]\n\n"
        "commands:\n"
        "  train                      train a model (default: %s on the built-in corpus)\n"
        "  eval --load W              validation loss of a checkpoint or weights file\n"
        "  sample --load W            continue --prompt from a checkpoint or weights file\n"
        "  data tokenize --tokenizer TOK IN... DIR   .txt/.jsonl into llm.c shards (DIR/train_*.bin, "
        "val_*.bin)\n"
        "  data tokenize IN.txt DIR   byte-level: a text file into DIR/{train,val}.bin\n"
        "  data train-tokenizer --vocab-size N IN... DIR   learn byte-level BPE, write DIR/tokenizer.json\n"
        "  data synth DIR [--tokens N] [--seed S]   write the built-in corpus\n"
        "  convert IN OUT [--to llmc|safetensors|hf]   weights between llm.c .bin, safetensors and\n"
        "                             Hugging Face directories; also exports loom checkpoints\n"
        "  launch --nproc-per-node N [--hostfile F] -- train ARGS   run train on N ranks (mpirun)\n"
        "  plan [train flags] --global-batch-size G --world N   which layout: ranked by predicted step\n"
        "                             time, with memory a rank by category (loom plan --help)\n"
        "  report RUN_DIR_OR_METRICS [-o FILE]   one HTML page of a run (--metrics, and trace.json)\n\n"
        "models (--model PRESET):\n",
        LOOM_VERSION, loom_model_family_at(0)->presets[0].name);
    for (int i = 0; (fam = loom_model_family_at(i)); i++)
        for (int k = 0; k < fam->npresets; k++)
            fprintf(f, "  %-26s %s\n", fam->presets[k].name, fam->presets[k].summary);
    fprintf(f,
            "\nloom COMMAND --help: a command's usage and its own flags (loom train --help all: every\n"
            "flag). Megatron-LM's flags and DeepSpeed's JSON (--deepspeed-config) name the same settings.\n");
}

static const char report_usage[] =
    "usage: loom report RUN [-o FILE]\n"
    "One self-contained HTML page of a run: its loss, throughput, memory and gradient norm by step,\n"
    "the configuration, and the traced step's timeline. RUN: a directory holding metrics.jsonl (and\n"
    "trace.json), or a --metrics file. -o FILE: where the page goes (default: report.html beside them).\n";

/* Prints the error (unless another rank prints the shared one) and returns rc. */
static int fail(int rc)
{
    if (loom_error_is_set()) fprintf(stderr, "loom: error: %s\n", loom_error_message());
    return rc;
}

/* train, eval and sample: the model's shape comes from what --load names
 * (a loom checkpoint, or a weights source of the --model preset's family):
 * the flags and the JSON file may repeat it, not contradict it. The
 * sequence follows a shorter position table unless it is given. */
static int shape_from_load(struct loom_config *cfg)
{
    struct stat sb;
    if (stat(cfg->load, &sb) != 0) /* said here: the readers below name the file, not the flag */
        return loom_error_set(LOOM_ERR_INPUT, "--load %s: %s", cfg->load, strerror(errno));
    int rc = loom_checkpoint_read_shape(cfg->load, cfg);
    if (rc == LOOM_OK && !loom_config_given(cfg, "--seq-length") &&
        cfg->seq_length > cfg->max_position_embeddings)
        cfg->seq_length = cfg->max_position_embeddings;
    return rc;
}

int main(int argc, char **argv)
{
    /* a file-size limit makes write() fail with EFBIG, reported like a full
     * disk, instead of killing the process */
    signal(SIGXFSZ, SIG_IGN);
    loom_blas_select_core(argc, argv);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? LOOM_ERR_INPUT : LOOM_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("loom %s\n", LOOM_VERSION);
        return 0;
    }
    const char *cmd = argv[1];
    int rc;
    if (strcmp(cmd, "data") == 0) return (rc = loom_cli_data(argc - 2, argv + 2)) ? fail(rc) : 0;
    if (strcmp(cmd, "train") == 0 || strcmp(cmd, "eval") == 0 || strcmp(cmd, "sample") == 0) {
        struct loom_config cfg;
        int help;
        if ((rc = loom_config_parse(&cfg, argc - 2, argv + 2, &help))) {
            loom_config_free(&cfg);
            if (strcmp(cmd, "sample") == 0) return fail(rc);
            /* under mpirun every rank parsed the same flags: rank 0 says what is wrong, once */
            loom_comm_init(&argc, &argv);
            if (loom_comm_world_rank() != 0) loom_error_clear();
            fail(rc);
            loom_comm_finalize();
            return rc;
        }
        if (help) {
            loom_config_print_help(stdout, cmd, help == 2);
            loom_config_free(&cfg);
            return 0;
        }
        /* Megatron's resume idiom, --save DIR --load DIR: before the first checkpoint there is nothing to
         * load and the run starts from the beginning (--exit-on-missing-checkpoint: it exits instead) */
        if (strcmp(cmd, "train") == 0 && *cfg.load && strcmp(cfg.load, cfg.save) == 0 &&
            !loom_ckpt_is_checkpoint(cfg.load) && !cfg.exit_on_missing_checkpoint) {
            const char *r = getenv("OMPI_COMM_WORLD_RANK"); /* said once: MPI is not up yet */
            if (!r || strcmp(r, "0") == 0)
                fprintf(stderr,
                        "loom: --load %s holds no checkpoint yet: training from the beginning, saving there "
                        "(--exit-on-missing-checkpoint exits instead)\n",
                        cfg.load);
            cfg.load[0] = 0;
        }
        if (strcmp(cmd, "train") != 0 && !*cfg.load)
            rc = loom_error_set(LOOM_ERR_INPUT,
                                "loom %s needs --load (a checkpoint, a Hugging Face directory, a safetensors "
                                "file or an llm.c checkpoint)",
                                cmd);
        else if (*cfg.load)
            rc = shape_from_load(&cfg);
        if (strcmp(cmd, "train") == 0) {
            loom_stop_install(); /* before MPI starts: a stop asked during set-up is kept */
            /* every rank parses the same flags; setup agrees on errors across ranks */
            loom_comm_init(&argc, &argv);
            if (rc && loom_comm_world_rank() != 0)
                loom_error_clear(); /* every rank read the same file: rank 0 says it */
            rc = rc ? rc : loom_train(&cfg);
            if (rc) fail(rc);
            loom_comm_finalize();
            loom_config_free(&cfg);
            return rc;
        }
        if (rc == LOOM_OK && strcmp(cmd, "eval") == 0) {
            /* one process; under mpirun every rank learns the world size and refuses once */
            loom_comm_init(&argc, &argv);
            rc = loom_eval(&cfg);
            if (rc) fail(rc);
            loom_comm_finalize();
            loom_config_free(&cfg);
            return rc;
        }
        if (rc == LOOM_OK && strcmp(cmd, "sample") == 0 && (rc = loom_kinds_resolve(&cfg, 1)) == LOOM_OK)
            rc = loom_sample(&cfg);
        loom_config_free(&cfg);
        return rc ? fail(rc) : 0;
    }
    if (strcmp(cmd, "launch") == 0) return (rc = loom_launch(argc - 2, argv + 2)) ? fail(rc) : 0;
    if (strcmp(cmd, "convert") == 0) return (rc = loom_convert(argc - 2, argv + 2)) ? fail(rc) : 0;
    if (strcmp(cmd, "report") == 0) {
        for (int i = 2; i < argc; i++)
            if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
                fputs(report_usage, stdout);
                return 0;
            }
        return (rc = loom_report_html(argc - 2, argv + 2)) ? fail(rc) : 0;
    }
    if (strcmp(cmd, "plan") == 0) {
        /* --calibrate under mpirun measures the links: MPI runs for it alone */
        int calib = 0;
        for (int i = 2; i < argc; i++) calib |= strcmp(argv[i], "--calibrate") == 0;
        if (calib) { /* ranks waiting for rank 0's measurements give it their cores */
            setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
            loom_comm_init(&argc, &argv);
        }
        rc = loom_plan_main(argc - 2, argv + 2);
        if (rc) fail(rc);
        if (calib) loom_comm_finalize();
        return rc;
    }
    loom_error_set(
        LOOM_ERR_INPUT,
        "unknown command '%s' (train, eval, sample, data, convert, launch, plan, report; see loom --help)",
        cmd);
    return fail(LOOM_ERR_INPUT);
}
