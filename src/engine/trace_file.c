/*
 * --trace FILE (see trace_file.h): the file made at start-up, every rank's
 * events gathered to rank 0 and written as trace-event JSON at the end.
 */
#include "engine/trace_file.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/trace.h"
#include "comm/comm.h"
#include "io/fs.h"
#include "loom/loom.h"

int loom_trace_file_begin(const struct loom_config *cfg, const struct loom_topology *topo, int64_t done)
{
    if (!*cfg->trace) return LOOM_OK;
    int rc = LOOM_OK;
    if (topo->rank == 0 && !(rc = loom_fs_check_output(cfg->trace, "--trace"))) {
        FILE *f = fopen(cfg->trace, "w");
        if (!f)
            rc = loom_error_set(LOOM_ERR_INPUT, "--trace: cannot create %s: %s", cfg->trace, strerror(errno));
        else
            fclose(f);
    }
    if ((rc = loom_comm_agree(rc, NULL))) return rc;
    /* the same origin on every rank: right after the barrier the agreement was */
    const int first = cfg->trace_first ? cfg->trace_first : (int)done + 1;
    const int last = cfg->trace_first ? cfg->trace_last : (int)done + 10;
    loom_trace_start(first, last, loom_now());
    return LOOM_OK;
}

int loom_trace_file_write(const struct loom_config *cfg, const struct loom_topology *topo)
{
    if (!*cfg->trace) return LOOM_OK;
    const int world = topo->world;
    size_t n;
    const char *ev = loom_trace_events(&n);
    int64_t mine = (int64_t)n, *lens = loom_alloc(sizeof(int64_t) * (size_t)world, LOOM_MEM_OTHER);
    loom_comm_wait(loom_comm_allgather(LOOM_GROUP_WORLD, loom_buf_of(&mine, 1, LOOM_DTYPE_I64),
                                       loom_buf_of(lens, (size_t)world, LOOM_DTYPE_I64)));
    int *counts = loom_alloc(sizeof(int) * 2 * (size_t)world, LOOM_MEM_OTHER), *displs = counts + world;
    size_t total = 0;
    for (int k = 0; k < world; k++) {
        if (lens[k] > INT32_MAX - (int64_t)total)
            loom_die("--trace: the events pass 2 GB; trace fewer steps");
        counts[k] = (int)lens[k];
        displs[k] = (int)total;
        total += (size_t)lens[k];
    }
    char *all = loom_alloc(total + 1, LOOM_MEM_OTHER);
    loom_comm_wait(loom_comm_allgather_v(LOOM_GROUP_WORLD, loom_buf_of((void *)ev, n, LOOM_DTYPE_U8),
                                         loom_buf_of(all, total, LOOM_DTYPE_U8), counts, displs));
    int rc = LOOM_OK;
    if (topo->rank == 0) {
        FILE *f = fopen(cfg->trace, "w");
        if (!f) {
            rc = loom_error_set(LOOM_ERR_RUNTIME, "--trace %s: cannot open for writing: %s", cfg->trace,
                                strerror(errno));
        } else {
            char where[64];
            fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", f);
            for (int k = 0; k < world; k++) {
                struct loom_topology t = *topo;
                t.rank = k;
                loom_topology_format(&t, where, sizeof where);
                fprintf(f,
                        "%s{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":"
                        "\"rank %d %s\"}},\n"
                        "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"sort_"
                        "index\":%d}},\n"
                        "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":"
                        "\"compute\"}},\n"
                        "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":1,\"args\":{\"name\":"
                        "\"communication\"}}",
                        k ? ",\n" : "", k, k, where, k, k, k, k);
                if (counts[k]) {
                    fputs(",\n", f);
                    fwrite(all + displs[k], 1, (size_t)counts[k], f);
                }
            }
            fputs("\n]}\n", f);
            /* every write checked: a failed one sets the error flag, and the
             * close flushes the rest */
            const int ok = fflush(f) == 0 && !ferror(f), e = errno ? errno : EIO;
            if (fclose(f) != 0 || !ok)
                rc = loom_error_set(LOOM_ERR_RUNTIME, "--trace %s: write failed: %s", cfg->trace,
                                    strerror(ok ? errno : e));
        }
    }
    loom_free(lens);
    loom_free(counts);
    loom_free(all);
    loom_trace_stop();
    return loom_comm_agree(rc, NULL);
}
