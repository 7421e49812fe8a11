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
"""
import os
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
        mem = figs.get("rank 0's peak memory by category per step (MiB)", [])
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
