"""Pipeline parallelism: throughput against the other layouts, and the
measured bubble against the schedules' theory.

1. GPT-2 124M, the same global batch, in one run, layouts alternated (fresh
   processes, A B C ... A B C ...): one process with 2 threads, DP 2, TP 2,
   PP 2 with 1f1b and with the interleaved schedule (2 model chunks a
   stage), each rank 1 thread. Prints each layout's median tokens/s, its
   ratio to one process, and per-rank memory by loom's accounting.
2. The bubble: a small model whose layers dominate (8 layers, C 512, T 128,
   vocabulary 64, so the embedding and head cost little) at P = 2 and 4,
   m = 4, 8, 16 micro-batches a step, 1f1b and interleaved (2 chunks a
   stage). The measured bubble is the metrics' pipeline.bubble (each
   stage's idle share of its step's schedule up to the pipeline's drain,
   1 - compute / total, averaged over stages), the median of the steps
   after the first; theory is (P-1)/(m+P-1) for 1f1b and (P-1)/(2m+P-1) for
   interleaved. More ranks than cores (P = 4 on 2 cores) time-share the
   cores: passes must be long against the scheduler's time slices (a
   millisecond pass, C 256 T 64, doubles the measured P = 4 bubble), and
   interleaved's twice as many messages suffer most.

    make && /usr/bin/python3 bench/pipeline.py [--quick] [--skip-gpt2] [--skip-bubble]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from common import ENV, LOOM, MB
from pyref import shard

import numpy as np


def train(tmp, n, flags, steps):
    """Metrics rows of a run on n ranks, the first (warm-up) step left out."""
    metrics = os.path.join(tmp, "m.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [LOOM, "train", "--data-path", os.path.join(tmp, "train.bin"), "--train-iters", str(steps),
           "--log-interval", "1", "--eval-iters", "0", "--metrics", metrics] + flags
    if n > 1:
        cmd = ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS=1"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if p.returncode:
        sys.exit(f"{' '.join(flags)} failed: {p.stderr[-1500:]}")
    return [json.loads(line) for line in open(metrics) if '"loss"' in line][1:]


def gpt2(tmp, rounds, steps, T, G):
    pp2 = ["--threads", "1", "--pipeline-model-parallel-size", "2", "--micro-batch-size", "1"]
    layouts = {"1 process": (1, ["--threads", "2", "--micro-batch-size", str(G)]),
               "DP 2": (2, ["--threads", "1", "--micro-batch-size", str(G // 2)]),
               "TP 2": (2, ["--threads", "1", "--tensor-model-parallel-size", "2", "--micro-batch-size", str(G)]),
               "PP 2 1f1b": (2, pp2),
               "PP 2 interleaved": (2, pp2 + ["--num-layers-per-virtual-pipeline-stage", "3"])}
    tps = {k: [] for k in layouts}
    mem, bubble = {}, {}
    for _ in range(rounds):
        for name, (n, flags) in layouts.items():
            rows = train(tmp, n, ["--model", "gpt2", "--seq-length", str(T), "--global-batch-size", str(G)] + flags,
                         steps)
            tps[name].append(statistics.median(r["tokens_per_s"] for r in rows))
            mem[name] = rows[-1].get("mem_by_rank") or [rows[-1]["mem"]]
            if "pipeline" in rows[-1]:
                bubble[name] = statistics.median(r["pipeline"]["bubble"] for r in rows)
    base = statistics.median(tps["1 process"])
    print(f"GPT-2 124M, T={T}, global batch {G}, {rounds} rounds alternated, medians")
    print(f"{'layout':17s} {'tokens/s':>9s} {'vs 1 proc':>9s} {'bubble':>7s}   per-rank MiB: "
          "params grads optimizer activations comm total")
    for name in layouts:
        m = statistics.median(tps[name])
        per = "; ".join(f"{r['params'] / MB:.0f} {r['grads'] / MB:.0f} {r['optimizer'] / MB:.0f} "
                        f"{r['activations'] / MB:.0f} {r['comm'] / MB:.0f} {r['total'] / MB:.0f}" for r in mem[name])
        b = f"{100 * bubble[name]:6.1f}%" if name in bubble else "      -"
        print(f"{name:17s} {m:9.0f} {m / base:9.2f} {b:>7s}   {per}")


def bubbles(tmp, steps, C, T):
    small = ["--num-layers", "8", "--hidden-size", str(C), "--num-attention-heads", "4", "--seq-length", str(T),
             "--max-position-embeddings", str(T), "--vocab-size", "64", "--micro-batch-size", "1", "--threads", "1"]
    print("\nbubble (each stage's idle share, mean over stages), measured vs theory; "
          f"8 layers, C {C}, T {T}, V 64, micro-batch 1")
    print(f"{'P':>2s} {'m':>3s}   {'1f1b':>6s} {'theory':>6s}   {'interl.':>7s} {'theory':>6s}")
    for P in (2, 4):
        for m in (4, 8, 16):
            got = {}
            for name, flags in (("1f1b", []), ("interleaved", ["--num-layers-per-virtual-pipeline-stage",
                                                               str(8 // (2 * P))])):
                rows = train(tmp, P, small + ["--pipeline-model-parallel-size", str(P), "--global-batch-size",
                                              str(m)] + flags, steps)
                got[name] = statistics.median(r["pipeline"]["bubble"] for r in rows)
            t1, t2 = (P - 1) / (m + P - 1), (P - 1) / (2 * m + P - 1)
            print(f"{P:2d} {m:3d}   {100 * got['1f1b']:5.1f}% {100 * t1:5.1f}%   {100 * got['interleaved']:6.1f}% "
                  f"{100 * t2:5.1f}%")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one round, fewer steps")
    ap.add_argument("--skip-gpt2", action="store_true")
    ap.add_argument("--skip-bubble", action="store_true")
    ap.add_argument("--seq-length", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4, help="global batch (sequences)")
    ap.add_argument("--bubble-hidden", type=int, default=512, help="the bubble model's width")
    ap.add_argument("--bubble-seq", type=int, default=128, help="the bubble model's sequence length")
    a = ap.parse_args()
    rounds, steps = (1, 3) if a.quick else (3, 4)
    with tempfile.TemporaryDirectory() as tmp:
        shard.write(os.path.join(tmp, "train.bin"), np.random.default_rng(0).integers(0, 64, 400000))
        if not a.skip_bubble:
            bubbles(tmp, 6, a.bubble_hidden, a.bubble_seq)
        shard.write(os.path.join(tmp, "train.bin"), np.random.default_rng(0).integers(0, 50257, 400000))
        if not a.skip_gpt2:
            gpt2(tmp, rounds, steps, a.seq_length, a.batch)


if __name__ == "__main__":
    main()
