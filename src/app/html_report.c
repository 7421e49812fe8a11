/*
 * `loom report` (html_report.h): reads the metrics rows, draws SVG line
 * plots and one trace step per rank, writes one HTML page.
 */
#include "app/html_report.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "io/fs.h"

#define MAX_FILE ((size_t)1 << 30)

/* ---- the metrics ------------------------------------------------------------ */

enum { S_LOSS, S_LR, S_NORM, S_TPS, S_MFU, S_MS, S_SCALE, S_VAL, S_LB, S_Z, S_COUNT };
static const char *const row_keys[S_COUNT] = {
    "loss",        "lr",         "grad_norm", "tokens_per_s",        "mfu",
    "ms_per_step", "loss_scale", "val_loss",  "load_balancing_loss", "z_loss"};
/* a mixture of experts' tokens per expert (relative to their layer's mean) and dropped share */
static const char *const moe_keys[] = {"min", "max", "cv", "dropped_share"};
#define NMOE 4

static const char *const mem_keys[] = {"params", "grads", "optimizer", "activations",
                                       "comm",   "other", "total"};
#define NMEM ((int)(sizeof mem_keys / sizeof mem_keys[0]))

struct run {
    cJSON **rows; /* parsed lines */
    int nrows;
    const cJSON *config, *last_step; /* the config row and the last step row, or NULL */
    /* per series: steps and values, in file order (NaN: null) */
    double *x[S_COUNT], *y[S_COUNT];
    int n[S_COUNT];
    double *mx, *my[NMEM]; /* rank 0's peak memory by category, MiB */
    int nm;
    double *ex, *ey[NMOE]; /* the moe object's moe_keys, per step */
    int ne;
};

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static int read_run(struct run *r, const char *path)
{
    char *text;
    size_t len;
    int rc = loom_fs_read_small(path, MAX_FILE, &text, &len);
    if (rc) return rc;
    int lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    r->rows = loom_alloc(sizeof *r->rows * (size_t)lines, LOOM_MEM_OTHER);
    for (int s = 0; s < S_COUNT; s++) {
        r->x[s] = loom_alloc(sizeof(double) * (size_t)lines, LOOM_MEM_OTHER);
        r->y[s] = loom_alloc(sizeof(double) * (size_t)lines, LOOM_MEM_OTHER);
    }
    r->mx = loom_alloc(sizeof(double) * (size_t)lines, LOOM_MEM_OTHER);
    r->ex = loom_alloc(sizeof(double) * (size_t)lines, LOOM_MEM_OTHER);
    for (int k = 0; k < NMOE; k++) r->ey[k] = loom_alloc(sizeof(double) * (size_t)lines, LOOM_MEM_OTHER);
    for (int k = 0; k < NMEM; k++) r->my[k] = loom_alloc(sizeof(double) * (size_t)lines, LOOM_MEM_OTHER);
    int lineno = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        lineno++;
        if (!line[strspn(line, " \t\r")]) continue;
        cJSON *o = cJSON_Parse(line);
        if (!cJSON_IsObject(o) && !next) { /* a row cut by a failed write (a full disk): said, skipped */
            cJSON_Delete(o);
            fprintf(stderr, "loom: note: %s:%d: a cut final line (no newline, not a row) skipped\n", path,
                    lineno);
            break;
        }
        if (!cJSON_IsObject(o)) {
            cJSON_Delete(o);
            loom_free(text);
            return loom_error_set(LOOM_ERR_INPUT, "%s:%d: not a metrics row (one JSON object per line)", path,
                                  lineno);
        }
        r->rows[r->nrows++] = o;
        const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(o, "config");
        if (cJSON_IsObject(cfg)) {
            r->config = cfg;
            continue;
        }
        const double step = num(o, "step");
        if (!isfinite(step)) continue;
        if (cJSON_GetObjectItemCaseSensitive(o, "loss")) r->last_step = o;
        for (int s = 0; s < S_COUNT; s++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, row_keys[s]);
            if (!v) continue;
            r->x[s][r->n[s]] = step;
            r->y[s][r->n[s]++] = cJSON_IsNumber(v) ? v->valuedouble : NAN;
        }
        const cJSON *moe = cJSON_GetObjectItemCaseSensitive(o, "moe");
        if (cJSON_IsObject(moe)) {
            const cJSON *tpe = cJSON_GetObjectItemCaseSensitive(moe, "tokens_per_expert");
            r->ex[r->ne] = step;
            for (int k = 0; k < NMOE; k++) r->ey[k][r->ne] = num(k < 3 ? tpe : moe, moe_keys[k]);
            r->ne++;
        }
        const cJSON *mem = cJSON_GetObjectItemCaseSensitive(o, "mem");
        if (cJSON_IsObject(mem)) {
            r->mx[r->nm] = step;
            for (int k = 0; k < NMEM; k++) r->my[k][r->nm] = num(mem, mem_keys[k]) / (1 << 20);
            r->nm++;
        }
    }
    loom_free(text);
    if (!r->last_step)
        return loom_error_set(LOOM_ERR_INPUT, "%s: no training step in it (is it a --metrics file?)", path);
    return LOOM_OK;
}

