"""Tensor and sequence parallelism (Megatron's) keep the math.

Equivalence (lib.tiny_run and lib.compare_runs, as test_ddp.py and
test_zero.py: per-step loss over 20 steps within 1e-5 relative, and the final
weights assembled from every rank's pieces within 1e-5, a single tensor
within 4x what the reference's own reordering moves it when that is more:
lib.compare_runs says why) against one process
reaching the same global batch:
  - --tensor-model-parallel-size 2 and 4 (heads, c_attn's q/k/v columns, the
    MLP and the vocabulary split; 255 tokens split unevenly);
  - TP 2 x DP 2 under DDP and ZeRO-1, 2 and 3;
  - --sequence-parallel at TP 2 and 4, with TP 2 x DP 2 under ZeRO-3, and
    with full and selective recomputation;
  - TP 2 with an untied LM head and exact GELU (the vocab-parallel head of its own);
  - TP 2 x DP 2 with ZeRO-2 and clipping from a DeepSpeed JSON file;
  - TP 2 x DP 2 with ZeRO-3 starting from a weights file (each rank loads
    its part of every tensor);
  - fp16 (dynamic loss scaler) and bf16 under TP 2 against the same dtype
    in one process: within 1e-4, not bit for
    bit, since tensor parallelism changes the order of the float32 sums
    (partial products added by the all-reduce; the vocab-parallel softmax's
    sums), and a bf16 activation rounded from a value that moved by one
    float32 rounding can land one bf16 step (2^-8 relative) away; those
    flips average out in the loss to ~1e-5 (measured 4e-5 at worst), and
    leave the bf16 weights within a bf16 step (4e-3; measured 1.4e-3 for
    the worst tensor, 3.7e-4 for the whole model); at one TP degree, DP 2
    (DDP, ZeRO-2, ZeRO-3 with SP) gives the TP 2 bf16 run's within the same
    bounds (it reorders the float32 sum over micro-batches, as DDP does
    against one process);
    without --layout-invariant the TP 2 bf16 losses are not one process's
    bit for bit;
  - --layout-invariant 4 (every sum a layout splits taken in one order:
    tensor parallelism's in 4 pieces summed exactly, the micro-batches' in
    a binary tree): in bf16, TP 2 and 4, with and without SP, TP 2 x DP 2
    under DDP and ZeRO 1-3, and TP 2 + SP x DP 2 under ZeRO-3 with
    selective recomputation give one process's run bit for bit (every
    loss, every bit of every final weight); in float32 TP 2, TP 4 + SP and
    the last of those too;
  - a checkpoint saved under TP 2 x DP 2 resumes in one process, and one
    saved in one process resumes under TP 2 with SP, continuing with the
    uninterrupted run's losses (1e-5); `loom convert` exports the TP
    checkpoint to the same weights.
Each layer alone (tests/tools/gpt2_grads under mpirun with --tp, one
forward and backward from the same random weights and tokens): every tp
rank's logits and gradients are the slice, by the split rules written out
here independently of the model, of the one-process run's, within 1e-5
(relative L2), at TP 2 and 4 (uneven vocabulary), with and without SP, and
with an untied head, exact GELU and another eps; with --tp-invariant 4 on
both sides, bit for bit.
Memory (loom's accounting, GPT-2 124M, one step): parameter, gradient and
optimizer bytes per rank at TP 2 are half the one-process bytes within 5%
(the replicated position table, norms and row-parallel biases are 0.7% of
the model); SP at TP 2 saves at least 90% of the rows it stops holding
(each layer's two norm inputs and outputs, half of B*T*C floats each) in
activation bytes, the table of both printed.
Errors, each exit 2 and one line: heads not divisible by T, a world size T
does not divide, T larger than the world (--sequence-parallel without T > 1
is switched off with a line, as Megatron; tests/test_megatron_scripts.py),
a sequence length T does not divide under SP; --layout-invariant not a
multiple of T, not dividing the heads, with a 16-bit gradient reduction, or
with fp8.
"""
import json
import os
import sys
import tempfile

