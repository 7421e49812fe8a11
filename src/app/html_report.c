/*
 * `loom report` (html_report.h): reads the metrics rows, draws SVG line
 * plots and one trace step per rank, writes one HTML page. The plots'
 * axes are a plotting library's: ticks at 1, 2 or 5 times a power of ten,
 * labelled with the digits their step needs, value axes from the tick at
 * or below the smallest value, every axis titled; the trace strip has a
 * time scale. The medians are the trainer's closing summary's
 * (loom_report_median) over the last run's steps. No script, nothing
 * loaded: the page stands alone.
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

#include "app/plot_axis.h"
#include "app/report.h"
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
    int first[S_COUNT];    /* each series' first row of the last run (after its config row) */
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
        if (cJSON_IsObject(cfg)) { /* a run starts */
            r->config = cfg;
            memcpy(r->first, r->n, sizeof r->first);
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
#define H 250
#define ML 72
#define MR 12
#define MT 26
#define MB 40
#define PW (W - ML - MR)
#define PH (H - MT - MB)

/* Where a step and a value go in the plot's frame. */
static double px(const struct axis *a, double x)
{
    return ML + PW * (x - a->lo) / (a->hi - a->lo);
}
static double py(const struct axis *a, double y)
{
    return MT + PH * (1 - (y - a->lo) / (a->hi - a->lo));
}

/* The extent of the series' points with a finite value: steps [x0, x1],
 * values [y0, y1]; x0 infinite when there is none. */
static void extent(const struct series *s, int ns, double *x0, double *x1, double *y0, double *y1)
{
    *x0 = *y0 = INFINITY, *x1 = *y1 = -INFINITY;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++) {
            if (!isfinite(s[k].y[i])) continue;
            *x0 = fmin(*x0, s[k].x[i]), *x1 = fmax(*x1, s[k].x[i]);
            *y0 = fmin(*y0, s[k].y[i]), *y1 = fmax(*y1, s[k].y[i]);
        }
}

/* The value axis over [y0, y1]; one value alone (or values within
 * rounding of each other) gets room around it on its side of zero (0 gets
 * [0, 1]). */
static struct axis value_axis(double y0, double y1)
{
    if (y1 - y0 <= 1e-9 * fmax(fabs(y0), fabs(y1))) {
        const double v = y0, u = v ? fabs(v) / 2 : 1;
        y0 = v ? v - u : 0, y1 = v + u;
    }
    return nice_axis(y0, y1, 1, 0);
}

/* The step axis over [x0, x1]: whole steps; one step alone gets one more
 * on each side (none below step 0). */
static struct axis step_axis(double x0, double x1)
{
    if (x1 == x0) x0 = x0 >= 1 ? x0 - 1 : x0, x1 += 1;
    return nice_axis(x0, x1, 0, 1);
}

/* The grid, the ticks with their labels and the axes' titles. */
static void draw_axes(FILE *f, const struct axis *xa, const struct axis *ya, const char *ytitle)
{
    char label[32];
    for (long long i = tick_first(ya); i <= tick_last(ya); i++) {
        const double v = (double)i * ya->step, y = py(ya, v);
        tick_label(label, sizeof label, v, ya);
        fprintf(f,
                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" class=\"grid\"/>"
                "<text x=\"%d\" y=\"%.1f\" class=\"ytick\">%s</text>\n",
                ML, y, W - MR, y, ML - 5, y + 4, label);
    }
    for (long long i = tick_first(xa); i <= tick_last(xa); i++) {
        const double v = (double)i * xa->step, x = px(xa, v);
        tick_label(label, sizeof label, v, xa);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" class=\"grid\"/>"
                "<text x=\"%.1f\" y=\"%d\" class=\"xtick\">%s</text>\n",
                x, MT, x, H - MB, x, H - MB + 15, label);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"xtitle\">step</text>\n", ML + PW / 2, H - 6);
    fprintf(f, "<text transform=\"rotate(-90)\" x=\"%d\" y=\"14\" class=\"ytitle\">", -(MT + PH / 2));
    html_text(f, ytitle);
    fputs("</text>\n", f);
}

