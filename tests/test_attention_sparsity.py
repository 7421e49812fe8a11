"""Block-sparse attention (DeepSpeed's sparse_attention block and flags,
--attention-window W; src/kernels/sparse_layout.h, sparse_attention.c) end
to end in GPT-2, beside tests/test_sparse_attention.c's kernel checks:

1. Every mode (fixed with per-head patterns, bigbird, bslongformer,
   variable, window) trains the same under tensor parallelism with and
   without sequence parallelism (each rank computes its heads' layouts,
   numbered globally) as in one process: per-step loss within 1e-5 over 20
   steps, final weights within 1e-5; the window also under DDP, ZeRO-3 and
   pipeline parallelism, and in bf16 (16-bit activations: one sequence at a
   time) under DDP within bf16's 1e-4. Llama's attention (the key/value
   heads repeated into the packed q | k | v) takes the window and bigbird
   under TP 2 + SP the same way.
2. A window covering the whole sequence is dense causal attention, bit for
   bit; a window shorter than the sequence is not (the test sees the mask).
3. The JSON block gives the flags' run, lists included.
4. Bad settings, each exit 2 with one line naming it: a block that does not
   divide --seq-length, --attention-window beside a mode, bidirectional
   attention, a list that does not parse or holds more than 16 blocks, a
   JSON list that is not of integers.
5. Convergence: gpt2-tiny at T=512 (2 sequences a step) on the built-in
   corpus with a window of 128 (a quarter of the sequence) ends within 2% of
   dense attention's loss (mean of the last 20 of 300 steps; measured
   0.2% apart).
"""
import json
import os
import sys
import tempfile

import numpy as np

import lib
from lib import check

# TINY_MODEL has T=16 and 4 heads: blocks of 4 tokens, 4 blocks a side
MODES = {
    "fixed": ["--sparse-attention-mode", "fixed", "--sparse-block", "4", "--sparse-num-local-blocks", "2",
              "--sparse-different-layout-per-head", "--sparse-num-different-global-patterns", "2"],
    "bigbird": ["--sparse-attention-mode", "bigbird", "--sparse-block", "4", "--sparse-num-random-blocks", "1",
                "--sparse-num-sliding-window-blocks", "1", "--sparse-different-layout-per-head"],
    "bslongformer": ["--sparse-attention-mode", "bslongformer", "--sparse-block", "4",
                     "--sparse-num-sliding-window-blocks", "1", "--sparse-global-block-indices", "0"],
    "variable": ["--sparse-attention-mode", "variable", "--sparse-block", "4", "--sparse-local-window-blocks", "1,2",
                 "--sparse-global-block-indices", "1"],
    "window": ["--attention-window", "6", "--sparse-block", "4"],
}
BASE = ["--global-batch-size", "8", "--micro-batch-size", "2"]


