#!/usr/bin/env python3
"""loom as a library: `make install PREFIX=DIR` and a program of the user's
built outside the tree with pkg-config.

- `make install PREFIX=tmp` puts bin/loom, lib/libloom.a, include/loom/*.h
  and lib/pkgconfig/loom.pc there; the installed loom runs.
- examples/family_loop/family_loop.c, copied out of the tree, builds with
  `cc prog.c $(pkg-config --cflags --libs loom)` and nothing else: a built-in
  family (loom/families.h) trained in the program's own loop on its own data.
- It trains on 2 ranks with ZeRO-2 with each step's loss within 1e-5 of one
  process (float32 sums in another order), and writes what --metrics,
  --trace and --tensorboard-dir ask for: a metrics row a step with its loss
  (the printed one) and memory, a trace of both ranks' steps, a TensorBoard
  event file, and `loom report` makes a page of the metrics.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import lib
from lib import ENV, check

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def losses(out):
    return [float(l.split()[3]) for l in out.splitlines() if l.startswith("step ")]


def main():
    if not lib.built(lib.LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "prefix")
        p = lib.run(["make", "-C", ROOT, "--no-print-directory", f"BUILD={os.path.abspath(lib.BUILD)}", "install",
                     f"PREFIX={prefix}"], timeout=900)
        want = ["bin/loom", "lib/libloom.a", "include/loom/engine.h", "include/loom/families.h",
                "lib/pkgconfig/loom.pc"]
        missing = [w for w in want if not os.path.exists(os.path.join(prefix, w))]
        v = lib.run([os.path.join(prefix, "bin", "loom"), "--version"]) if not missing else None
        if not check(f"make install PREFIX=DIR: {', '.join(want)}; the installed loom runs",
                     p.returncode == 0 and not missing and v.returncode == 0, (p.stderr or str(missing))[-400:]):
            return lib.verdict()
        src = os.path.join(tmp, "prog.c")
        shutil.copy(os.path.join(ROOT, "examples", "family_loop", "family_loop.c"), src)
        env = dict(ENV, PKG_CONFIG_PATH=os.path.join(prefix, "lib", "pkgconfig"))
        flags = lib.run(["pkg-config", "--cflags", "--libs", "loom"], env=env)
        prog = os.path.join(tmp, "prog")
        b = lib.run(["cc", "-O2", src, "-o", prog, *flags.stdout.split()], env=env, cwd=tmp, timeout=300)
        if not check("a program outside the tree builds with cc prog.c $(pkg-config --cflags --libs loom)",
                     flags.returncode == 0 and b.returncode == 0, (flags.stderr + b.stderr)[-600:]):
            return lib.verdict()
        args = ["--train-iters", "4", "--global-batch-size", "4", "--micro-batch-size", "2", "--threads", "1"]
        one = lib.run_ranks(1, [prog, *args], tag="one process")
        metrics, trace, tb = (os.path.join(tmp, n) for n in ("run.jsonl", "trace.json", "tb"))
        two = lib.run_ranks(2, [prog, *args, "--zero-stage", "2", "--metrics", metrics, "--trace", trace,
                                "--tensorboard-dir", tb], tag="2 ranks")
        a, b2 = losses(one.stdout), losses(two.stdout)
        worst = max((abs(x - y) / abs(x) for x, y in zip(a, b2)), default=1)
        check(f"on 2 ranks with ZeRO-2: every step's loss within 1e-5 of one process (worst {worst:.1e})",
              len(a) == 4 and len(b2) >= 4 and worst <= 1e-5, two.stderr[-300:])
        rows = lib.metrics_rows(metrics)
        check(f"--metrics: a row a step ({len(rows)}) with the printed loss and memory by category",
              len(rows) == 4 and all(abs(r["loss"] - x) <= 1e-6 * abs(x) for r, x in zip(rows, b2))
              and all(r["mem"]["total"] > 0 and "optimizer" in r["mem"] for r in rows), str(rows[:1]))
        doc = json.load(open(trace)) if os.path.exists(trace) else {"traceEvents": []}
        pids = {e.get("pid") for e in doc["traceEvents"] if e.get("ph") == "X"}
        check(f"--trace: both ranks' steps ({len(doc['traceEvents'])} events)", pids == {0, 1})
        events = [n for n in os.listdir(tb) if n.startswith("events.out.tfevents.")] if os.path.isdir(tb) else []
        check("--tensorboard-dir: an event file with the steps' scalars",
              len(events) == 1 and os.path.getsize(os.path.join(tb, events[0])) > 200)
        r = lib.loom("report", metrics, "-o", os.path.join(tmp, "page.html"))
        check("loom report makes a page of the program's metrics", r.returncode == 0, r.stderr[-300:])
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