static void free_run(struct run *r)
{
    for (int i = 0; i < r->nrows; i++) cJSON_Delete(r->rows[i]);
    loom_free(r->rows);
    for (int s = 0; s < S_COUNT; s++) loom_free(r->x[s]), loom_free(r->y[s]);
    loom_free(r->mx);
    for (int k = 0; k < NMEM; k++) loom_free(r->my[k]);
    loom_free(r->ex);
    for (int k = 0; k < NMOE; k++) loom_free(r->ey[k]);
}

/* ---- SVG ---------------------------------------------------------------------- */

static void html_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '"')
            fputs("&quot;", f);
        else
            fputc(*s, f);
    }
}

struct series {
    const char *name, *color;
    const double *x, *y;
    int n;
};

#define W 640
#define H 240
#define ML 64
#define MR 12
#define MT 26
#define MB 30

/* A line plot of the series' finite points; gaps at non-finite values. */
static void svg_plot(FILE *f, const char *title, const struct series *s, int ns)
{
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++) {
            if (!isfinite(s[k].y[i])) continue;
            x0 = fmin(x0, s[k].x[i]), x1 = fmax(x1, s[k].x[i]);
            y0 = fmin(y0, s[k].y[i]), y1 = fmax(y1, s[k].y[i]);
        }
    fputs("<figure><figcaption>", f);
    html_text(f, title);
    fputs("</figcaption>\n", f);
    if (!isfinite(x0)) {
        fputs("<p class=\"none\">no values</p></figure>\n", f);
        return;
    }
    if (x1 == x0) x0 -= 0.5, x1 += 0.5;
    const double pad = y1 > y0 ? 0.05 * (y1 - y0) : fabs(y0) * 0.05 + 1e-12;
    y0 -= pad, y1 += pad;
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n",
            W, H, W, H);
    const double pw = W - ML - MR, ph = H - MT - MB;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%g\" height=\"%g\" class=\"frame\"/>\n", ML, MT, pw, ph);
    for (int t = 0; t <= 4; t++) { /* ticks */
        const double yv = y0 + (y1 - y0) * t / 4, yp = MT + ph * (1 - t / 4.0);
        const double xv = x0 + (x1 - x0) * t / 4, xp = ML + pw * t / 4.0;
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>", ML, yp, ML + pw,
                yp);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" class=\"ytick\">%.4g</text>", ML - 4, yp + 4, yv);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" class=\"xtick\">%.6g</text>\n", xp, H - 10, xv);
    }
    for (int k = 0; k < ns; k++) {
        int open = 0;
        for (int i = 0; i < s[k].n; i++) {
            if (!isfinite(s[k].y[i])) {
                if (open) fputs("\"/>\n", f);
                open = 0;
                continue;
            }
            const double xp = ML + pw * (s[k].x[i] - x0) / (x1 - x0),
                         yp = MT + ph * (1 - (s[k].y[i] - y0) / (y1 - y0));
            if (!open) fprintf(f, "<polyline class=\"line\" stroke=\"%s\" points=\"", s[k].color);
            fprintf(f, "%.1f,%.1f ", xp, yp);
            open = 1;
        }
        if (open) fputs("\"/>\n", f);
        if (s[k].n == 1 && isfinite(s[k].y[0])) /* a lone point: a dot */
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                    ML + pw * (s[k].x[0] - x0) / (x1 - x0), MT + ph * (1 - (s[k].y[0] - y0) / (y1 - y0)),
                    s[k].color);
        fprintf(f, "<text x=\"%.0f\" y=\"16\" fill=\"%s\" class=\"legend\">",
                ML + 10 + fmin(150, pw / ns) * k, s[k].color);
        html_text(f, s[k].name);
        fputs("</text>\n", f);
    }
    fputs("</svg></figure>\n", f);
}

