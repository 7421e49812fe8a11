/*
 * megatron_samples SPLIT COUNT [loom train flags]
 * opens the data a `loom train` with those flags reads (app/run_data.h:
 * the flags parsed and resolved for one process) and prints what it
 * reads: SPLIT train, the rows of steps 0, 1, ... (global rows in order,
 * as loom_data_batch gives them to the ranks); valid or test, the
 * evaluation batches 0, 1, ...; COUNT rows in all, one line of T + 1
 * token ids each (the inputs and the last target), after a line
 * "size <samples in the split's stream>". tests/test_megatron_data.py
 * compares them with Megatron-Core's BlendedMegatronDatasetBuilder. A bad
 * input: the one-line error, exit 2.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/run_data.h"
#include "base/log.h"
#include "config/config.h"
#include "loom/loom.h"

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: megatron_samples train|valid|test COUNT [loom train flags]\n");
        return 2;
    }
    const char *split = argv[1];
    const long long count = atoll(argv[2]);
    struct loom_config cfg;
    int help = 0, rc = loom_config_parse(&cfg, argc - 3, argv + 3, &help);
    if (!rc) rc = loom_config_resolve(&cfg, 1);
    struct loom_run_data d;
    if (!rc) rc = loom_run_data_open(&d, &cfg, 1);
    if (rc) {
        fprintf(stderr, "error: %s\n", loom_error_message());
        return 2;
    }
    const struct loom_data *data = strcmp(split, "train") == 0   ? &d.train
                                   : strcmp(split, "valid") == 0 ? &d.valid
                                                                 : &d.test;
    const int G = cfg.global_batch_size, T = cfg.seq_length;
    printf("size %lld\n", data->stream ? (long long)data->stream->size : -1LL);
    int32_t *in = malloc(sizeof *in * (size_t)G * (size_t)T),
            *tg = malloc(sizeof *tg * (size_t)G * (size_t)T);
    for (long long b = 0; b * G < count && !rc; b++) {
        rc = data == &d.train ? loom_data_batch(data, (enum loom_data_order)cfg.data_order,
                                                (uint64_t)cfg.seed, b, G, 0, G, T, in, tg)
                              : loom_data_eval_batch(data, b, G, 0, G, T, in, tg);
        for (long long r = 0; r < G && b * G + r < count && !rc; r++) {
            for (int t = 0; t < T; t++) printf("%d ", in[r * T + t]);
            printf("%d\n", tg[r * T + T - 1]);
        }
    }
    if (rc) fprintf(stderr, "error: %s\n", loom_error_message());
    free(in);
    free(tg);
    loom_run_data_close(&d);
    loom_config_free(&cfg);
    return rc ? 1 : 0;
}