def main():
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        dense = lib.tiny_run(tmp, "dense", 1, BASE)
        single = {}
        # 1. every mode under TP (+SP); the window under the other layouts
        for mode, flags in MODES.items():
            one = single[mode] = lib.tiny_run(tmp, mode, 1, BASE + flags)
            check(f"{mode}: the layout masks something (the losses are not dense attention's)", one[0] != dense[0])
            for tag, n, extra in (("TP 2", 2, ["--tensor-model-parallel-size", "2"]),
                                  ("TP 2 + SP", 2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"])):
                got = lib.tiny_run(tmp, f"{mode}-{tag.replace(' ', '').replace('+', '')}", n, BASE + flags + extra)
                lib.compare_runs(f"{mode}, {tag}", one, got)
            if mode == "window":
                for tag, n, extra in (("DDP", 2, []), ("ZeRO-3", 2, ["--zero-stage", "3"]),
                                      ("PP 2", 2, ["--pipeline-model-parallel-size", "2"])):
                    got = lib.tiny_run(tmp, f"window-{tag.replace(' ', '')}", n, BASE + flags + extra)
                    lib.compare_runs(f"window, {tag}", one, got)
                b1 = lib.tiny_run(tmp, "window-bf16", 1, BASE + flags + ["--bf16"])
                b2 = lib.tiny_run(tmp, "window-bf16-ddp", 2, BASE + flags + ["--bf16"])
                # bf16: the data-parallel float32 sum order (test_mixed_precision.py), a bf16 step of the weights
                lib.compare_runs("window, bf16 (16-bit activations), DDP", b1, b2, tol=1e-4, wtol=4e-3)
                check("window in bf16: not the float32 run", b1[0] != one[0])

        # Llama: the query heads' layouts over the packed q | k | v (key/value heads repeated)
        llama = ["--model", "llama-tiny"]
        lone = {}
        for mode in ("window", "bigbird"):
            one = lone[mode] = lib.tiny_run(tmp, f"llama-{mode}", 1, BASE + llama + MODES[mode])
            got = lib.tiny_run(tmp, f"llama-{mode}-tp2sp", 2, BASE + llama + MODES[mode] +
                               ["--tensor-model-parallel-size", "2", "--sequence-parallel"])
            lib.compare_runs(f"llama, {mode}, TP 2 + SP", one, got)
        plain = lib.tiny_run(tmp, "llama-dense", 1, BASE + llama)
        check("llama: the window masks something (not dense attention's losses)", plain[0] != lone["window"][0])

        # 2. a window covering the sequence is dense attention
        for w in ("16", "40"):
            got = lib.tiny_run(tmp, f"window{w}", 1, BASE + ["--attention-window", w])
            check(f"--attention-window {w} (T=16): dense causal attention, bit for bit",
                  got[0] == dense[0] and all(lib.same_bits(got[1][k], dense[1][k]) for k in dense[1]))

        # 3. the JSON block
        cfg = os.path.join(tmp, "ds.json")
        with open(cfg, "w") as f:
            json.dump({"sparse_attention": {"mode": "variable", "block": 4, "local_window_blocks": [1, 2],
                                            "global_block_indices": [1], "global_block_end_indices": None,
                                            "attention": "unidirectional"}}, f)
        js = lib.tiny_run(tmp, "json", 1, BASE + ["--deepspeed-config", cfg])
        check("the sparse_attention JSON block (lists included) gives the flags' run, bit for bit",
              js[0] == single["variable"][0] and len(js[0]) == lib.STEPS)

        # 4. refusals
        for why, flags, needle in (
                ("a block that does not divide --seq-length", ["--attention-window", "8", "--sparse-block", "5"],
                 "block"),
                ("--attention-window beside --sparse-attention-mode",
                 ["--attention-window", "8", "--sparse-attention-mode", "fixed"], "--attention-window"),
                ("bidirectional attention", ["--sparse-attention-mode", "fixed", "--sparse-attention-direction",
                                             "bidirectional"], "bidirectional"),
                ("a list that does not parse", ["--sparse-attention-mode", "variable",
                                                "--sparse-local-window-blocks", "2,x"], "--sparse-local-window-blocks"),
                ("a list of more than 16 blocks", ["--sparse-attention-mode", "variable",
                                                   "--sparse-local-window-blocks", ",".join(["1"] * 17)],
                 "at most 16")):
            p = lib.loom("train", "--train-iters", "1", "--seq-length", "16", *flags)
            errs = lib.error_lines(p.stderr)
            check(f"{why}: exit 2, one line naming it", p.returncode == 2 and len(errs) == 1 and needle in errs[0],
                  p.stderr[-300:])

        bad = os.path.join(tmp, "bad.json")
        with open(bad, "w") as f:
            json.dump({"sparse_attention": {"mode": "variable", "local_window_blocks": [1, "two"]}}, f)
        p = lib.loom("train", "--train-iters", "1", "--seq-length", "16", "--deepspeed-config", bad)
        errs = lib.error_lines(p.stderr)
        check("a JSON list that is not integers: exit 2, one line naming its path",
              p.returncode == 2 and len(errs) == 1 and "sparse_attention.local_window_blocks" in errs[0] and
              "integers" in errs[0], p.stderr[-300:])

        # 5. convergence at T=512
        ends = {}
        for tag, extra in (("dense", []), ("window 128", ["--attention-window", "128"])):
            m = os.path.join(tmp, f"long-{tag.replace(' ', '')}.jsonl")
            lib.run_ranks(1, [lib.LOOM, "train", "--model", "gpt2-tiny", "--seq-length", "512",
                              "--max-position-embeddings", "512", "--micro-batch-size", "2", "--global-batch-size",
                              "2", "--train-iters", "300", "--log-interval", "1", "--eval-iters", "0", "--threads",
                              "2", "--metrics", m] + extra, timeout=2400)  # a hang guard only: 300 steps
            # took 161 s (dense) and 109 s (window) on an idle 2-core EPYC without AVX-512
            rows = lib.metrics_rows(m)
            ends[tag] = (float(np.mean([r["loss"] for r in rows[-20:]])), len(rows))
        (d, nd), (w, nw) = ends["dense"], ends["window 128"]
        check(f"T=512, window 128: final loss {w:.4f} against dense attention's {d:.4f} (within 2%)",
              nd == nw == 300 and abs(w - d) / d <= 0.02)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