/* One series: a line through its finite points, gaps at the others, a dot
 * for a lone point. */
static void draw_series(FILE *f, const struct series *s, const struct axis *xa, const struct axis *ya)
{
    int open = 0;
    for (int i = 0; i < s->n; i++) {
        if (!isfinite(s->y[i])) {
            if (open) fputs("\"/>\n", f);
            open = 0;
            continue;
        }
        if (!open) fprintf(f, "<polyline class=\"line\" stroke=\"%s\" points=\"", s->color);
        fprintf(f, "%.1f,%.1f ", px(xa, s->x[i]), py(ya, s->y[i]));
        open = 1;
    }
    if (open) fputs("\"/>\n", f);
    if (s->n == 1 && isfinite(s->y[0]))
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px(xa, s->x[0]),
                py(ya, s->y[0]), s->color);
}

/* A line plot of the series over the steps, its values' axis titled ytitle. */
static void svg_plot(FILE *f, const char *title, const char *ytitle, const struct series *s, int ns)
{
    double x0, x1, y0, y1;
    extent(s, ns, &x0, &x1, &y0, &y1);
    fputs("<figure><figcaption>", f);
    html_text(f, title);
    fputs("</figcaption>\n", f);
    if (!isfinite(x0)) {
        fputs("<p class=\"none\">no values</p></figure>\n", f);
        return;
    }
    const struct axis xa = step_axis(x0, x1), ya = value_axis(y0, y1);
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n",
            W, H, W, H);
    draw_axes(f, &xa, &ya, ytitle);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" class=\"frame\"/>\n", ML, MT, PW, PH);
    for (int k = 0; k < ns; k++) {
        draw_series(f, &s[k], &xa, &ya);
        fprintf(f, "<text x=\"%.0f\" y=\"16\" fill=\"%s\" class=\"legend\">",
                ML + 10 + fmin(150, (double)PW / ns) * k, s[k].color);
        html_text(f, s[k].name);
        fputs("</text>\n", f);
    }
    fputs("</svg></figure>\n", f);
}

