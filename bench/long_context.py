"""GPT-2 124M training at long sequences: loom's fused attention against its
(T,T) kernels and against PyTorch 2.x, in float32 and bf16.

    make && /usr/bin/python3 bench/long_context.py [--rounds N] [--only T]

B=1 at T=1024 and T=4096, 2 threads. Columns:
  loom        `loom train --model gpt2` (the fused attention, the default),
              with --bf16 for bf16;
  unfused     the same with --attention-backend unfused (the kernels that
              store the (T,T) probabilities: loom before the fused kernel);
  PyTorch     PyTorch 2.x from PyPI (bench/bf16.py's environment and
              model: F.scaled_dot_product_attention, causal; bf16 under
              torch.autocast, float32 without), AdamW, clip_grad_norm_.
Runs alternate loom, unfused, PyTorch, loom, ... (fresh processes); the first
step of each run is dropped and the rest of all rounds pooled into one
median tokens/s per column. Printed: the table, loom/PyTorch, loom/unfused
and loom's MFU against the peak it calibrates at start-up.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bf16 as torch2  # noqa: E402  (its PyTorch 2.x environment and GPT-2)

THREADS = 2
V = torch2.V


def run_loom(T, steps, precision, backend, shard_path, tmp):
    metrics = os.path.join(tmp, f"m_{T}_{precision}_{backend}_{time.monotonic_ns()}.jsonl")
    args = [torch2.LOOM, "train", "--model", "gpt2", "--seq-length", T, "--max-position-embeddings", max(T, 1024),
            "--micro-batch-size", 1, "--global-batch-size", 1, "--train-iters", steps, "--data-path", shard_path,
            "--threads", THREADS, "--log-interval", 1, "--eval-iters", 0, "--metrics", metrics,
            "--attention-backend", backend] + (["--bf16"] if precision == "bf16" else [])
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"long_context: loom failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    with open(metrics) as f:
        rows = [json.loads(x) for x in f if x.strip()]
    rows = [r for r in rows if "tokens_per_s" in r and r["step"] > 1]
    return [r["tokens_per_s"] for r in rows], [r["mfu"] for r in rows]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", type=int, help="one T")
    ap.add_argument("--precision", choices=["f32", "bf16"], help="one precision")
    a = ap.parse_args()
    version = torch2.ensure_torch2()
    shapes = [a.only] if a.only else [1024, 4096]
    precisions = [a.precision] if a.precision else ["f32", "bf16"]
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    import numpy as np
    from pyref import shard
    table = []
    with tempfile.TemporaryDirectory(prefix="loom-bench-long-") as tmp:
        shard_path = os.path.join(tmp, "train.bin")
        shard.write(shard_path, np.random.default_rng(0).integers(0, V, size=2_000_000))
        for T in shapes:
            steps = 5 if T <= 1024 else 3
            for prec in precisions:
                cols = {"loom": [], "unfused": [], "torch": []}
                mfu = []
                for r in range(a.rounds):
                    tps, m = run_loom(T, steps, prec, "auto", shard_path, tmp)
                    cols["loom"] += tps
                    mfu += m
                    cols["unfused"] += run_loom(T, steps, prec, "unfused", shard_path, tmp)[0]
                    cols["torch"] += torch2.run_torch(1, T, steps, prec)
                    print(f"T={T} {prec} round {r + 1}: " + ", ".join(
                        f"{k} {statistics.median(v):.1f}" for k, v in cols.items()) + " tok/s", flush=True)
                med = {k: statistics.median(v) for k, v in cols.items()}
                table.append((T, prec, med, statistics.median(mfu)))
    print(f"\nGPT-2 124M, B=1, {THREADS} threads; PyTorch {version}; medians over {a.rounds} round(s), tokens/s\n")
    print("| T | precision | loom | loom unfused | PyTorch | loom/PyTorch | loom/unfused | loom MFU |")
    print("|---|---|---|---|---|---|---|---|")
    for T, prec, med, m in table:
        print(f"| {T} | {prec} | {med['loom']:.1f} | {med['unfused']:.1f} | {med['torch']:.1f} | "
              f"{med['loom'] / med['torch']:.2f} | {med['loom'] / med['unfused']:.2f} | {100 * m:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
