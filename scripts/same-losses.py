#!/usr/bin/env python3
"""Two builds of loom, the same runs: are the per-step losses and gradient
norms bit for bit the same? For refactors that promise not to change the
math. Each layout trains gpt2-tiny (or llama-tiny) 8 steps (global batch 8,
micro-batch 2) with one build and then the other, and the metrics are
compared exactly: data, tensor, sequence and pipeline parallelism (every
schedule), their mixes, recomputation, 16-bit and fp8 training, and
mixtures of experts under expert parallelism.

    scripts/same-losses.py BUILD_A BUILD_B [LAYOUT ...]

e.g. `git worktree add /tmp/prev HEAD~1 && make -C /tmp/prev` then
`scripts/same-losses.py /tmp/prev/build build`. Exit status 1 when any
layout differs.
"""
import json
import os
import subprocess
import sys
import tempfile

# PMIX_MCA_psec: see tests/lib.py (a stale munge socket: 2.3 s a launch)
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_mpi_yield_when_idle="1", PMIX_MCA_psec=os.environ.get("PMIX_MCA_psec", "native"))
BASE = ["train", "--train-iters", "8", "--log-interval", "1", "--eval-iters", "0", "--global-batch-size", "8",
        "--micro-batch-size", "2"]
TP2 = ["--tensor-model-parallel-size", "2"]
PP2 = ["--pipeline-model-parallel-size", "2"]
LLAMA = ["--model", "llama-tiny"]
MIXTRAL = ["--model", "mixtral-tiny", "--moe-aux-loss-coeff", "0.01", "--moe-z-loss-coeff", "0.001"]
EP2 = ["--expert-model-parallel-size", "2"]
LAYOUTS = {
    "1 process": (1, []),
    "1 process bf16": (1, ["--bf16"]),
    "1 process fp16": (1, ["--fp16"]),
    "full recomputation": (1, ["--recompute-granularity", "full", "--recompute-method", "uniform",
                               "--recompute-num-layers", "2"]),
    "DDP": (2, []),
    "DDP naive": (2, ["--ddp-impl", "naive"]),
    "DDP bf16": (2, ["--bf16"]),
    "DDP bf16, bf16 reduction": (2, ["--bf16", "--grad-reduce-dtype", "bf16"]),
    "ZeRO-1": (2, ["--zero-stage", "1"]),
    "ZeRO-1 bf16, accumulation 4": (2, ["--zero-stage", "1", "--bf16", "--micro-batch-size", "1"]),
    "ZeRO-2": (2, ["--zero-stage", "2"]),
    "ZeRO-2 bf16": (2, ["--zero-stage", "2", "--bf16"]),
    "ZeRO-3": (2, ["--zero-stage", "3"]),
    "ZeRO-3 multi-block units": (2, ["--zero-stage", "3", "--zero3-min-params", "300000"]),
    "ZeRO-3 bf16, bf16 reduction": (2, ["--zero-stage", "3", "--bf16", "--grad-reduce-dtype", "bf16"]),
    "selective recomputation": (1, ["--recompute-granularity", "selective"]),
    "fp8": (1, ["--bf16", "--fp8-format", "hybrid"]),
    "attention window": (1, ["--attention-window", "24", "--sparse-block", "8"]),
    "TP 2": (2, TP2),
    "TP 2 + SP": (2, TP2 + ["--sequence-parallel"]),
    "TP 2 + SP bf16": (2, TP2 + ["--sequence-parallel", "--bf16"]),
    "TP 2 + SP invariant": (2, TP2 + ["--sequence-parallel", "--layout-invariant", "2"]),
    "TP 2 fp8": (2, TP2 + ["--bf16", "--fp8-format", "hybrid"]),
    "PP 2 1f1b": (2, PP2),
    "PP 2 gpipe": (2, PP2 + ["--pipeline-schedule", "gpipe"]),
    "PP 2 interleaved": (2, PP2 + ["--num-layers-per-virtual-pipeline-stage", "1"]),
    "PP 2 bf16, full recomputation": (2, PP2 + ["--bf16", "--recompute-granularity", "full", "--recompute-method",
                                                "block", "--recompute-num-layers", "1"]),
    "TP 2 x PP 2 invariant": (4, TP2 + PP2 + ["--layout-invariant", "2"]),
    "DDP 2 x TP 2, ZeRO-3": (4, TP2 + ["--zero-stage", "3"]),
    "llama 1 process": (1, LLAMA),
    "llama bf16": (1, LLAMA + ["--bf16"]),
    "llama fp16, selective recomputation": (1, LLAMA + ["--fp16", "--recompute-granularity", "selective"]),
    "llama fp8": (1, LLAMA + ["--bf16", "--fp8-format", "hybrid"]),
    "llama full recomputation": (1, LLAMA + ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                             "--recompute-num-layers", "2"]),
    "llama attention window": (1, LLAMA + ["--attention-window", "24", "--sparse-block", "8"]),
    "llama DDP": (2, LLAMA),
    "llama ZeRO-3": (2, LLAMA + ["--zero-stage", "3"]),
    "llama TP 2 + SP": (2, LLAMA + TP2 + ["--sequence-parallel"]),
    "llama TP 2 + SP bf16": (2, LLAMA + TP2 + ["--sequence-parallel", "--bf16"]),
    "llama PP 2 interleaved": (2, LLAMA + PP2 + ["--num-layers-per-virtual-pipeline-stage", "1"]),
    "llama TP 2 x PP 2 invariant": (4, LLAMA + TP2 + PP2 + ["--layout-invariant", "2"]),
    "mixtral 1 process": (1, MIXTRAL),
    "mixtral bf16": (1, MIXTRAL + ["--bf16"]),
    "mixtral EP 2": (2, MIXTRAL + EP2),
    "mixtral EP 2 allgather": (2, MIXTRAL + EP2 + ["--moe-token-dispatcher-type", "allgather"]),
    "mixtral EP 2 x DP 2, ZeRO-3": (4, MIXTRAL + EP2 + ["--zero-stage", "3"]),
    "mixtral EP 2 x DP 2, ZeRO-1 bf16": (4, MIXTRAL + EP2 + ["--zero-stage", "1", "--bf16"]),
    "mixtral EP 2, ZeRO-2": (2, MIXTRAL + EP2 + ["--zero-stage", "2"]),
    "gpt2 experts bf16, padded capacity": (1, ["--num-experts", "4", "--moe-expert-capacity-factor", "1.0",
                                                "--moe-pad-expert-input-to-capacity", "--bf16"]),
    "gpt2 experts, TP 2 + SP": (2, ["--num-experts", "4"] + TP2 + ["--sequence-parallel"]),
}


def metrics(build, n, extra, path):
    if os.path.exists(path):
        os.remove(path)
    cmd = [os.path.join(build, "loom")] + BASE + extra + ["--metrics", path]
    if n > 1:
        cmd = ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none"] + cmd
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    if p.returncode:
        sys.exit(f"same-losses: {build}: {' '.join(extra)} failed ({p.returncode}): {p.stderr[-1500:]}")
    with open(path) as f:
        return [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, f) if "loss" in r]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    a, b, chosen = sys.argv[1], sys.argv[2], sys.argv[3:] or list(LAYOUTS)
    differ = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in chosen:
            n, extra = LAYOUTS[name]
            ra = metrics(a, n, extra, os.path.join(tmp, "a.jsonl"))
            rb = metrics(b, n, extra, os.path.join(tmp, "b.jsonl"))
            same = ra == rb and len(ra) == 8
            differ += not same
            print(f"{name:32} {'bit for bit' if same else 'DIFFERENT'}  (step 8 loss {rb[-1][1]!r})", flush=True)
    print(f"{len(chosen) - differ} layouts the same, {differ} different")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