/* ---- the trace: one step per rank ---------------------------------------------- */

/* A mixture of experts' load balance: the balancing losses, the tokens per
 * expert relative to their layer's mean over the steps, the dropped share
 * under a capacity, and (--moe-per-layer-logging) each layer's values at
 * the last step. */
static void moe_section(FILE *f, const struct run *r)
{
    if (!r->n[S_LB] && !r->ne) return;
    fputs("<h2>Load balance (mixture of experts)</h2>\n", f);
    const struct series lb[2] = {{"load_balancing_loss", "#1f77b4", r->x[S_LB], r->y[S_LB], r->n[S_LB]},
                                 {"z_loss", "#d62728", r->x[S_Z], r->y[S_Z], r->n[S_Z]}};
    svg_plot(f, "balancing loss (1 when balanced) and z-loss (unweighted, layers' mean)", lb, 2);
    const struct series tpe[3] = {{"least-loaded expert", "#2ca02c", r->ex, r->ey[0], r->ne},
                                  {"most-loaded expert", "#d62728", r->ex, r->ey[1], r->ne},
                                  {"coefficient of variation", "#9467bd", r->ex, r->ey[2], r->ne}};
    svg_plot(f, "tokens per expert, relative to their layer's mean", tpe, 3);
    int dropped = 0;
    for (int i = 0; i < r->ne; i++) dropped |= r->ey[3][i] > 0;
    if (dropped) {
        const struct series d = {"dropped share", "#8c564b", r->ex, r->ey[3], r->ne};
        svg_plot(f, "choices a capacity dropped (share)", &d, 1);
    }
    const cJSON *moe = cJSON_GetObjectItemCaseSensitive(r->last_step, "moe");
    const cJSON *layers = moe ? cJSON_GetObjectItemCaseSensitive(moe, "layers") : NULL;
    if (!cJSON_IsArray(layers)) {
        fputs("<p class=\"none\">per layer: run with --moe-per-layer-logging</p>\n", f);
        return;
    }
    fputs("<table><tr><th>layer</th><th>load_balancing_loss</th><th>z_loss</th><th>tokens per expert cv</th>"
          "</tr>\n",
          f);
    const cJSON *x;
    cJSON_ArrayForEach(x, layers)
    {
        fprintf(f, "<tr><td>%.0f</td><td>%.4f</td><td>%.4f</td><td>%.3f</td></tr>\n", num(x, "layer"),
                num(x, "load_balancing_loss"), num(x, "z_loss"), num(x, "tokens_per_expert_cv"));
    }
    fputs("</table><p>Each MoE layer at the last logged step: its balancing loss is 1 when its experts are "
          "evenly loaded and the router's probabilities even, and grows as a few experts take more.</p>\n",
          f);
}

static const char *slice_color(const char *cat, const char *name)
{
    if (!strcmp(cat, "wait")) return "#d62728";
    if (!strncmp(name, "forward", 7)) return "#1f77b4";
    if (!strncmp(name, "backward", 8)) return "#ff7f0e";
    if (!strcmp(name, "optimizer step")) return "#2ca02c";
    return "#7f7f7f";
}

