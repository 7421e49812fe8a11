"""ZeRO stages 1, 2 and 3 keep the math and shard the model states.

Equivalence: `--zero-stage 1` and `2` at 2 and 4 ranks (and 3 ranks with a
parameter count that does not split evenly), with accumulation and clipping,
give the single-process per-step loss and final weights (same tolerances and
comparison as test_ddp.py: lib.tiny_run and lib.compare_runs).
Memory per rank, fp32 Adam with Psi parameters on N ranks, within 5%:
stage 1: params 4 Psi, grads 4 Psi, optimizer 8 Psi/N; stage 2: params
4 Psi, grads 4 Psi/N, optimizer 8 Psi/N; stage 3: all three / N (transient
gradient buffers and gathered units are counted under comm). Stage 3 also
runs with gather units of several blocks under FSDP's flag name, and a
conflicting pair of flags is a one-line error. ZeRO-1 reduce-scatters its
gradients onto the shards (Megatron's distributed optimizer): a traced run's
large dp collectives are reduce-scatters where DDP's are all-reduces, and
the planner prices ZeRO-1's data-parallel traffic below DDP's and below
ZeRO-2's (which reduce-scatters every micro-batch) with accumulation."""
import json
import os
import sys
import tempfile

import lib
from lib import check
from pyref import st


def zero1_collectives(tmp):
    big = {}
    for stage in ("0", "1"):
        trace = os.path.join(tmp, f"zero{stage}-trace.json")
        lib.run_ranks(2, [lib.LOOM, "train", "--data-path", os.path.join(tmp, "train.bin"), *lib.TINY_MODEL,
                          "--train-iters", "2", "--global-batch-size", "8", "--micro-batch-size", "2", "--eval-iters",
                          "0", "--threads", "1", "--zero-stage", stage, "--trace", trace], tag=f"zero{stage} trace")
        with open(trace) as f:
            ev = json.load(f)["traceEvents"]
        big[stage] = sorted({e["name"] for e in ev if e.get("cat") == "comm" and e["ph"] == "b" and
                             e["name"].endswith(" dp") and e["args"]["bytes"] >= 4 * 10000})
    check(f"ZeRO-1 reduce-scatters the gradients where DDP all-reduces them (dp collectives of 40 KB and more: "
          f"ZeRO-1 {big['1']}, DDP {big['0']})",
          "reduce-scatter dp" in big["1"] and "all-reduce dp" not in big["1"] and "all-reduce dp" in big["0"])
    comm = {}
    for stage in ("0", "1", "2"):  # gpt2 on 8 A100s, bf16, 4 micro-batches a step
        p = lib.loom("plan", "--model", "gpt2", "--global-batch-size", "64", "--world", "8", "--cluster",
                     "a100-80gb", "--zero-stage", stage, "--tensor-model-parallel-size", "1",
                     "--pipeline-model-parallel-size", "1", "--micro-batch-size", "2", "--precision", "bf16",
                     "--top", "1", "--json")
        try:
            comm[stage] = json.loads(p.stdout)["layouts"][0]["time"]["dp_comm"]
        except (ValueError, KeyError, IndexError):
            comm[stage] = None
    check(f"the planner prices it so: ZeRO-1's data-parallel communication ({comm['1']}) below DDP's all-reduce "
          f"({comm['0']}) and ZeRO-2's reduce-scatter of every micro-batch ({comm['2']})",
          None not in comm.values() and comm["1"] < comm["0"] and comm["1"] < comm["2"])


