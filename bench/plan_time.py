"""loom plan's time model against measured step times on this machine.

Calibrates (`loom plan --calibrate` in one process, then under mpirun for
the links), then for each layout below predicts the step time with `loom
plan --json` (the layout given in full) and measures it with `loom train`
(the median ms/step of steps 3 to N), rounds alternating the layouts;
prints each layout's prediction, its median measurement and their ratio.
GPT-2 124M, T=128, global batch 8; multi-rank runs use one thread a rank
(two cores).

    make && /usr/bin/python3 bench/plan_time.py [--rounds R] [--steps N]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from common import ENV, LOOM

BASE = ["--model", "gpt2", "--seq-length", "128", "--global-batch-size", "8"]
FULL = "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
LAYOUTS = [
    ("one process", 1, "--micro-batch-size 4"),
    ("one process bf16", 1, "--micro-batch-size 4 --bf16"),
    ("full recomputation", 1, "--micro-batch-size 4 " + FULL),
    ("DDP 2", 2, "--micro-batch-size 4"),
    ("ZeRO-2 2 bf16", 2, "--micro-batch-size 4 --bf16 --zero-stage 2"),
    ("ZeRO-3 2", 2, "--micro-batch-size 4 --zero-stage 3"),
    ("TP 2", 2, "--micro-batch-size 4 --tensor-model-parallel-size 2"),
    ("PP 2 1F1B", 2, "--micro-batch-size 2 --pipeline-model-parallel-size 2"),
]
DEFAULTS = {"--zero-stage": "0", "--tensor-model-parallel-size": "1", "--pipeline-model-parallel-size": "1",
            "--recompute-granularity": "none", "--num-layers-per-virtual-pipeline-stage": "0"}


def sh(cmd, **kw):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=ENV, **kw)
    if p.returncode:
        sys.exit(f"{' '.join(map(str, cmd))}: exit {p.returncode}\n{p.stderr[-1500:]}")
    return p


def mpi(n, cmd):
    return cmd if n == 1 else ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none"] + cmd


def predict(cluster, n, flags):
    args = BASE + flags + ["--world", str(n), "--cluster", cluster, "--json"]
    for k, v in DEFAULTS.items():
        if k not in flags:
            args += [k, v]
    doc = json.loads(sh([LOOM, "plan"] + args).stdout)
    ents = [e for e in doc["layouts"] if not e["layout"]["sequence_parallel"]]
    return ents[0]["time"]


def measure(tmp, n, flags, steps):
    metrics = os.path.join(tmp, "m.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    threads = ["--threads", str(max(1, os.cpu_count() // n))]
    sh(mpi(n, [LOOM, "train"] + BASE + flags + threads +
           ["--train-iters", str(steps), "--log-interval", "1", "--eval-iters", "0", "--metrics", metrics]))
    rows = [json.loads(l) for l in open(metrics) if '"loss"' in l]
    return statistics.median(r["ms_per_step"] for r in rows[2:]) / 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = os.path.join(tmp, "local.json")
        print(sh([LOOM, "plan", "--calibrate", "-o", cluster]).stdout.strip().splitlines()[-1])
        print(sh(mpi(2, [LOOM, "plan", "--calibrate", "-o", cluster])).stdout.strip().splitlines()[-1])
        pred = {name: predict(cluster, n, f.split()) for name, n, f in LAYOUTS}
        got = {name: [] for name, _, _ in LAYOUTS}
        for r in range(a.rounds):
            for name, n, f in LAYOUTS:
                got[name].append(measure(tmp, n, f.split(), a.steps))
        print(f"\n{'layout':22s} {'predicted s':>11s} {'measured s':>11s} {'ratio':>7s}   predicted parts")
        within = 0
        for name, n, f in LAYOUTS:
            p, m = pred[name]["step"], statistics.median(got[name])
            within += abs(p / m - 1) <= 0.2
            parts = ", ".join(f"{k} {v:.3f}" for k, v in pred[name].items() if k != "step" and v > 0.0005)
            print(f"{name:22s} {p:11.3f} {m:11.3f} {p / m:7.2f}   {parts}")
        print(f"\n{within} of {len(LAYOUTS)} within 20%")


if __name__ == "__main__":
    main()