/* ---- a mixture of experts ------------------------------------------------------ */

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
    svg_plot(f, "balancing loss (1 when balanced) and z-loss (unweighted, layers' mean)", "loss", lb, 2);
    const struct series tpe[3] = {{"least-loaded expert", "#2ca02c", r->ex, r->ey[0], r->ne},
                                  {"most-loaded expert", "#d62728", r->ex, r->ey[1], r->ne},
                                  {"coefficient of variation", "#9467bd", r->ex, r->ey[2], r->ne}};
    svg_plot(f, "tokens per expert, relative to their layer's mean", "tokens / layer's mean", tpe, 3);
    int dropped = 0;
    for (int i = 0; i < r->ne; i++) dropped |= r->ey[3][i] > 0;
    if (dropped) {
        const struct series d = {"dropped share", "#8c564b", r->ex, r->ey[3], r->ne};
        svg_plot(f, "choices a capacity dropped (share)", "share of choices", &d, 1);
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

/* ---- the trace: one step per rank ---------------------------------------------- */

static const char *slice_color(const char *cat, const char *name)
{
    if (!strcmp(cat, "wait")) return "#d62728";
    if (!strncmp(name, "forward", 7)) return "#1f77b4";
    if (!strncmp(name, "backward", 8)) return "#ff7f0e";
    if (!strcmp(name, "optimizer step")) return "#2ca02c";
    return "#7f7f7f";
}

static int is_step(const cJSON *e)
{
    const cJSON *cat = cJSON_GetObjectItemCaseSensitive(e, "cat");
    return cJSON_IsString(cat) && !strcmp(cat->valuestring, "step");
}

/* The last step traced (-1: none) and the ranks (pids) seen. */
static int last_traced_step(const cJSON *ev, int *ranks)
{
    int last = -1;
    const cJSON *e;
    *ranks = 0;
    cJSON_ArrayForEach(e, ev)
    {
        *ranks = (int)fmax(*ranks, num(e, "pid") + 1);
        if (is_step(e)) last = (int)fmax(last, num(cJSON_GetObjectItemCaseSensitive(e, "args"), "step"));
    }
    return last;
}

/* A rank's step event: its start and duration (us); the duration NaN when the rank has none. */
static void step_span(const cJSON *ev, int rank, int step, double *t0, double *dur)
{
    const cJSON *e;
    *t0 = *dur = NAN;
    cJSON_ArrayForEach(e, ev)
    {
        if ((int)num(e, "pid") == rank && is_step(e) &&
            (int)num(cJSON_GetObjectItemCaseSensitive(e, "args"), "step") == step)
            *t0 = num(e, "ts"), *dur = num(e, "dur");
    }
}

#define TX 80 /* where the strip's time starts */
#define ROWH 18
#define ROWGAP 10

/* The strip's time scale from the steps' start over span us, in ms (s
 * from a second up): a grid line from the top at each tick, and the axis
 * at y with its labels and title. */
static void time_axis(FILE *f, double span, int y)
{
    const int secs = span >= 1e6;
    const struct axis a = nice_axis(0, span / (secs ? 1e6 : 1e3), 0, 0);
    char label[32];
    for (long long i = tick_first(&a); i <= tick_last(&a); i++) {
        const double v = (double)i * a.step, x = TX + W * v / a.hi;
        tick_label(label, sizeof label, v, &a);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"0\" x2=\"%.1f\" y2=\"%d\" class=\"grid\"/>"
                "<text x=\"%.1f\" y=\"%d\" class=\"xtick\">%s</text>\n",
                x, x, y + 4, x, y + 16, label);
    }
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" class=\"frame\"/>\n", TX, y, TX + W, y);
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"xtitle\">time from the step's start (%s)</text>\n",
            TX + W / 2, y + 32, secs ? "s" : "ms");
}

/* A rank's slices of the step that began at t0 (us), span us to the
 * strip's width: compute at y, waits on communication below it. */
static void rank_slices(FILE *f, const cJSON *ev, int rank, double t0, double dur, double span, int y)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, ev)
    {
        const cJSON *cat = cJSON_GetObjectItemCaseSensitive(e, "cat"),
                    *name = cJSON_GetObjectItemCaseSensitive(e, "name"),
                    *ph = cJSON_GetObjectItemCaseSensitive(e, "ph");
        if ((int)num(e, "pid") != rank || !cJSON_IsString(cat) || !cJSON_IsString(name) ||
            !cJSON_IsString(ph) || strcmp(ph->valuestring, "X") || is_step(e))
            continue;
        const double ts = num(e, "ts"), d = num(e, "dur");
        if (!(ts >= t0 && ts + d <= t0 + dur + 1)) continue;
        const int wait = !strcmp(cat->valuestring, "wait");
        fprintf(f, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\"><title>",
                TX + W * (ts - t0) / span, y + (wait ? ROWH : 0), fmax(W * d / span, 0.3), ROWH - 2,
                slice_color(cat->valuestring, name->valuestring));
        html_text(f, name->valuestring);
        fprintf(f, " %.3f ms</title></rect>\n", d / 1e3);
    }
}