def main():
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        ref = lib.tiny_run(tmp, "single", 1, ["--global-batch-size", "8", "--micro-batch-size", "1"])
        for stage in (1, 2, 3):
            for n in (2, 4):
                tag = f"zero{stage}-np{n}-accum2"
                got = lib.tiny_run(tmp, tag, n, ["--global-batch-size", "8", "--micro-batch-size", str(8 // n // 2),
                                                 "--zero-stage", str(stage)])
                lib.compare_runs(tag, ref, got)
                rows = lib.metrics_rows(os.path.join(tmp, f"{tag}.jsonl"))
                psi = sum(t.size for t in ref[1].values())
                want = {"params": 4 * psi / (n if stage >= 3 else 1), "grads": 4 * psi / (n if stage >= 2 else 1),
                        "optimizer": 8 * psi / n}
                for key, value in want.items():
                    got_b = [r[key] for r in rows[-1]["mem_by_rank"]]
                    worst = max(abs(b - value) / value for b in got_b)
                    check(f"{tag}: {key} bytes per rank within 5% of {value:.0f} (worst {worst:.2%}: {got_b})",
                          worst <= 0.05)
        # uneven shards: 3 ranks and a parameter count not divisible by 3 (V=255)
        ref255 = lib.tiny_run(tmp, "single-v255", 1, ["--global-batch-size", "6", "--micro-batch-size", "1",
                                                      "--vocab-size", "255"])
        psi = sum(t.size for t in ref255[1].values())
        check(f"uneven case: {psi} parameters do not split evenly in 3", psi % 3 != 0)
        for stage in (1, 2, 3):
            tag = f"zero{stage}-np3-uneven"
            flags = ["--global-batch-size", "6", "--micro-batch-size", "1", "--vocab-size", "255", "--zero-stage",
                     str(stage)]
            lib.compare_runs(tag, ref255, lib.tiny_run(tmp, tag, 3, flags))
        # the numerics Hugging Face's configs carry: an LM head of its own (one tensor more, in the head
        # block, and no tied table for DDP's early bucket or ZeRO's pinned unit), exact GELU, another eps
        numerics = ["--untie-embeddings-and-output-weights", "--activation-function", "gelu", "--norm-epsilon", "1e-3"]
        ref_u = lib.tiny_run(tmp, "single-untied", 1, ["--global-batch-size", "8", "--micro-batch-size", "1", *numerics])
        check("untied: the checkpoint holds lm_head.weight", "lm_head.weight" in ref_u[1])
        for stage in (0, 2, 3):
            tag = f"untied-gelu-eps-zero{stage}-np2"
            lib.compare_runs(tag, ref_u, lib.tiny_run(tmp, tag, 2, [
                "--global-batch-size", "8", "--micro-batch-size", "2", "--zero-stage", str(stage), *numerics]))
        # stage 3 starting from a weights file (sharded from the loaded model, not initialised unit by unit)
        start = os.path.join(tmp, "start.safetensors")
        st.save(start, ref[1])
        ref_load = lib.tiny_run(tmp, "single-load", 1, ["--global-batch-size", "8", "--micro-batch-size", "1",
                                                        "--load", start])
        lib.compare_runs("zero3-np2-from-load", ref_load, lib.tiny_run(tmp, "zero3-load", 2, [
            "--global-batch-size", "8", "--micro-batch-size", "2", "--zero-stage", "3", "--load", start]))
        # stage 3 with gather units of several blocks (FSDP's size-based wrap), by FSDP's name
        lib.compare_runs("fsdp-full-shard-np2-units", ref, lib.tiny_run(tmp, "fsdp-units", 2, [
            "--global-batch-size", "8", "--micro-batch-size", "2", "--fsdp-sharding-strategy", "FULL_SHARD",
            "--zero3-min-params", "20000"]))
        # ZeRO-1's gradients reduce-scattered onto the shards (Megatron's distributed optimizer), not all-reduced:
        # the trace's collectives over dp of at least a bucket's bytes, and the planner's price of it
        zero1_collectives(tmp)
        p = lib.run_ranks(2, [lib.LOOM, "train", "--zero-stage", "2", "--fsdp-sharding-strategy", "FULL_SHARD",
                              "--data-path", os.path.join(tmp, "train.bin"), "--train-iters", "1"],
                          expect=None, timeout=60)
        lines = lib.error_lines(p.stderr)
        check("conflicting --zero-stage and --fsdp-sharding-strategy: one error line, exit 2",
              p.returncode == 2 and len(lines) == 1 and "FULL_SHARD means --zero-stage 3" in lines[0], p.stderr[-400:])
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
