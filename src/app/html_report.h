/*
 * `loom report`: one self-contained HTML page about a training run, from
 * its --metrics file (and its --trace file when there is one): loss and
 * validation curves, learning rate, tokens/s and MFU, memory by category
 * (rank 0 over the steps, every rank at the last), the layout and the
 * configuration (the metrics' first row), and one traced step's timeline
 * per rank. Plots are SVG written here: the page has no script and loads
 * nothing, so it opens offline. Not here: comparing runs, live updates.
 */
#ifndef LOOM_APP_HTML_REPORT_H
#define LOOM_APP_HTML_REPORT_H

/* loom report PATH [-o FILE] (argv after "report"): PATH is a metrics file
 * or a folder holding metrics.jsonl (and trace.json); FILE defaults to
 * report.html beside the metrics. LOOM_ERR_INPUT naming what is wrong. */
int loom_report_html(int argc, char **argv);

#endif