/* The last traced step of every rank as rows of slices (compute, then
 * waits) from the step's start, on one time scale: the longest rank's step
 * spans the strip. */
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
    int ranks;
    const int step = last_traced_step(ev, &ranks);
    if (step < 0 || ranks < 1 || ranks > 4096) {
        fputs("<p class=\"none\">no traced step</p>\n", f);
        cJSON_Delete(doc);
        return;
    }
    fprintf(f,
            "<h2>Step %d, as traced</h2>\n<p>Per rank: compute (forward blue, backward orange, optimizer "
            "green, data grey) and, below it, waits on communication (red), each rank from its step's "
            "start. Hover a slice for its name.</p>\n",
            step);
    double span = 0, t0, dur;
    for (int r = 0; r < ranks; r++) step_span(ev, r, step, &t0, &dur), span = fmax(span, dur);
    const int axis_y = ranks * (2 * ROWH + ROWGAP) + 4;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"trace\" width=\"%d\" height=\"%d\">\n",
            TX + W + 40, axis_y + 40);
    if (span > 0) time_axis(f, span, axis_y);
    for (int r = 0; r < ranks; r++) {
        const int y = 5 + r * (2 * ROWH + ROWGAP);
        fprintf(f, "<text x=\"0\" y=\"%d\" class=\"legend\">rank %d</text>\n", y + ROWH - 4, r);
        step_span(ev, r, step, &t0, &dur);
        if (dur > 0) rank_slices(f, ev, r, t0, dur, span, y);
    }
    fputs("</svg>\n", f);
    cJSON_Delete(doc);
}

/* ---- the page ------------------------------------------------------------------- */

/* Series s's median over the last run's steps (those after its
 * configuration row), as the trainer's closing summary takes it. */
static double last_run_median(const struct run *r, int s)
{
    return loom_report_median(r->y[s] + r->first[s], r->n[s] - r->first[s]);
}

/* The run at a glance: steps, the last losses, the medians of the last
 * run's speed and its layout. */
static void summary_table(FILE *f, const struct run *r)
{
    const cJSON *layout = cJSON_GetObjectItemCaseSensitive(r->last_step, "layout");
    const int n = r->n[S_LOSS], last = r->n[S_TPS] - r->first[S_TPS];
    fprintf(f,
            "<table><tr><th>steps logged</th><th>last step</th><th>final loss</th><th>final val loss</th>"
            "<th>median tokens/s</th><th>median MFU</th><th>median ms/step</th><th>layout</th></tr>\n"
            "<tr><td>%d</td><td>%.0f</td><td>%.4f</td><td>%.4f</td><td class=\"median-tps\">%.0f</td>"
            "<td class=\"median-mfu\">%.1f%%</td><td>%.1f</td><td class=\"l\">",
            n, n ? r->x[S_LOSS][n - 1] : NAN, n ? r->y[S_LOSS][n - 1] : NAN,
            r->n[S_VAL] ? r->y[S_VAL][r->n[S_VAL] - 1] : NAN, last_run_median(r, S_TPS),
            100 * last_run_median(r, S_MFU), last_run_median(r, S_MS));
    html_text(f, cJSON_IsString(layout) ? layout->valuestring : "one process");
    fprintf(f,
            "</td></tr></table>\n<p>Medians over the last run's logged steps (%d), as its closing summary "
            "takes them: every step from the first, the upper middle one of an even count.",
            last);
    const cJSON *every = r->config ? cJSON_GetObjectItemCaseSensitive(r->config, "log-interval") : NULL;
    if (cJSON_IsString(every) && strcmp(every->valuestring, "1")) {
        fputs(" The summary counts every step, this page only those logged (--log-interval ", f);
        html_text(f, every->valuestring);
        fputs(").", f);
    }
    fputs("</p>\n", f);
}

static void training_section(FILE *f, const struct run *r)
{
    fputs("<h2>Training</h2>\n", f);
    const struct series loss[2] = {{"train loss", "#1f77b4", r->x[S_LOSS], r->y[S_LOSS], r->n[S_LOSS]},
                                   {"validation loss", "#d62728", r->x[S_VAL], r->y[S_VAL], r->n[S_VAL]}};
    svg_plot(f, "loss", "loss (nats/token)", loss, r->n[S_VAL] ? 2 : 1);
    const struct series lr = {"learning rate", "#2ca02c", r->x[S_LR], r->y[S_LR], r->n[S_LR]};
    svg_plot(f, "learning rate", "learning rate", &lr, 1);
    const struct series norm = {"gradient norm (before clipping)", "#9467bd", r->x[S_NORM], r->y[S_NORM],
                                r->n[S_NORM]};
    svg_plot(f, "gradient norm", "gradient norm", &norm, 1);
    if (r->n[S_SCALE]) {
        const struct series sc = {"loss scale", "#8c564b", r->x[S_SCALE], r->y[S_SCALE], r->n[S_SCALE]};
        svg_plot(f, "fp16 loss scale", "loss scale", &sc, 1);
    }
}

