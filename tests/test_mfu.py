#!/usr/bin/env python3
"""MFU you can trust: the peak it divides by does not swing with the
machine's load, and a value above 100% is never printed as if it were real.

- Ten start-ups of `loom train` with a fresh cache while two busy processes
  load the machine: the peak each prints (the best calibration of this
  machine's start-ups, kept in $XDG_CACHE_HOME/loom/peak.json) varies by at
  most 10% (the figures are printed); the line names its source and the
  cache file, and the cache holds the printed peak.
- A peak below the run's own FLOP/s (--peak-tflops 1e-5): the step lines and
  the summary say ">100% (peak too low)", never a percentage above 100.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import lib
from lib import ENV, LOOM, check

ARGS = ["train", "--train-iters", "1", "--eval-iters", "0", "--threads", "2"]
PEAK = re.compile(r"peak ([\d.]+) GFLOP/s \((the best calibration of (\d+) start-ups? on this machine, cached in (.+))\)")


def main():
    if not lib.built(LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(ENV, XDG_CACHE_HOME=os.path.join(tmp, "cache"))
        load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        peaks, sources = [], []
        try:
            for _ in range(10):
                p = lib.run([LOOM, *ARGS], timeout=300, env=env)
                m = PEAK.search(p.stdout)
                peaks.append(float(m.group(1)) if m and p.returncode == 0 else 0.0)
                sources.append(m.groups()[1:] if m else None)
        finally:
            for q in load:
                q.kill()
                q.wait()
        spread = max(peaks) / min(peaks) - 1 if min(peaks) > 0 else float("inf")
        check(f"10 start-ups under load: peaks {', '.join(f'{x:.1f}' for x in peaks)} GFLOP/s vary by "
              f"{100 * spread:.1f}% (at most 10%)", spread <= 0.10)
        cache = os.path.join(tmp, "cache", "loom", "peak.json")
        kept = json.load(open(cache)) if os.path.exists(cache) else {}
        best = max((e.get("flops", 0) for e in kept.values()), default=0)
        check("the line names its source and the cache, which holds the printed peak "
              f"({sources[-1][1] if sources[-1] else None} start-ups)",
              sources[-1] is not None and sources[-1][1] == "10" and sources[-1][2] == cache
              and abs(best / 1e9 - peaks[-1]) < 0.1, str(sources[-1]))
        p = lib.run([LOOM, *ARGS, "--train-iters", "2", "--peak-tflops", "1e-5"], timeout=300, env=env)
        shown = re.findall(r"mfu (\S+)", p.stdout)
        check(f"a peak below the run's FLOP/s: every MFU printed says so ({shown})",
              p.returncode == 0 and len(shown) >= 2 and all(s == ">100%" for s in shown)
              and p.stdout.count("(peak too low)") == len(shown), p.stderr[-300:])
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
