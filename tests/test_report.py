#!/usr/bin/env python3
"""`loom report`: one self-contained HTML page of a run, opened in headless
Chromium (Debian's `chromium`).

1. A 2-rank run with evaluations, --metrics DIR/metrics.jsonl and --trace
   DIR/trace.json; `loom report DIR` writes DIR/report.html: no script and
   nothing loaded from anywhere (no src or href; the SVG namespace is a name,
   not a load).
2. Chromium renders it: with console logging on, no console error; its DOM
   has the plots drawn: the loss line with one point per logged step and the
   validation line one per evaluation, the learning rate, tokens/s, MFU and
   memory lines, a memory row per rank, the traced step's slices for both
   ranks, and the configuration (the metrics' first row); the screenshot is
   not blank (many distinct pixel bytes).
3. A mixture of experts' run (EP 2 on 2 ranks, a capacity,
   --moe-per-layer-logging): a load-balance section with the balancing
   loss and z-loss, tokens per expert (least, most, cv) and the dropped
   share over the steps, and a row per MoE layer; a dense run's page has
   none.
4. `-o FILE` writes there; a metrics file named directly works too.
5. Bad input: a missing path, a file that is not metrics (naming its line),
   metrics without a training step, -o without FILE or into a missing
   folder, an unknown flag and two runs are each exit 2 with one line.
6. The page reads as a plotting library's, from the text Chromium's DOM
   holds, on the 2-rank run's page, the mixture of experts' and a page of
   made-up metrics at a large scale (millions of tokens/s, a learning rate
   of 1e-5, GiB of memory, a traced step of seconds): every axis's tick
   labels are 3 to 7 multiples of a step of 1, 2 or 5 times a power of ten,
   each with no more digits than the step needs; every plot has its axes
   titled; no axis of these series (none can be negative) has a tick below
   zero; the trace strip has a time scale in ms or s that spans the longest
   rank's step.
7. The page's median tokens/s and MFU are the trainer's closing summary's
   for the 2-rank run (12 steps: an even count), for a run appended to its
   metrics (the last run's steps alone), and for the made-up metrics the
   upper middle value of the last run's rows.
"""
import json
import math
import os
import random
import re
import shutil
import struct
import sys
import tempfile
import zlib

import lib
from lib import LOOM, check


def chromium():
    for name in ("chromium", "chromium-browser", "chromium-headless-shell"):
        path = shutil.which(name)
        if path:
            return path
    return None


def png_distinct_bytes(path):
    """Distinct byte values of the PNG's decompressed image data."""
    data = open(path, "rb").read()
    at, idat = 8, b""
    while at < len(data):
        (n,) = struct.unpack(">I", data[at:at + 4])
        kind = data[at + 4:at + 8]
        if kind == b"IDAT":
            idat += data[at + 8:at + 8 + n]
        at += 12 + n
    return len(set(zlib.decompress(idat))) if idat else 0


def points(poly):
    return len(re.findall(r"[-\d.]+,[-\d.]+", poly))


# ---- the page's own text: axes and medians ------------------------------------

# every plot's series cannot be negative (a new plot must be added here)
NONNEG = {"loss", "learning rate", "gradient norm", "fp16 loss scale", "tokens/s", "model FLOPs utilisation (%)",
          "rank 0's peak memory by category per step",
          "balancing loss (1 when balanced) and z-loss (unweighted, layers' mean)",
          "tokens per expert, relative to their layer's mean", "choices a capacity dropped (share)"}
SI = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
LABEL = re.compile(r"^(-?\d+)(?:\.(\d+))?(?:([kMGTP])|e(-?\d+))?$")


def texts(svg, cls):
    return re.findall(r'<text[^>]*class="%s"[^>]*>([^<]*)</text>' % cls, svg)


def plots(dom):
    """{caption: {"x": [x tick labels], "y": [y tick labels], "xtitle": [..], "ytitle": [..]}}, the
    figures with a plot."""
    out = {}
    for fig in re.findall(r"<figure>(.*?)</figure>", dom, re.S):
        cap = re.search(r"<figcaption>(.*?)</figcaption>", fig).group(1).replace("&#39;", "'")
        if "<svg" in fig:
            out[cap] = {k: texts(fig, c) for k, c in (("x", "xtick"), ("y", "ytick"), ("xtitle", "xtitle"),
                                                      ("ytitle", "ytitle"))}
    return out