static void speed_section(FILE *f, const struct run *r)
{
    fputs("<h2>Speed</h2>\n", f);
    const struct series tps = {"tokens/s", "#1f77b4", r->x[S_TPS], r->y[S_TPS], r->n[S_TPS]};
    svg_plot(f, "tokens/s", "tokens/s", &tps, 1);
    double *mfu = loom_alloc(sizeof(double) * (size_t)(r->n[S_MFU] ? r->n[S_MFU] : 1), LOOM_MEM_OTHER);
    for (int i = 0; i < r->n[S_MFU]; i++) mfu[i] = 100 * r->y[S_MFU][i];
    const struct series m = {"MFU %", "#ff7f0e", r->x[S_MFU], mfu, r->n[S_MFU]};
    svg_plot(f, "model FLOPs utilisation (%)", "MFU (%)", &m, 1);
    loom_free(mfu);
}

/* Rank 0's peak memory by category over the steps, in KiB, MiB or GiB by
 * its largest total. */
static void memory_plot(FILE *f, const struct run *r)
{
    static const char *const colors[NMEM] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                             "#9467bd", "#8c564b", "#333333"};
    double top = 0;
    for (int i = 0; i < r->nm; i++) top = fmax(top, r->my[NMEM - 1][i]);
    const int unit = top >= 1024 ? 2 : top >= 1 ? 1 : 0; /* KiB, MiB, GiB */
    static const char *const titles[3] = {"peak memory (KiB)", "peak memory (MiB)", "peak memory (GiB)"};
    const double scale = unit == 2 ? 1.0 / 1024 : unit == 1 ? 1 : 1024;
    double *v = loom_alloc(sizeof(double) * NMEM * (size_t)(r->nm ? r->nm : 1), LOOM_MEM_OTHER);
    struct series mem[NMEM];
    for (int k = 0; k < NMEM; k++) {
        double *vk = v + (size_t)k * (size_t)r->nm;
        for (int i = 0; i < r->nm; i++) vk[i] = r->my[k][i] * scale;
        mem[k] = (struct series){mem_keys[k], colors[k], r->mx, vk, r->nm};
    }
    svg_plot(f, "rank 0's peak memory by category per step", titles[unit], mem, NMEM);
    loom_free(v);
}

static void memory_section(FILE *f, const struct run *r)
{
    fputs("<h2>Memory</h2>\n", f);
    memory_plot(f, r);
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
}

static void config_section(FILE *f, const struct run *r)
{
    fputs("<h2>Configuration</h2>\n", f);
    if (!r->config) {
        fputs("<p class=\"none\">not in this metrics file (written by an older loom)</p>\n", f);
        return;
    }
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

static void write_page(FILE *f, const struct run *r, const char *metrics, const char *trace)
{
    fputs(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>loom report</title>\n"
        "<style>body{font:14px "
        "sans-serif;margin:24px;max-width:1400px}figure{display:inline-block;margin:8px}"
        "figcaption{font-weight:bold}.frame{fill:none;stroke:#999}.grid{stroke:#eee}.line{fill:none;"
        "stroke-width:1.5}.ytick{text-anchor:end;font-size:11px}.xtick{text-anchor:middle;font-size:11px}"
        ".xtitle,.ytitle{text-anchor:middle;font-size:12px;fill:#444}"
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
    summary_table(f, r);
    training_section(f, r);
    moe_section(f, r);
    speed_section(f, r);
    memory_section(f, r);
    if (trace) trace_section(f, trace);
    config_section(f, r);
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