/* The last traced step of every rank as rows of slices (compute, then waits). */
static void trace_section(FILE *f, const char *path)
{
    char *text;
    size_t len;
    if (loom_fs_read_small(path, MAX_FILE, &text, &len)) {
        loom_error_clear();
        return;
    }
    cJSON *doc = cJSON_Parse(text);
    loom_free(text);
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(doc, "traceEvents");
    if (!cJSON_IsArray(ev)) {
        fputs("<p class=\"none\">the trace file is not trace-event JSON</p>\n", f);
        cJSON_Delete(doc);
        return;
    }
    int ranks = 0, last_step = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, ev)
    {
        const cJSON *cat = cJSON_GetObjectItemCaseSensitive(e, "cat");
        ranks = (int)fmax(ranks, num(e, "pid") + 1);
        if (cJSON_IsString(cat) && !strcmp(cat->valuestring, "step"))
            last_step = (int)fmax(last_step, num(cJSON_GetObjectItemCaseSensitive(e, "args"), "step"));
    }
    if (last_step < 0 || ranks < 1 || ranks > 4096) {
        fputs("<p class=\"none\">no traced step</p>\n", f);
        cJSON_Delete(doc);
        return;
    }
    fprintf(
        f,
        "<h2>Step %d, as traced</h2>\n<p>Per rank: compute (forward blue, backward orange, optimizer "
        "green, data grey) and, below it, waits on communication (red). Hover a slice for its name.</p>\n",
        last_step);
    const int rowh = 18, gap = 10;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\">\n", W + 200,
            ranks * (2 * rowh + gap) + 10);
    for (int r = 0; r < ranks; r++) {
        double t0 = NAN, dur = NAN;
        cJSON_ArrayForEach(e, ev)
        {
            const cJSON *cat = cJSON_GetObjectItemCaseSensitive(e, "cat");
            if ((int)num(e, "pid") == r && cJSON_IsString(cat) && !strcmp(cat->valuestring, "step") &&
                (int)num(cJSON_GetObjectItemCaseSensitive(e, "args"), "step") == last_step)
                t0 = num(e, "ts"), dur = num(e, "dur");
        }
        const int y = 5 + r * (2 * rowh + gap);
        fprintf(f, "<text x=\"0\" y=\"%d\" class=\"legend\">rank %d</text>\n", y + rowh - 4, r);
        if (!(dur > 0)) continue;
        cJSON_ArrayForEach(e, ev)
        {
            const cJSON *cat = cJSON_GetObjectItemCaseSensitive(e, "cat"),
                        *name = cJSON_GetObjectItemCaseSensitive(e, "name"),
                        *ph = cJSON_GetObjectItemCaseSensitive(e, "ph");
            if ((int)num(e, "pid") != r || !cJSON_IsString(cat) || !cJSON_IsString(name) ||
                !cJSON_IsString(ph) || strcmp(ph->valuestring, "X") || !strcmp(cat->valuestring, "step"))
                continue;
            const double ts = num(e, "ts"), d = num(e, "dur");
            if (!(ts >= t0 && ts + d <= t0 + dur + 1)) continue;
            const int wait = !strcmp(cat->valuestring, "wait");
            fprintf(f, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\"><title>",
                    80 + W * (ts - t0) / dur, y + (wait ? rowh : 0), fmax(W * d / dur, 0.3), rowh - 2,
                    slice_color(cat->valuestring, name->valuestring));
            html_text(f, name->valuestring);
            fprintf(f, " %.3f ms</title></rect>\n", d / 1e3);
        }
    }
    fputs("</svg>\n", f);
    cJSON_Delete(doc);
}