import numpy as np

import lib
from lib import check
from pyref import gpt2, st

GRADS = lib.tool("gpt2_grads")

BATCH = ["--global-batch-size", "8"]


def run(tmp, tag, n, extra):
    return lib.tiny_run(tmp, tag, n, BATCH + extra)


def equivalence(tmp):
    ref = run(tmp, "single", 1, ["--micro-batch-size", "1", "--vocab-size", "255"])
    for tp, n, extra in ((2, 2, []), (4, 4, []),
                         (2, 4, ["--zero-stage", "0"]), (2, 4, ["--zero-stage", "1"]),
                         (2, 4, ["--zero-stage", "2"]), (2, 4, ["--zero-stage", "3"])):
        tag = f"tp{tp}-np{n}" + (f"-zero{extra[1]}" if extra else "")
        got = run(tmp, tag, n, ["--micro-batch-size", "2", "--vocab-size", "255",
                                "--tensor-model-parallel-size", str(tp)] + extra)
        lib.compare_runs(tag, ref, got)
    for tp, n, extra in ((2, 2, []), (4, 4, []), (2, 4, ["--zero-stage", "3"]),
                         (2, 2, ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                 "--recompute-num-layers", "1"]),
                         (2, 2, ["--recompute-granularity", "selective"])):
        tag = f"sp-tp{tp}-np{n}" + (f"-{extra[0].lstrip('-')}-{extra[1]}" if extra else "")
        got = run(tmp, tag, n, ["--micro-batch-size", str(2 * n // tp), "--vocab-size", "255",
                                "--tensor-model-parallel-size", str(tp), "--sequence-parallel"] + extra)
        lib.compare_runs(tag, ref, got)
    # starting from a weights file (each rank takes its part of every tensor), ZeRO-3 over the dp ranks
    start = os.path.join(tmp, "start.safetensors")
    st.save(start, ref[1])
    ref_load = run(tmp, "single-load", 1, ["--micro-batch-size", "1", "--vocab-size", "255", "--load", start,
                                           "--num-attention-heads", "4"])
    lib.compare_runs("tp2-np4-zero3-from-load", ref_load, run(tmp, "tp2-load", 4, [
        "--micro-batch-size", "2", "--vocab-size", "255", "--load", start, "--num-attention-heads", "4",
        "--tensor-model-parallel-size", "2", "--zero-stage", "3"]))
    numerics = ["--untie-embeddings-and-output-weights", "--activation-function", "gelu"]
    ref_u = run(tmp, "single-untied", 1, ["--micro-batch-size", "1"] + numerics)
    lib.compare_runs("tp2-untied-gelu", ref_u, run(tmp, "tp2-untied", 2, [
        "--micro-batch-size", "2", "--tensor-model-parallel-size", "2"] + numerics))
    # the layout from a DeepSpeed JSON file: ZeRO-2 and clipping there, the tp size as a top-level key
    cfg = os.path.join(tmp, "ds.json")
    with open(cfg, "w") as f:
        json.dump({"zero_optimization": {"stage": 2}, "gradient_clipping": 0.5, "tensor_model_parallel_size": 2}, f)
    lib.compare_runs("tp2-np4-zero2-from-json", ref, run(tmp, "tp2-json", 4, [
        "--micro-batch-size", "2", "--vocab-size", "255", "--deepspeed-config", cfg]))
    # fp16 with its dynamic loss scaler: the overflow check is the gradient norm, summed over the tp group,
    # so every rank skips the same steps; fp16 weights: one step is 2^-11 = 4.9e-4 of an element, and a few
    # flipped roundings stay within two steps (measured 2.4e-4 for the worst tensor)
    ref_h = run(tmp, "single-fp16", 1, ["--micro-batch-size", "2", "--fp16"])
    lib.compare_runs("tp2-fp16", ref_h, run(tmp, "tp2-fp16", 2, [
        "--micro-batch-size", "2", "--fp16", "--tensor-model-parallel-size", "2"]), tol=1e-4, wtol=1e-3)
    # bf16 weights: a flipped rounding is one bf16 step, 2^-8 = 3.9e-3 of that element (see the top)
    ref_b = run(tmp, "single-bf16", 1, ["--micro-batch-size", "2", "--bf16"])
    tp2_b = run(tmp, "tp2-bf16", 2, ["--micro-batch-size", "2", "--bf16", "--tensor-model-parallel-size", "2"])
    lib.compare_runs("tp2-bf16", ref_b, tp2_b, tol=1e-4, wtol=4e-3)
    check("tp2-bf16 without --layout-invariant: not one process's losses bit for bit (what the flag changes)",
          tp2_b[0] != ref_b[0])
    # at one tensor-parallel degree, data parallelism, ZeRO and SP change no sample's arithmetic, only the
    # order of the step's float32 gradient sum over micro-batches ((g1+g2)+(g3+g4) across ranks against
    # ((g1+g2)+g3)+g4), as DDP against one process (test_mixed_precision.py): within the TP 2 bf16 run's bounds
    # above, against the TP 2 run (with OpenBLAS's Haswell kernels one weight flips a bf16 step by the last
    # step; with the SkylakeX kernels the runs happen to stay bit for bit)
    for tag, extra in (("tp2-dp2-bf16", []), ("tp2-dp2-zero2-bf16", ["--zero-stage", "2"]),
                       ("tp2-dp2-zero3-sp-bf16", ["--zero-stage", "3", "--sequence-parallel"])):
        got = run(tmp, tag, 4, ["--micro-batch-size", "2", "--bf16", "--tensor-model-parallel-size", "2"] + extra)
        lib.compare_runs(f"{tag} against the TP 2 bf16 run", tp2_b, got, tol=1e-4, wtol=4e-3)
    return ref


def invariant(tmp):
    """--layout-invariant 4: every layout with T dividing 4, and data
    parallelism over it, gives one process's bits, in bf16 and in float32."""
    base = ["--layout-invariant", "4", "--micro-batch-size", "2", "--vocab-size", "255"]
    tp2, tp4 = ["--tensor-model-parallel-size", "2"], ["--tensor-model-parallel-size", "4"]
    sp = ["--sequence-parallel"]
    layouts = [("TP 2", 2, tp2), ("TP 4", 4, tp4), ("TP 2 + SP", 2, tp2 + sp), ("TP 4 + SP", 4, tp4 + sp),
               ("TP 2 x DP 2", 4, tp2), ("TP 2 x DP 2, ZeRO-1", 4, tp2 + ["--zero-stage", "1"]),
               ("TP 2 x DP 2, ZeRO-2", 4, tp2 + ["--zero-stage", "2"]),
               ("TP 2 x DP 2, ZeRO-3", 4, tp2 + ["--zero-stage", "3"]),
               ("TP 2 + SP x DP 2, ZeRO-3, selective", 4, tp2 + sp + ["--zero-stage", "3", "--recompute-activations"])]
    for dtype, name, which in ((["--bf16"], "bf16", layouts), ([], "fp32", [layouts[i] for i in (0, 3, 8)])):
        ref = run(tmp, f"inv-single-{name}", 1, base + dtype)
        for tag, n, extra in which:
            lib.same_run(f"--layout-invariant {name}, {tag}", ref,
                         run(tmp, f"inv-{name}-{tag.replace(' ', '').replace(',', '-')}", n, base + dtype + extra))


def resume(tmp, ref):
    """TP 2 x DP 2 -> one process, and one process -> TP 2, from step 10 of 20."""
    first = ["--micro-batch-size", "1", "--vocab-size", "255", "--save-interval", "10"]
    for tag, n, save_flags, load_n, load_flags in (
            ("tp2dp2-to-1", 4, ["--tensor-model-parallel-size", "2", "--zero-stage", "1"], 1, []),
            ("1-to-tp2-sp", 1, [], 2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"])):
        run(tmp, f"{tag}-first", n, first + save_flags)
        at10 = os.path.join(tmp, f"{tag}-first", "iter_0000010")
        losses, weights, _ = run(tmp, tag, load_n, ["--micro-batch-size", "1", "--vocab-size", "255",
                                                    "--load", at10] + load_flags)
        worst = max(lib.rel(a, b) for a, b in zip(losses, ref[0][10:]))
        # another layout after the resume only reorders float32 sums: lib.compare_runs' 1e-5 for the loss
        check(f"{tag}: steps 11-20 after the resume are the uninterrupted run's (worst rel {worst:.1e}, tol 1e-5)",
              len(losses) == 10 and worst <= 1e-5, f"{losses} vs {ref[0][10:]}")
    # the TP checkpoint exported whole
    lib.check_export("a TP 2 x DP 2 checkpoint", os.path.join(tmp, "tp2dp2-to-1-first", "iter_0000010"),
                     os.path.join(tmp, "tp-export.safetensors"))


def part(name, full, T, r, C):
    """Rank r's part of tensor `name` (numpy, full shape) under T-way
    tensor parallelism: Megatron's rules for GPT-2, written out here."""
    def rows(n):
        return n * r // T, n * (r + 1) // T
    if name.endswith(("wte.weight", "lm_head.weight")):
        a, b = rows(full.shape[0])
        return full[a:b]
    if name.endswith("attn.c_attn.weight"):  # q, k and v columns of this rank's heads
        a, b = rows(C)
        return full.reshape(C, 3, C)[:, :, a:b].reshape(C, -1)
    if name.endswith("attn.c_attn.bias"):
        a, b = rows(C)
        return full.reshape(3, C)[:, a:b].reshape(-1)
    if name.endswith(("attn.c_proj.weight", "mlp.c_proj.weight")):  # row-parallel: input rows
        a, b = rows(full.shape[0])
        return full[a:b]
    if name.endswith(("mlp.c_fc.weight", "mlp.c_fc.bias")):  # column-parallel: output columns
        a, b = rows(full.shape[-1])
        return full[..., a:b]
    return full  # replicated: norms, wpe, row-parallel biases


def layers(tmp):
    """Each tp rank's logits and gradients against the slice of one process's."""
    L, C, NH, T, V, B = 2, 64, 4, 16, 97, 2
    cases = [("TP 2", 2, [], {}), ("TP 4", 4, [], {}), ("TP 2 + SP", 2, ["--sp", "1"], {}),
             ("TP 4 + SP", 4, ["--sp", "1"], {}),
             ("TP 2 + SP, untied head, exact GELU, eps 0.1", 2, ["--sp", "1"],
              {"eps": 0.1, "activation": "gelu", "untied": True})]
    for k, (tag, tp, flags, numerics) in enumerate(cases):
        cfg = gpt2.Config(L, C, NH, V, T, **numerics)
        weights = gpt2.perturbed_weights(cfg, 200 + k, matrix_scale=6.0)
        rows = np.random.default_rng(k).integers(0, V, size=(B, T + 1), dtype=np.int32)
        w, t = os.path.join(tmp, f"lw{k}.safetensors"), os.path.join(tmp, f"lt{k}.i32")
        st.save(w, weights, {"format": "pt"})
        rows.astype("<i4").tofile(t)
        opts = []
        if numerics:
            opts = ["--norm-eps", "0.1", "--activation", "gelu", "--untied", "1"]
        one, split = os.path.join(tmp, f"one{k}.safetensors"), os.path.join(tmp, f"tp{k}.safetensors")
        sizes = [L, C, NH, T, V, B]
        p = lib.run([GRADS, *opts, w, t, one, *sizes], timeout=300)
        q = lib.run_ranks(tp, [GRADS, *opts, "--tp", tp, *flags, w, t, split, *sizes], expect=None, tag=tag)
        if p.returncode or q.returncode:
            check(f"layers, {tag}: gpt2_grads ran", False, p.stderr[-500:] + q.stderr[-1500:])
            continue
        ref = st.load(one)
        worst, where = 0.0, ""
        for r in range(tp):
            got = st.load(f"{split}.rank{r}")
            a, b = V * r // tp, V * (r + 1) // tp
            pairs = [("logits", got["logits"], ref["logits"][..., a:b])]
            pairs += [(k2, got[k2], part(k2[5:], ref[k2], tp, r, C)) for k2 in ref if k2.startswith("grad.")]
            if sorted(got) != sorted(ref):
                worst, where = float("inf"), f"rank {r} tensors {sorted(set(got) ^ set(ref))}"
            for name, g, want in pairs:
                err = lib.rel_l2(g, want) if g.shape == want.shape else float("inf")
                if err > worst:
                    worst, where = err, f"{name} on rank {r}"
            lerr = abs(float(got["loss"][0]) - float(ref["loss"][0])) / abs(float(ref["loss"][0]))
            if lerr > worst:
                worst, where = lerr, f"loss on rank {r}"
        # TP splits sums of up to 4C = 256 terms into partial sums added by the all-reduce, in float32:
        # about u sqrt(K) = 1e-6 of a tensor's scale (u = 2^-24) whatever the order, so whatever the
        # thread count gpt2_grads runs at (unpinned) or the BLAS core; measured at most 1.1e-6 (TP 4 + SP,
        # attn.c_attn.bias), 9x under 1e-5. A wrong slice or a missing all-reduce errs by 1e-1 or more.
        check(f"layers, {tag}: every rank's logits and gradients are the one-process run's slice "
              f"(worst rel L2 {worst:.1e} at {where}, tol 1e-5)", worst <= 1e-5)
        # the split sums in 4 fixed pieces on both sides: the slices bit for bit
        inv = ["--tp-invariant", 4]
        p = lib.run([GRADS, *opts, *inv, w, t, one, *sizes], timeout=300)
        q = lib.run_ranks(tp, [GRADS, *opts, *inv, "--tp", tp, *flags, w, t, split, *sizes], expect=None,
                          tag=tag + " invariant")
        ref, bad = st.load(one), []
        for r in range(tp):
            got = st.load(f"{split}.rank{r}")
            a, b = V * r // tp, V * (r + 1) // tp
            pairs = [("logits", got["logits"], ref["logits"][..., a:b]), ("loss", got["loss"], ref["loss"])]
            pairs += [(k2, got[k2], part(k2[5:], ref[k2], tp, r, C)) for k2 in ref if k2.startswith("grad.")]
            bad += [f"{name} on rank {r}" for name, g, want in pairs if not np.array_equal(g, want)]
        check(f"layers, {tag}, --tp-invariant 4: every rank's logits and gradients are the slice bit for bit",
              p.returncode == 0 and q.returncode == 0 and not bad, f"{bad[:5]} {q.stderr[-500:]}")


def memory(tmp):
    """GPT-2 124M, one step: per-rank bytes at TP 2 (and with SP) against one process."""
    B, T, L, C = 2, 128, 12, 768
    flags = ["train", "--model", "gpt2", "--seq-length", str(T), "--micro-batch-size", str(B), "--global-batch-size",
             str(B), "--train-iters", "1", "--eval-iters", "0", "--log-interval", "1", "--threads", "1",
             "--data-path", os.path.join(tmp, "train.bin"), "--comm-timeout", "120"]
    rows = {}
    for key, n, extra in ((1, 1, []), (2, 2, ["--tensor-model-parallel-size", "2"]),
                          ("sp", 2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"])):
        metrics = os.path.join(tmp, f"mem-{key}.jsonl")
        lib.run_ranks(n, [lib.LOOM] + flags + extra + ["--metrics", metrics], tag=f"gpt2 124M {extra}", timeout=600)
        row = lib.metrics_rows(metrics)[-1]
        rows[key] = row.get("mem_by_rank") or [row["mem"]]
    print(f"GPT-2 124M, B={B} T={T}, activation MiB per rank: one process "
          f"{rows[1][0]['activations'] / 2**20:.1f}, TP 2 {rows[2][0]['activations'] / 2**20:.1f}, "
          f"TP 2 + SP {rows['sp'][0]['activations'] / 2**20:.1f} "
          f"({rows['sp'][0]['activations'] / rows[2][0]['activations']:.1%} of TP 2)")
    held = L * 4 * (B * T // 2) * C * 4  # bytes: ln1, res2, ln2, res3 per layer, half the rows each
    saved = min(rows[2][r]['activations'] - rows['sp'][r]['activations'] for r in range(2))
    check(f"SP at TP 2 saves {saved / 2**20:.1f} MiB of activations per rank, at least 90% of the "
          f"{held / 2**20:.1f} MiB of rows it no longer holds", saved >= 0.9 * held)
    for key in ("params", "grads", "optimizer"):
        one = rows[1][0][key]
        per = [r[key] for r in rows[2]]
        worst = max(abs(b - one / 2) / (one / 2) for b in per)
        check(f"GPT-2 124M, TP 2: {key} bytes per rank within 5% of half of one process's "
              f"({one / 2 / 2**20:.1f} MiB; got {', '.join(f'{b / 2**20:.1f}' for b in per)} MiB, worst {worst:.2%})",
              worst <= 0.05)


def errors(tmp):
    base = [lib.LOOM, "train", "--data-path", os.path.join(tmp, "train.bin")] + lib.TINY_MODEL + [
        "--train-iters", "1", "--comm-timeout", "30"]
    for tag, n, extra, words in (
            ("heads not divisible by T", 3, ["--tensor-model-parallel-size", "3"], ["--num-attention-heads 4",
                                                                                  "--tensor-model-parallel-size 3"]),
            ("a world T does not divide", 3, ["--tensor-model-parallel-size", "2"], ["3"]),
            ("T larger than the world", 2, ["--tensor-model-parallel-size", "4"], ["4", "2"]),
            ("a sequence T does not divide under SP", 2, ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                                                          "--seq-length", "15"], ["--seq-length 15", "2"]),
            ("--layout-invariant not a multiple of T", 2, ["--tensor-model-parallel-size", "2", "--layout-invariant",
                                                           "3"], ["--layout-invariant 3", "2"]),
            ("--layout-invariant not dividing the heads", 1, ["--layout-invariant", "8"],
             ["--num-attention-heads 4", "--layout-invariant 8"]),
            ("--layout-invariant with a 16-bit reduction", 1, ["--layout-invariant", "2", "--bf16",
                                                              "--grad-reduce-dtype", "bf16"],
             ["--layout-invariant", "--grad-reduce-dtype"]),
            ("--layout-invariant with fp8", 1, ["--layout-invariant", "2", "--bf16", "--fp8-format", "e4m3"],
             ["--layout-invariant", "--fp8-format"])):
        p = lib.run_ranks(n, base + extra, expect=None, tag=tag)
        lines = lib.error_lines(p.stderr)
        check(f"{tag}: exit 2, one line naming the sizes", p.returncode == 2 and len(lines) == 1 and
              all(w in lines[0] for w in words), p.stderr[-600:])
    # sampling runs in one process, whatever layout saved the checkpoint
    save = os.path.join(tmp, "tp2-np2")
    p = lib.loom("sample", "--load", save, "--prompt", "ab", "--max-new-tokens", "4",
                 "--tensor-model-parallel-size", "2")
    lines = lib.error_lines(p.stderr)
    check("loom sample with --tensor-model-parallel-size 2: exit 2, one line",
          p.returncode == 2 and len(lines) == 1 and "--tensor-model-parallel-size 2" in lines[0], p.stderr[-600:])
    p = lib.loom("sample", "--load", save, "--prompt", "ab", "--max-new-tokens", "4")
    check("loom sample of a TP 2 checkpoint in one process", p.returncode == 0, p.stderr[-600:])


def main():
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        layers(tmp)
        invariant(tmp)
        ref = equivalence(tmp)
        resume(tmp, ref)
        errors(tmp)
        memory(tmp)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
