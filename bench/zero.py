"""ZeRO stages against DDP on one machine: GPT-2 124M, 2 ranks x 1 thread,
the same global batch, in one run. Runs alternate DDP, stage 1, stage 2,
stage 3 (fresh processes, A B C D A B C D); prints each one's median step
time relative to DDP, the per-rank model-state bytes measured by loom's
accounting (params, grads, optimizer, comm) next to the ZeRO paper's
formulas, and the peak RSS per rank.

    make && /usr/bin/python3 bench/zero.py [--quick] [--ranks N] [--seq-length T]
"""
import argparse
import json
import os
import re
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
MB = 1e6


def run(tmp, stage, n, T, steps):
    metrics = os.path.join(tmp, f"zero{stage}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS=1", LOOM, "train",
           "--model", "gpt2", "--seq-length", str(T), "--data-path", os.path.join(tmp, "train.bin"),
           "--global-batch-size", str(4 * n), "--micro-batch-size", "4", "--train-iters", str(steps),
           "--log-interval", "1", "--eval-iters", "0", "--metrics", metrics, "--threads", "1",
           "--zero-stage", str(stage)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if p.returncode:
        sys.exit(f"stage {stage} failed: {p.stderr[-1500:]}")
    rows = [json.loads(l) for l in open(metrics) if '"loss"' in l][1:]
    rss = re.search(r"peak RSS by rank: (.*)", p.stdout).group(1)
    return [r["ms_per_step"] for r in rows], rows[-1]["mem_by_rank"], rss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one round, fewer steps")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--seq-length", type=int, default=64)
    a = ap.parse_args()
    rounds, steps = (1, 3) if a.quick else (2, 4)
    n, T = a.ranks, a.seq_length
    times = {s: [] for s in range(4)}
    mem, rss = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        shard.write(os.path.join(tmp, "train.bin"), np.random.default_rng(0).integers(0, 50257, 400000))
        for r in range(rounds):
            for s in range(4):
                t, mem[s], rss[s] = run(tmp, s, n, T, steps)
                times[s] += t
                print(f"round {r + 1} stage {s}: {statistics.median(t):8.0f} ms/step", flush=True)
    psi = 124439808
    ddp = statistics.median(times[0])
    print(f"\nGPT-2 124M (Psi = {psi}), {n} ranks x 1 thread, B=4 per rank, T={T}; medians over steps 2..N")
    print("| stage | ms/step | vs DDP | params MB | grads MB | optimizer MB | comm MB | formula (params, grads, optimizer) MB | peak RSS by rank |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s in range(4):
        f = [4 * psi / (n if s >= 3 else 1), 4 * psi / (n if s >= 2 else 1), 8 * psi / (n if s >= 1 else 1)]
        m0 = max(mem[s], key=lambda x: x["total"])
        med = statistics.median(times[s])
        print(f"| {s} | {med:.0f} | {med / ddp:.2f}x | {m0['params'] / MB:.0f} | {m0['grads'] / MB:.0f} | "
              f"{m0['optimizer'] / MB:.0f} | {m0['comm'] / MB:.0f} | {f[0] / MB:.0f}, {f[1] / MB:.0f}, {f[2] / MB:.0f} | "
              f"{rss[s]} |")


if __name__ == "__main__":
    main()
