"""Expert parallelism's scaling: a mixture of experts at EP 2 on 2 ranks of
1 thread against EP 1 on 1 rank of 2 threads, the same cores and the same
global batch.

    make && /usr/bin/python3 bench/moe_ep.py [--rounds N] [--steps N]

Shape: bench/moe.py's (4 layers of 512 channels, top 2 of 8 SwiGLU
experts of 1024, T=256, vocabulary 32000), micro-batches of 4 and a global
batch of 8. Columns:
  EP 1            1 rank, 2 threads: two micro-batches accumulated;
  EP 2 alltoall   2 ranks of 1 thread (each a data-parallel replica of the
                  dense layers and 4 experts), a micro-batch each, tokens
                  moved by all-to-all;
  EP 2 allgather  the same with --moe-token-dispatcher-type allgather.
Runs alternate (fresh processes); the first step of each run is dropped
and the rest of all rounds pooled into one median tokens/s per column.
Printed: the table and each EP 2 column over EP 1 (1.0 is linear scaling:
the same cores, the same work).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import ENV, LOOM

L, C, NH, G, T, B, V, E, K, F = 4, 512, 8, 4, 256, 4, 32000, 8, 2, 1024
MODEL = ["--model", "mixtral-tiny", "--num-layers", L, "--hidden-size", C, "--num-attention-heads", NH,
         "--num-query-groups", G, "--ffn-hidden-size", F, "--num-experts", E, "--moe-router-topk", K,
         "--seq-length", T, "--max-position-embeddings", T, "--vocab-size", V, "--micro-batch-size", B,
         "--global-batch-size", 2 * B]
COLUMNS = (("EP 1", 1, 2, []),
           ("EP 2 alltoall", 2, 1, ["--expert-model-parallel-size", 2]),
           ("EP 2 allgather", 2, 1, ["--expert-model-parallel-size", 2, "--moe-token-dispatcher-type", "allgather"]))


def run(ranks, threads, extra, steps, shard_path, tmp):
    metrics = os.path.join(tmp, f"m_{time.monotonic_ns()}.jsonl")
    cmd = [LOOM, "train"] + MODEL + extra + ["--train-iters", steps, "--data-path", shard_path, "--threads",
                                              threads, "--log-interval", 1, "--eval-iters", 0, "--metrics", metrics]
    if ranks > 1:
        cmd = ["mpirun", "-np", ranks, "--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS=1"] + cmd
    p = subprocess.run([str(a) for a in cmd], capture_output=True, text=True, env=ENV)
    if p.returncode != 0:
        sys.exit(f"moe_ep: loom failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    with open(metrics) as f:
        rows = [json.loads(x) for x in f if x.strip()]
    return [r["tokens_per_s"] for r in rows if "tokens_per_s" in r and r["step"] > 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    import numpy as np
    from pyref import shard
    cols = {name: [] for name, *_ in COLUMNS}
    with tempfile.TemporaryDirectory(prefix="loom-bench-moe-ep-") as tmp:
        shard_path = os.path.join(tmp, "train.bin")
        shard.write(shard_path, np.random.default_rng(0).integers(0, V, size=1_000_000))
        for r in range(a.rounds):
            for name, ranks, threads, extra in COLUMNS:
                cols[name] += run(ranks, threads, extra, a.steps, shard_path, tmp)
            print(f"round {r + 1}: " + ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in cols.items())
                  + " tok/s", flush=True)
    med = {k: statistics.median(v) for k, v in cols.items()}
    print(f"\n{L} layers x {C}, top {K} of {E} experts of {F}, T={T}, micro-batch {B}, global batch {2 * B}, "
          f"V={V}; medians over {a.rounds} round(s), tokens/s\n")
    print("| EP 1 (1 x 2 threads) | EP 2 alltoall (2 x 1) | EP 2 allgather (2 x 1) | alltoall / EP 1 | "
          "allgather / EP 1 |")
    print("|---|---|---|---|---|")
    one = med["EP 1"]
    print(f"| {one:.1f} | {med['EP 2 alltoall']:.1f} | {med['EP 2 allgather']:.1f} | "
          f"{med['EP 2 alltoall'] / one:.2f} | {med['EP 2 allgather'] / one:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
