"""Data parallelism keeps the math: `mpirun -np N loom train` with global
batch G gives the per-step loss of the single-process run with global batch
G (reached through accumulation), and the same final weights.

Cases: N = 2 and 4 (oversubscribed on 2 cores), without and with
accumulation on each rank, bucketed with overlap, bucketed without overlap,
and the naive one-all-reduce reference. Buckets are made small so the tiny
model spans several of them and overlap really happens.

Tolerance 1e-5 relative: ranks sum partial gradients in a different order
than one process accumulating micro-batches, so results agree to float32
rounding, not bit for bit.
"""
import sys
import tempfile

import lib


def main():
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        # global batch 8 in every case; the reference is one process accumulating micro-batches of 1
        ref8 = lib.tiny_run(tmp, "single-G8", 1, ["--global-batch-size", "8", "--micro-batch-size", "1"])
        modes = {"overlap": [], "no-overlap": ["--no-overlap"], "naive": ["--ddp-impl", "naive"]}
        for n in (2, 4):
            for accum in (False, True):
                micro = 8 // n // (2 if accum else 1)
                for mode, flags in modes.items():
                    tag = f"np{n}-micro{micro}-accum{(8 // n) // micro}-{mode}"
                    batch = ["--global-batch-size", "8", "--micro-batch-size", str(micro)]
                    lib.compare_runs(tag, ref8, lib.tiny_run(tmp, tag, n, batch + flags))
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