/* ---- the page ------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n)
{
    double *c = loom_alloc(sizeof(double) * (size_t)(n ? n : 1), LOOM_MEM_OTHER);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(v[i])) c[k++] = v[i];
    qsort(c, (size_t)k, sizeof *c, cmp_double);
    const double m = k ? c[k / 2] : NAN;
    loom_free(c);
    return m;
}

static void write_page(FILE *f, const struct run *r, const char *metrics, const char *trace)
{
    fputs(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>loom report</title>\n"
        "<style>body{font:14px "
        "sans-serif;margin:24px;max-width:1400px}figure{display:inline-block;margin:8px}"
        "figcaption{font-weight:bold}.frame{fill:none;stroke:#999}.grid{stroke:#eee}.line{fill:none;"
        "stroke-width:1.5}.ytick{text-anchor:end;font-size:11px}.xtick{text-anchor:middle;font-size:11px}"
        ".legend{font-size:12px}.none{color:#999}table{border-collapse:collapse}td,th{border:1px solid #ddd;"
        "padding:2px 8px;text-align:right}th{background:#f4f4f4}td.l{text-align:left}</style></head><body>\n"
        "<h1>loom report</h1>\n<p>Metrics: <code>",
        f);
    html_text(f, metrics);
    fputs("</code>", f);
    if (trace) {
        fputs("; trace: <code>", f);
        html_text(f, trace);
        fputs("</code>", f);
    }
    fputs("</p>\n", f);
    const cJSON *layout = cJSON_GetObjectItemCaseSensitive(r->last_step, "layout");
    const int n = r->n[S_LOSS];
    fprintf(f,
            "<table><tr><th>steps logged</th><th>last step</th><th>final loss</th><th>final val loss</th>"
            "<th>median tokens/s</th><th>median MFU</th><th>median ms/step</th><th>layout</th></tr>\n"
            "<tr><td>%d</td><td>%.0f</td><td>%.4f</td><td>%.4f</td><td>%.0f</td><td>%.1f%%</td><td>%.1f</td>"
            "<td class=\"l\">",
            n, n ? r->x[S_LOSS][n - 1] : NAN, n ? r->y[S_LOSS][n - 1] : NAN,
            r->n[S_VAL] ? r->y[S_VAL][r->n[S_VAL] - 1] : NAN, median(r->y[S_TPS], r->n[S_TPS]),
            100 * median(r->y[S_MFU], r->n[S_MFU]), median(r->y[S_MS], r->n[S_MS]));
    html_text(f, cJSON_IsString(layout) ? layout->valuestring : "one process");
    fputs("</td></tr></table>\n<h2>Training</h2>\n", f);
    const struct series loss[2] = {{"train loss", "#1f77b4", r->x[S_LOSS], r->y[S_LOSS], r->n[S_LOSS]},
                                   {"validation loss", "#d62728", r->x[S_VAL], r->y[S_VAL], r->n[S_VAL]}};
    svg_plot(f, "loss", loss, r->n[S_VAL] ? 2 : 1);
    const struct series lr = {"learning rate", "#2ca02c", r->x[S_LR], r->y[S_LR], r->n[S_LR]};
    svg_plot(f, "learning rate", &lr, 1);
    const struct series norm = {"gradient norm (before clipping)", "#9467bd", r->x[S_NORM], r->y[S_NORM],
                                r->n[S_NORM]};
    svg_plot(f, "gradient norm", &norm, 1);
    if (r->n[S_SCALE]) {
        const struct series sc = {"loss scale", "#8c564b", r->x[S_SCALE], r->y[S_SCALE], r->n[S_SCALE]};
        svg_plot(f, "fp16 loss scale", &sc, 1);
    }
    moe_section(f, r);
    fputs("<h2>Speed</h2>\n", f);
    const struct series tps = {"tokens/s", "#1f77b4", r->x[S_TPS], r->y[S_TPS], r->n[S_TPS]};
    svg_plot(f, "tokens/s", &tps, 1);
    double *mfu = loom_alloc(sizeof(double) * (size_t)(r->n[S_MFU] ? r->n[S_MFU] : 1), LOOM_MEM_OTHER);
    for (int i = 0; i < r->n[S_MFU]; i++) mfu[i] = 100 * r->y[S_MFU][i];
    const struct series m = {"MFU %", "#ff7f0e", r->x[S_MFU], mfu, r->n[S_MFU]};
    svg_plot(f, "model FLOPs utilisation (%)", &m, 1);
    loom_free(mfu);
    fputs("<h2>Memory</h2>\n", f);
    static const char *const colors[NMEM] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                             "#9467bd", "#8c564b", "#333333"};
    struct series mem[NMEM];
    for (int k = 0; k < NMEM; k++) mem[k] = (struct series){mem_keys[k], colors[k], r->mx, r->my[k], r->nm};
    svg_plot(f, "rank 0's peak memory by category per step (MiB)", mem, NMEM);
    fputs("<table class=\"mem\"><tr><th>rank</th>", f);
    for (int k = 0; k < NMEM; k++) fprintf(f, "<th>%s (MiB)</th>", mem_keys[k]);
    fputs("</tr>\n", f);
    const cJSON *by_rank = cJSON_GetObjectItemCaseSensitive(r->last_step, "mem_by_rank");
    const cJSON *one = cJSON_GetObjectItemCaseSensitive(r->last_step, "mem");
    const int nr = cJSON_IsArray(by_rank) ? cJSON_GetArraySize(by_rank) : 1;
    for (int i = 0; i < nr; i++) {
        const cJSON *row = cJSON_IsArray(by_rank) ? cJSON_GetArrayItem(by_rank, i) : one;
        fprintf(f, "<tr><td>%d</td>", i);
        for (int k = 0; k < NMEM; k++) fprintf(f, "<td>%.1f</td>", num(row, mem_keys[k]) / (1 << 20));
        fputs("</tr>\n", f);
    }
    fputs("</table><p>Peak bytes of each rank at the last logged step, by loom's accounting.</p>\n", f);
    if (trace) trace_section(f, trace);
    fputs("<h2>Configuration</h2>\n", f);
    if (!r->config) {
        fputs("<p class=\"none\">not in this metrics file (written by an older loom)</p>\n", f);
    } else {
        fputs("<table>\n", f);
        const cJSON *c;
        cJSON_ArrayForEach(c, r->config)
        {
            fputs("<tr><td class=\"l\">--", f);
            html_text(f, c->string);
            fputs("</td><td class=\"l\">", f);
            html_text(f, cJSON_IsString(c) ? c->valuestring : "?");
            fputs("</td></tr>\n", f);
        }
        fputs("</table>\n", f);
    }
    fputs("</body></html>\n", f);
}

/* The page is made in memory, then written: to a temporary name and renamed
 * over a regular file (a failed write keeps the earlier page and leaves
 * nothing cut), or straight to anything else (a device, a pipe). */