def trace_strip(dom):
    m = re.search(r'<svg[^>]*class="trace".*?</svg>', dom, re.S)
    return {"x": texts(m.group(0), "xtick"), "xtitle": texts(m.group(0), "xtitle")} if m else None


def label_value(label):
    """(value, the unit its digits count in, its decimals) of a label that LABEL matches."""
    m = LABEL.match(label)
    unit = 10.0 ** int(m.group(4)) if m.group(4) else SI[m.group(3) or ""]
    return float(m.group(1) + "." + (m.group(2) or "0")) * unit, unit, len(m.group(2) or "")


def axis_problem(labels):
    """Why the tick labels (in order) are not a plotting library's, or None:
    3 to 7 of them, all numbers of one style (e-notation or not), at a step
    of 1, 2 or 5 times a power of ten, each a multiple of it with no more
    decimals than the step needs in the label's unit."""
    if not 3 <= len(labels) <= 7:
        return f"{len(labels)} ticks {labels}"
    if not all(LABEL.match(lab) for lab in labels):
        return f"not a number: {[lab for lab in labels if not LABEL.match(lab)]}"
    if len({"e" in lab for lab in labels if lab != "0"}) > 1:
        return f"two styles {labels}"
    parsed = [label_value(lab) for lab in labels]
    values = [v for v, _, _ in parsed]
    step = values[1] - values[0]
    if step <= 0 or any(abs((b - a) - step) > 1e-6 * step for a, b in zip(values, values[1:])):
        return f"uneven {labels}"
    mant = step / 10 ** math.floor(math.log10(step) + 1e-9)
    if min(abs(mant - m) for m in (1, 2, 5)) > 1e-6:
        return f"step {step:g} is not 1, 2 or 5 times a power of ten {labels}"
    if any(abs(v / step - round(v / step)) > 1e-6 for v in values):
        return f"not multiples of {step:g} {labels}"
    extra = [lab for lab, (_, unit, d) in zip(labels, parsed) if d > max(0, math.ceil(-math.log10(step / unit) - 1e-9))]
    return f"more digits than the step {step:g} needs: {extra}" if extra else None


def axes_checks(tag, dom, trace_ms=None):
    """The checks of 6 on one page's DOM; trace_ms: the longest rank's traced step (None: no trace)."""
    figs = plots(dom)
    bad = [(cap, k, axis_problem(f[k])) for cap, f in figs.items() for k in ("x", "y") if axis_problem(f[k])]
    check(f"{tag}: every tick label of {len(figs)} plots is a nice number (1, 2 or 5 x 10^k steps, 3-7 ticks, "
          "no excess digits)", figs and not bad, str(bad[:3]))
    untitled = [cap for cap, f in figs.items() if f["xtitle"] != ["step"] or len(f["ytitle"]) != 1
                or not f["ytitle"][0].strip()]
    check(f"{tag}: every plot has its axes titled (step, and the series' name and unit)", figs and not untitled,
          str(untitled[:3]))
    unknown = sorted(set(figs) - NONNEG)
    below = [(cap, f["y"]) for cap, f in figs.items() if any(v.startswith("-") for v in f["y"])]
    check(f"{tag}: no axis of a non-negative series has a tick below zero", figs and not below and not unknown,
          f"{below[:2]} not known to be non-negative: {unknown}")
    if trace_ms is None:
        return
    strip = trace_strip(dom) or {"x": [], "xtitle": []}
    unit = re.search(r"\((ms|s)\)$", strip["xtitle"][0]) if len(strip["xtitle"]) == 1 else None
    problem = axis_problem(strip["x"])
    ticks = [] if problem else [v for v, _, _ in map(label_value, strip["x"])]
    span = trace_ms / (1000 if unit and unit.group(1) == "s" else 1)
    covers = ticks and ticks[0] == 0 and ticks[-1] <= span * (1 + 1e-6) < 2 * ticks[-1] - ticks[-2]
    check(f"the trace strip of {tag} has a time scale with its unit over the longest step ({trace_ms:.4g} ms)",
          unit and covers, f"{strip['xtitle']} {problem or strip['x']}")


def longest_step_ms(trace):
    """The last traced step's longest duration over the ranks, ms."""
    events = json.load(open(trace))["traceEvents"]
    steps = [e for e in events if e.get("cat") == "step"]
    last = max(e["args"]["step"] for e in steps)
    return max(e["dur"] for e in steps if e["args"]["step"] == last) / 1e3


