"""Data-parallel scaling on one machine: GPT-2 124M, 2 ranks x 1 thread
against 1 rank x 2 threads at the same global batch, in one run.

For each sequence length, runs alternate A B C A B C (fresh processes):
  A  1 rank x 2 threads, micro-batch B, 2 accumulation steps (global 2B)
  B  2 ranks x 1 thread, micro-batch B each, overlapped bucketed all-reduce
  C  2 ranks x 1 thread, --no-overlap (all buckets reduced after backward)
and prints the median tokens/s of each, the ratio B/A (target >= 0.9) and
the exposed communication per step (time spent waiting on reductions after
the last backward kernel, `comm_wait_ms` in the metrics) with overlap on and
off. The first step of every run is dropped.

    make && /usr/bin/python3 bench/ddp.py [--quick] [--only T]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from pyref import shard  # noqa: E402

import numpy as np  # noqa: E402

LOOM = os.path.join(HERE, "..", os.environ.get("BUILD", "build"), "loom")
# PMIX_MCA_psec: see tests/lib.py (a stale munge socket: 2.3 s a launch)
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           PMIX_MCA_psec=os.environ.get("PMIX_MCA_psec", "native"))


def run(tmp, kind, B, T, steps):
    metrics = os.path.join(tmp, f"{kind}-{T}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    args = ["train", "--model", "gpt2", "--seq-length", str(T), "--data-path", os.path.join(tmp, "train.bin"),
            "--global-batch-size", str(2 * B), "--micro-batch-size", str(B), "--train-iters", str(steps),
            "--log-interval", "1", "--eval-iters", "0", "--metrics", metrics]
    if kind == "1x2":
        cmd = [LOOM] + args + ["--threads", "2"]
    else:
        cmd = ["mpirun", "-np", "2", "--bind-to", "core", "-x", "OMP_NUM_THREADS=1", LOOM] + args + ["--threads", "1"]
        if kind == "2x1-no-overlap":
            cmd.append("--no-overlap")
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if p.returncode:
        sys.exit(f"{kind} T={T} failed: {p.stderr[-1500:]}")
    rows = [json.loads(l) for l in open(metrics) if '"loss"' in l][1:]
    return [r["tokens_per_s"] for r in rows], [r.get("comm_wait_ms", 0.0) for r in rows], \
           [r["ms_per_step"] for r in rows]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one round, fewer steps")
    ap.add_argument("--only", type=int, metavar="T", help="one sequence length")
    a = ap.parse_args()
    rounds, steps = (1, 3) if a.quick else (2, 4)
    kinds = ["1x2", "2x1-overlap", "2x1-no-overlap"]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        shard.write(os.path.join(tmp, "train.bin"), np.random.default_rng(0).integers(0, 50257, 400000))
        for T in ([a.only] if a.only else [64, 256]):
            B = 4
            tps = {k: [] for k in kinds}
            wait = {k: [] for k in kinds}
            step_ms = {k: [] for k in kinds}
            for r in range(rounds):
                for k in kinds:
                    t, w, s = run(tmp, k, B, T, steps)
                    tps[k] += t
                    wait[k] += w
                    step_ms[k] += s
                    print(f"round {r + 1} T={T} {k:15s} tokens/s {statistics.median(t):8.1f}  "
                          f"comm wait {statistics.median(w):7.1f} ms/step", flush=True)
            med = {k: statistics.median(tps[k]) for k in kinds}
            results.append((T, med, {k: statistics.median(wait[k]) for k in kinds},
                            {k: statistics.median(step_ms[k]) for k in kinds}))
    print("\nGPT-2 124M, global batch 8 (B=4 per rank), medians over steps 2..N of all rounds")
    print("| T | 1x2 tok/s | 2x1 tok/s (overlap) | 2x1/1x2 | exposed comm, overlap on | overlap off | step ms (2x1) |")
    print("|---|---|---|---|---|---|---|")
    for T, med, w, s in results:
        print(f"| {T} | {med['1x2']:.1f} | {med['2x1-overlap']:.1f} | {med['2x1-overlap'] / med['1x2']:.2f} | "
              f"{w['2x1-overlap']:.0f} ms | {w['2x1-no-overlap']:.0f} ms | {s['2x1-overlap']:.0f} |")


if __name__ == "__main__":
    main()