static int save_page(const char *page, const struct run *r, const char *metrics, const char *trace)
{
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (!m)
        return loom_error_set(LOOM_ERR_RUNTIME, "loom report: no memory for the page: %s", strerror(errno));
    write_page(m, r, metrics, trace);
    if (fclose(m) != 0) {
        free(text);
        return loom_error_set(LOOM_ERR_RUNTIME, "loom report: no memory for the page: %s", strerror(errno));
    }
    struct stat st;
    char dir[4096];
    loom_fs_dirname(page, dir, sizeof dir);
    int rc = LOOM_OK;
    if (access(dir, W_OK) != 0) { /* a path that cannot be: bad input */
        rc = loom_error_set(LOOM_ERR_INPUT, "loom report: cannot write %s: %s", page, strerror(errno));
        free(text);
        return rc;
    }
    if (stat(page, &st) != 0 || S_ISREG(st.st_mode)) {
        const void *parts[] = {text};
        rc = loom_fs_write_atomic(page, parts, &len, 1);
    } else {
        FILE *f = fopen(page, "w");
        if (!f) {
            rc = loom_error_set(LOOM_ERR_RUNTIME, "open %s: %s", page, strerror(errno));
        } else {
            const int ok = fwrite(text, 1, len, f) == len && fflush(f) == 0;
            const int e = errno;
            if (fclose(f) != 0 || !ok)
                rc = loom_error_set(LOOM_ERR_RUNTIME, "write %s: %s", page, strerror(ok ? errno : e));
        }
    }
    free(text);
    if (rc) {
        char why[1024];
        snprintf(why, sizeof why, "%s", loom_error_message());
        rc = loom_error_set(LOOM_ERR_RUNTIME, "loom report: cannot write %s: %s", page, why);
    }
    return rc;
}

int loom_report_html(int argc, char **argv)
{
    const char *src = NULL, *out = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (i + 1 >= argc) return loom_error_set(LOOM_ERR_INPUT, "loom report: %s needs FILE", argv[i]);
            out = argv[++i];
        } else if (argv[i][0] == '-') {
            return loom_error_set(LOOM_ERR_INPUT, "loom report: unknown flag %s (-o FILE)", argv[i]);
        } else if (src) {
            return loom_error_set(LOOM_ERR_INPUT, "loom report: one run at a time (got %s and %s)", src,
                                  argv[i]);
        } else {
            src = argv[i];
        }
    }
    if (!src) return loom_error_set(LOOM_ERR_INPUT, "usage: loom report RUN_DIR_OR_METRICS [-o FILE]");
    char metrics[4096], trace[4096], dir[4000], page[4096];
    if (loom_fs_is_dir(src)) {
        snprintf(dir, sizeof dir, "%s", src);
        snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", src);
    } else {
        snprintf(metrics, sizeof metrics, "%s", src);
        const char *slash = strrchr(src, '/');
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - src) : 1, slash ? src : ".");
    }
    snprintf(trace, sizeof trace, "%s/trace.json", dir);
    const int have_trace = access(trace, R_OK) == 0;
    if (out)
        snprintf(page, sizeof page, "%s", out);
    else
        snprintf(page, sizeof page, "%s/report.html", dir);
    struct run r = {0};
    int rc = read_run(&r, metrics);
    if (rc == LOOM_OK) rc = save_page(page, &r, metrics, have_trace ? trace : NULL);
    if (rc == LOOM_OK) printf("wrote %s\n", page);
    free_run(&r);
    return rc;
}