def page_medians(dom):
    tps = re.search(r'class="median-tps">([^<]*)<', dom)
    mfu = re.search(r'class="median-mfu">([^<]*)%<', dom)
    return (tps.group(1) if tps else None, mfu.group(1) if mfu else None)


def summary_medians(stdout):
    m = re.search(r"^  median (\d+) tokens/s \| mfu ([\d.]+)%", stdout, re.M)
    return (m.group(1), m.group(2)) if m else None


def made_up_run(tmp):
    """tmp/big: metrics of two runs (the second of 20 steps at about 1.2M
    tokens/s, a learning rate up to 1e-5, tens of GiB of memory, a constant
    loss scale) and a traced step of 1.5 s and 1.62 s on two ranks. Returns
    the folder and the medians of the last run's rows ("%.0f" tokens/s,
    "%.1f" MFU in %): the upper middle ones."""
    big = os.path.join(tmp, "big")
    os.mkdir(big)
    rnd = random.Random(7)
    rows, last = [{"config": {"log-interval": "1"}}], []
    rows += [{"step": i, "loss": 11.0 - 0.1 * i, "tokens_per_s": 4e5 + 1e3 * i, "mfu": 0.1} for i in range(1, 11)]
    rows.append({"config": {"log-interval": "1"}})
    for i in range(11, 31):
        tps = 1.2e6 + rnd.uniform(-5e4, 5e4)
        act = 2e10 + 1e8 * i
        mem = {"params": 7e9, "grads": 7e9, "optimizer": 2.8e10, "activations": act, "comm": 1e8, "other": 5e7}
        mem["total"] = sum(mem.values())
        rows.append({"step": i, "loss": 2.9 + 8 * math.exp(-(i - 10) / 4), "lr": 1e-5 * min(1, (i - 10) / 5),
                     "grad_norm": 0.3 + 4 / (i - 9), "tokens_per_s": tps, "mfu": tps * 3.1e-7,
                     "ms_per_step": 8192 / tps * 1e3, "loss_scale": 65536, "mem": mem})
        last.append(rows[-1])
        if i % 10 == 0:
            rows.append({"step": i, "val_loss": rows[-1]["loss"] + 0.05})
    with open(os.path.join(big, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    events = []
    for rank, dur in ((0, 1.5e6), (1, 1.62e6)):
        events.append({"name": "step 30", "cat": "step", "ph": "X", "ts": 10.0, "dur": dur, "pid": rank, "tid": 0,
                       "args": {"step": 30}})
        events += [{"name": name, "cat": "compute", "ph": "X", "ts": 10.0 + t0 * dur, "dur": d * dur, "pid": rank,
                    "tid": 0} for name, t0, d in (("forward", 0, 0.4), ("backward", 0.4, 0.5),
                                                   ("optimizer step", 0.9, 0.1))]
    with open(os.path.join(big, "trace.json"), "w") as f:
        json.dump({"traceEvents": events}, f)
    tps = sorted(r["tokens_per_s"] for r in last)[len(last) // 2]
    mfu = sorted(r["mfu"] for r in last)[len(last) // 2]
    return big, (f"{tps:.0f}", f"{100 * mfu:.1f}")


def main():
    browser = chromium()
    if not browser:
        print("FAIL: no chromium (scripts/install-deps.sh --test installs it)")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        run = os.path.join(tmp, "run")
        os.mkdir(run)
        p = lib.run_ranks(2, [LOOM, "train", "--data-path", os.path.join(tmp, "train.bin"), "--valid-data-path",
                              os.path.join(tmp, "corpus", "val.bin")] + lib.TINY_MODEL + [
            "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "12", "--eval-interval", "4",
            "--eval-iters", "2", "--threads", "1", "--log-interval", "1", "--metrics",
            os.path.join(run, "metrics.jsonl"), "--trace", os.path.join(run, "trace.json")], tag="run")
        check("a 2-rank run with --metrics and --trace", p.returncode == 0, p.stderr[-300:])
        summary = summary_medians(p.stdout)
        p = lib.run([LOOM, "report", run])
        page = os.path.join(run, "report.html")
        check("loom report DIR: exit 0, DIR/report.html", p.returncode == 0 and os.path.exists(page), p.stderr)
        html = open(page).read() if os.path.exists(page) else ""
        loads = re.findall(r"\b(?:src|href)\s*=", html, re.I) + re.findall(r"<script|@import|url\(", html, re.I)
        check("self-contained: no script, nothing loaded", html and not loads, str(loads[:3]))

        shot = os.path.join(tmp, "shot.png")
        env = dict(os.environ, HOME=tmp)
        common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
                  "--window-size=1400,2600"]
        d = lib.run(common + ["--dump-dom", "file://" + page], timeout=120, env=env)
        s = lib.run(common + [f"--screenshot={shot}", "file://" + page], timeout=120, env=env)
        console = [l for l in (d.stderr + s.stderr).splitlines() if "CONSOLE" in l or "Uncaught" in l]
        check("Chromium renders it: exit 0, no console message", d.returncode == 0 and s.returncode == 0
              and not console, (console or [d.stderr[-300:]])[:3])
        dom = d.stdout
        figs = {}
        for fig in re.findall(r"<figure>(.*?)</figure>", dom, re.S):
            cap = re.search(r"<figcaption>(.*?)</figcaption>", fig).group(1)
            figs[cap] = [points(pl) for pl in re.findall(r'<polyline[^>]*points="([^"]*)"', fig)]
        rows = lib.metrics_rows(os.path.join(run, "metrics.jsonl"))
        evals = sum(1 for l in open(os.path.join(run, "metrics.jsonl")) if '"val_loss"' in l)
        check(f"loss: a line of {len(rows)} steps and a validation line of {evals} evaluations",
              figs.get("loss") == [len(rows), evals], str(figs.get("loss")))
        for cap in ("learning rate", "tokens/s", "model FLOPs utilisation (%)", "gradient norm"):
            check(f"'{cap}': one line of {len(rows)} points", figs.get(cap) == [len(rows)], str(figs.get(cap)))
        mem = figs.get("rank 0's peak memory by category per step", [])
        check("memory: a line per category (7)", len(mem) == 7 and set(mem) == {len(rows)}, str(mem))
        memtable = re.search(r'<table class="mem">(.*?)</table>', dom, re.S)
        table_rows = re.findall(r"<tr><td>(\d+)</td><td>[\d.]+</td>", memtable.group(1) if memtable else "")
        check("a memory row per rank", table_rows == ["0", "1"], str(table_rows))
        slices = re.findall(r'<rect x="[\d.]+" y="(\d+)" width="[\d.]+" height="\d+" fill="#[0-9a-f]+"><title>', dom)
        check(f"the traced step's slices drawn for both ranks ({len(slices)})", len({int(y) // 46 for y in slices}) == 2,
              str(slices[:4]))
        check("the configuration table (the metrics' first row)", "--micro-batch-size" in dom and
              "--pipeline-model-parallel-size" in dom)
        distinct = png_distinct_bytes(shot) if os.path.exists(shot) else 0
        check(f"the screenshot is not blank ({distinct} distinct pixel bytes)", distinct >= 50)

        check("a dense model's page has no load-balance section", "Load balance" not in dom)
        axes_checks("the 2-rank run's page", dom, longest_step_ms(os.path.join(run, "trace.json")))
        check(f"the page's median tokens/s and MFU are the trainer's summary's (12 steps) {summary}",
              summary and page_medians(dom) == summary, f"page {page_medians(dom)}")

        # a mixture of experts: its load balance (--moe-per-layer-logging: each layer's values too)
        moe = os.path.join(tmp, "moe")
        os.mkdir(moe)
        p = lib.run_ranks(2, [LOOM, "train", "--data-path", os.path.join(tmp, "train.bin"), "--model", "mixtral-tiny",
                              "--num-layers", "3", "--hidden-size", "64", "--num-attention-heads", "4",
                              "--num-query-groups", "2", "--ffn-hidden-size", "64", "--num-experts", "4",
                              "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "2",
                              "--global-batch-size", "4", "--train-iters", "6", "--eval-iters", "0", "--threads", "1",
                              "--log-interval", "1", "--expert-model-parallel-size", "2", "--moe-per-layer-logging",
                              "--moe-expert-capacity-factor", "1", "--metrics", os.path.join(moe, "metrics.jsonl")],
                          tag="moe")
        q = lib.run([LOOM, "report", moe])
        d = lib.run(common + ["--dump-dom", "file://" + os.path.join(moe, "report.html")], timeout=120, env=env)
        figs = {}
        for fig in re.findall(r"<figure>(.*?)</figure>", d.stdout, re.S):
            cap = re.search(r"<figcaption>(.*?)</figcaption>", fig).group(1)
            figs[cap] = [points(pl) for pl in re.findall(r'<polyline[^>]*points="([^"]*)"', fig)]
        bal = figs.get("balancing loss (1 when balanced) and z-loss (unweighted, layers' mean)")
        tpe = figs.get("tokens per expert, relative to their layer's mean")
        drop = figs.get("choices a capacity dropped (share)")
        layer_rows = re.findall(r"<tr><td>(\d+)</td><td>[\d.]+</td><td>[\d.]+</td><td>[\d.]+</td></tr>", d.stdout)
        check("a mixture of experts' page (EP 2, a capacity): the balancing losses (2 lines of 6 steps), tokens per "
              "expert (min, max, cv: 3 lines), the dropped share, and a row per MoE layer (3)",
              p.returncode == 0 and q.returncode == 0 and bal == [6, 6] and tpe == [6, 6, 6] and drop == [6]
              and layer_rows == ["0", "1", "2"], f"{bal} {tpe} {drop} {layer_rows} {q.stderr[-200:]}")
        axes_checks("the mixture of experts' page", d.stdout)

        # a run appended to the metrics: the medians are the last run's, as its summary says
        again = os.path.join(tmp, "again")
        os.mkdir(again)
        shutil.copy(os.path.join(run, "metrics.jsonl"), again)
        p = lib.run([LOOM, "train", "--data-path", os.path.join(tmp, "train.bin")] + lib.TINY_MODEL + [
            "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "7", "--eval-iters", "0",
            "--threads", "1", "--log-interval", "1", "--metrics", os.path.join(again, "metrics.jsonl")])
        q = lib.run([LOOM, "report", again])
        d = lib.run(common + ["--dump-dom", "file://" + os.path.join(again, "report.html")], timeout=120, env=env)
        summary = summary_medians(p.stdout)
        check(f"a run appended to the metrics: the page's medians are its summary's (7 steps) {summary}",
              p.returncode == 0 and q.returncode == 0 and summary and page_medians(d.stdout) == summary,
              f"page {page_medians(d.stdout)} {p.stderr[-200:]}{q.stderr[-200:]}")

        # made-up metrics at a large scale: millions of tokens/s, GiB, a step of seconds
        big, medians = made_up_run(tmp)
        q = lib.run([LOOM, "report", big])
        d = lib.run(common + ["--dump-dom", "file://" + os.path.join(big, "report.html")], timeout=120, env=env)
        check("loom report on made-up metrics: exit 0", q.returncode == 0, q.stderr[-300:])
        axes_checks("the made-up run's page", d.stdout, longest_step_ms(os.path.join(big, "trace.json")))
        check(f"the made-up run's page: the medians of its last run's 20 rows, the upper middle ones {medians}",
              page_medians(d.stdout) == medians, f"page {page_medians(d.stdout)}")

        other = os.path.join(tmp, "other.html")
        p = lib.run([LOOM, "report", os.path.join(run, "metrics.jsonl"), "-o", other])
        check("loom report METRICS -o FILE writes FILE", p.returncode == 0 and os.path.exists(other), p.stderr)

        bad = os.path.join(tmp, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"step": 1, "loss": 2.0}\nnot json\n')
        stepless = os.path.join(tmp, "stepless.jsonl")
        with open(stepless, "w") as f:
            f.write('{"config": {"lr": "0.001"}}\n{"step": 0, "val_loss": 3.0}\n')
        for args, what in (([os.path.join(tmp, "missing")], "missing"), ([bad], "bad.jsonl:2"),
                           ([stepless], "no training step"), ([run, "-o"], "-o needs FILE"),
                           ([run, "-o", os.path.join(tmp, "no", "such", "r.html")], "cannot write"),
                           ([run, "--colour"], "--colour"), ([run, run], "one run at a time")):
            p = lib.run([LOOM, "report", *args])
            lines = lib.error_lines(p.stderr)
            check(f"loom report {' '.join(os.path.basename(a) for a in args)}: exit 2, one line naming {what}",
                  p.returncode == 2 and len(lines) == 1 and what in lines[0], p.stderr[-300:])
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
