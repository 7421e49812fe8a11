"""Mixed precision (--bf16, --fp16) end to end.

Policy under test: parameters and gradients are stored in the 16-bit dtype,
the optimizer keeps float32 master weights and moments (created from the
16-bit parameters, as DeepSpeed does), kernels compute in float32 with
activations rounded to the 16-bit dtype at their edges (and kept in it),
gradients are reduced in float32 and rounded once.

1. Every data-parallel layout (DDP bucketed, without overlap and naive,
   ZeRO 1-3, at 2 ranks; DDP and ZeRO-3 at 4) gives the single-process
   per-step loss under bf16 within 1e-4 relative. Every layout runs
   micro-batches of the same size (the single process accumulates 4 of
   them, 2 ranks 2 each, 4 ranks one): gradients are accumulated and reduced
   in float32 and rounded to bf16 once per step, so the layouts differ only
   by float32 summation order ((g1+g2)+(g3+g4) across ranks against
   ((g1+g2)+g3)+g4 in one process). Where two such float32 sums differ in
   their last bit, the one rounding to bf16 can land on neighbouring values:
   measured with OpenBLAS's Haswell kernels, after 3 steps exactly one
   weight of 34176 differs, by one bf16 ulp (2^-8 relative), and the loss
   then moves by up to 2.9e-5 over 20 steps (with the SkylakeX kernels the
   runs happen to stay bit for bit). An error of the kind this guards
   against is far larger: updates scaled by 3/4 (one micro-batch of four
   lost) move the loss by 6.8e-2. (With micro-batches of different
   sizes the BLAS takes other code paths, whose last-bit float32 differences
   can flip a bf16 rounding of an activation too: measured up to 5e-5.)
   How many roundings flip depends on the BLAS core and thread count (5.0e-5
   measured for the equal-size layouts on another machine, 2x under 1e-4),
   so a layout past 1e-4 is judged against lib.REORDER_FACTOR times what the
   single process's own reordering moves its loss (the same run with
   micro-batches of 4 and of 8, measured in the test). With
   --grad-reduce-dtype bf16 the sums over ranks are done in bf16 instead:
   within 1e-3 of the float32 reduction, and not equal to it. With
   --layout-invariant every one of those layouts (and ZeRO-2 on 4 ranks)
   gives one process's losses and gradient norms bit for bit, on the bf16
   units and with the products forced onto float32 sgemm.
2. bf16 training tracks float32: gpt2-tiny trained 400 steps to the end of
   a decayed schedule, the mean loss of the last 20 steps within 2%. (Mid
   schedule, this small model passes through loss plateaus whose timing
   shifts between any two rounding paths: at step 200, float32 runs on two
   BLAS kernels already differ by up to 10% on some seeds. At the end of the
   decay the runs measured within 2% across seeds 1-3 and 11 and both
   kernels; seed 11 within 0.2%.)
3. fp16 dynamic loss scaling: a huge initial scale (2^40) forces overflows;
   the scale halves (after hysteresis), overflow steps are skipped and
   counted, and after loss_scale_window clean steps it doubles. The scale
   and skip sequence loom reports equals what DeepSpeed's documented rules
   (re-implemented below) give for the same overflow pattern.
4. Model-state memory per rank under bf16 for ZeRO stages 0-3 within 5% of
   the ZeRO paper's 2Psi + 2Psi + 12Psi split per stage.
5. Non-finite values: a NaN weight makes the loss and every gradient NaN; by
   default the run stops at step 1 with one error line naming the step and
   the first block (in backward order) whose gradient went non-finite, on 1
   and on 2 ranks; with --on-nonfinite skip every step is skipped and counted.
6. Checkpoints keep mixed precision exact: bf16 (1 process, ZeRO-2 on 2
   ranks, ZeRO-1 with the optimizer state and master weights offloaded to
   NVMe) and fp16 (with its loss scaler state) resume bit for bit, and the
   master weights are stored as optimizer.master.<name>. Offloading changes
   no bit of a run.
7. Activations are kept in 16 bits: in GPT-2 124M at B=4, T=256 the bytes
   a layer keeps (the 2-layer model's activation peak minus the 1-layer
   model's: every layer keeps the same, and what is not a layer's cancels)
   are at most 51% of float32's under bf16 and fp16: half,
   plus the statistics that stay float32 (the norms' mean and rstd and the
   attention's log-sum-exp, a few floats a row against 16 C). The 2-layer
   model's whole ratio is printed: it is higher by the float32 staging that
   one layer's kernels use, whatever the depth, and the logits.
"""
import os
import shutil
import sys
import tempfile

import numpy as np

import lib
from lib import LOOM, check
from pyref import ckpt, st


def train(tmp, np_ranks, flags, tag, expect=0, model=lib.TINY_MODEL, env=lib.ENV):
    metrics = os.path.join(tmp, tag + ".jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [LOOM, "train", "--data-path", os.path.join(tmp, "train.bin")] + model + [
        "--global-batch-size", "8", "--train-iters", "20", "--lr", "3e-3", "--lr-warmup-iters", "3",
        "--lr-decay-iters", "20", "--clip-grad", "1.0", "--weight-decay", "0.1", "--log-interval", "1",
        "--eval-iters", "0", "--threads", "1", "--seed", "11", "--metrics", metrics, "--comm-timeout", "60"] + flags
    p = lib.run_ranks(np_ranks, cmd, expect=expect, tag=tag, timeout=600, env=env)
    return p, lib.metrics_rows(metrics)


def worst(a, b):
    return max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(a, b))


def reorder_bound(tmp, ref, fixed, cache={}):
    """fixed, or lib.REORDER_FACTOR times the loss's worst move when the
    single-process bf16 run ref sums in another order (micro-batches of 4
    and of 8 instead of 2; the same math) when that is larger: measured once,
    on this machine (see lib.REORDER_FACTOR). Returns (bound, note)."""
    if "noise" not in cache:
        moves = []
        for mb in (4, 8):
            _, rows = train(tmp, 1, ["--bf16", "--micro-batch-size", str(mb)], f"bf16-single-mb{mb}")
            moves.append(worst(rows, ref) if len(rows) == 20 else float("inf"))
        cache["noise"] = max(moves)
    bound = lib.REORDER_FACTOR * cache["noise"]
    if bound <= fixed:
        return fixed, ""
    return bound, f", {lib.REORDER_FACTOR}x the single process's own reordering {cache['noise']:.1e}"


def deepspeed_scales(overflows, initial, window, hysteresis, min_scale=1.0):
    """DeepSpeed's DynamicLossScaler.update_scale (deepspeed/runtime/fp16/
    loss_scaler.py, current version), step by step: the scale each step's
    backward used, given which steps overflowed. An overflow uses up one unit
    of hysteresis, or halves the scale (not below min_scale) when none is
    left; a clean step doubles it when the clean steps before it since the
    last overflow (cur_iter - last_overflow_iter - 1) are a positive multiple
    of the window, and refills hysteresis."""
    scale, hyst, last_overflow, used = initial, hysteresis, -1, []
    for it, overflow in enumerate(overflows):
        used.append(scale)
        if overflow:
            if hysteresis == 1 or hyst == 1:
                scale = max(scale / 2, min_scale)
            else:
                hyst -= 1
            last_overflow = it
        else:
            stable = it - last_overflow - 1
            if stable > 0 and stable % window == 0:
                hyst = hysteresis
                scale *= 2
    return used


def main():
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        # 1. layouts under bf16, all with micro-batches of 2 sequences
        _, ref = train(tmp, 1, ["--bf16", "--micro-batch-size", "2"], "bf16-single")
        cases = [("DDP", 2, []), ("DDP naive", 2, ["--ddp-impl", "naive"]), ("DDP without overlap", 2, ["--no-overlap"]),
                 ("ZeRO-1", 2, ["--zero-stage", "1"]), ("ZeRO-2", 2, ["--zero-stage", "2"]),
                 ("ZeRO-3", 2, ["--zero-stage", "3"]), ("DDP", 4, []),
                 ("ZeRO-3", 4, ["--zero-stage", "3", "--zero3-min-params", "3000"])]
        for name, n, flags in cases:
            _, rows = train(tmp, n, ["--bf16", "--micro-batch-size", "2"] + flags, f"bf16-{name}-{n}")
            w = worst(rows, ref) if len(rows) == 20 else 1.0
            bound, note = (1e-4, "") if w <= 1e-4 or w == 1.0 else reorder_bound(tmp, ref, 1e-4)
            check(f"bf16, {name} on {n} ranks ({4 // n} micro-batch(es) each): every step's loss within {bound:.2g}"
                  f"{note} of 1 process (worst {w:.1e})", w <= bound)

        # --layout-invariant: each micro-batch's gradient apart, summed in a binary tree, and the sums over
        # more than two ranks in the pairwise tree over the ranks: every layout is one process's run bit for
        # bit (every loss and gradient norm), on the bf16 units and with the products forced onto float32
        # sgemm (LOOM_BF16_UNITS=f32, whose float32 sums differ in their last bits from oneDNN's); on a CPU
        # without bf16 units the two are the same path, run once
        paths = ("auto", "f32") if lib.bf16_units("auto") != "f32" else ("f32",)
        if len(paths) == 1:
            print("     (no bf16 units on this CPU: its units are float32's, the one path below)")
        for units in paths:
            env = dict(lib.ENV, LOOM_BF16_UNITS=units)
            inv = ["--bf16", "--micro-batch-size", "2", "--layout-invariant", "1"]
            _, one = train(tmp, 1, inv, f"inv-{units}-single", env=env)
            for name, n, flags in cases + [("ZeRO-2", 4, ["--zero-stage", "2"])]:
                _, rows = train(tmp, n, inv + flags, f"inv-{units}-{name}-{n}", env=env)
                same = len(rows) == 20 and [(r["loss"], r["grad_norm"]) for r in rows] == [
                    (r["loss"], r["grad_norm"]) for r in one]
                check(f"bf16 --layout-invariant (units {units}), {name} on {n} ranks: every loss and gradient norm "
                      "bit for bit", same)

        # master weights and moments offloaded to a file: the same run, bit for bit
        _, off = train(tmp, 2, ["--bf16", "--micro-batch-size", "2", "--zero-stage", "2", "--offload-optimizer", "nvme",
                                "--nvme-path", tmp, "--offload-buffer-size", "0.004"], "bf16-offload")
        _, on = train(tmp, 2, ["--bf16", "--micro-batch-size", "2", "--zero-stage", "2"], "bf16-no-offload")
        check("bf16 ZeRO-2 with the optimizer state and master weights offloaded to NVMe: the same losses bit for bit",
              [r["loss"] for r in off] == [r["loss"] for r in on] and len(off) == 20)

        # 16-bit gradient reduction (--grad-reduce-dtype): each rank's sum rounded once, the sums
        # over ranks done in bf16; the loss tracks the float32 reduction to bf16 rounding of the
        # reduced gradients (1e-3 leaves room for 20 steps of it), and differs from it (the path is used)
        _, ref2 = train(tmp, 2, ["--bf16", "--micro-batch-size", "2"], "bf16-reduce-fp32")
        for name, flags in (("DDP", []), ("DDP naive", ["--ddp-impl", "naive"]), ("ZeRO-1", ["--zero-stage", "1"]),
                            ("ZeRO-2", ["--zero-stage", "2"]), ("ZeRO-3", ["--zero-stage", "3"])):
            _, rows = train(tmp, 2, ["--bf16", "--micro-batch-size", "2", "--grad-reduce-dtype", "bf16"] + flags,
                            f"bf16-reduce-{name}")
            w = worst(rows, ref2) if len(rows) == 20 else 1.0
            check(f"bf16 gradients reduced in bf16, {name} on 2 ranks: within 1e-3 of the fp32 reduction, not equal "
                  f"(worst {w:.1e})", 0 < w <= 1e-3)
        p, _ = train(tmp, 1, ["--grad-reduce-dtype", "bf16", "--micro-batch-size", "8"], "reduce-bad", expect=None)
        check("--grad-reduce-dtype bf16 without --bf16: exit 2 naming it",
              p.returncode == 2 and "--grad-reduce-dtype bf16" in p.stderr, p.stderr[-300:])

        # 2. bf16 tracks float32 to the end of a decayed schedule (400 steps)
        tiny = ["--model", "gpt2-tiny", "--train-iters", "400", "--lr-warmup-iters", "40", "--lr-decay-iters", "400",
                "--global-batch-size", "16", "--micro-batch-size", "16", "--log-interval", "1"]
        _, f32 = train(tmp, 1, tiny, "tiny-fp32", model=[])
        _, b16 = train(tmp, 1, tiny + ["--bf16"], "tiny-bf16", model=[])
        end32, end16 = np.mean([r["loss"] for r in f32[-20:]]), np.mean([r["loss"] for r in b16[-20:]])
        # 2%: measured 0.53% here (3.8x), up to 2% on other seeds and kernels (see the top). Where the
        # plateaus fall is set by rounding paths, so past 2% the bound is lib.REORDER_FACTOR times how far
        # float32 itself moves when it sums in another order (micro-batches of 8, two a step; measured 0.25%)
        bound, note = 0.02, ""
        if len(b16) == 400 and abs(end16 - end32) / end32 > 0.02:
            _, f32b = train(tmp, 1, tiny + ["--micro-batch-size", "8"], "tiny-fp32-mb8", model=[])
            spread = abs(np.mean([r["loss"] for r in f32b[-20:]]) - end32) / end32 if len(f32b) == 400 else 0.0
            if lib.REORDER_FACTOR * spread > bound:
                bound, note = lib.REORDER_FACTOR * spread, f" = {lib.REORDER_FACTOR}x float32's own {spread:.2%}"
        check(f"bf16 tracks fp32 over 400 steps: final loss {end16:.4f} vs {end32:.4f} (within {bound:.1%}{note})",
              len(b16) == 400 and abs(end16 - end32) / end32 <= bound)

        # 3. fp16 loss scaling with forced overflows
        window, hyst = 4, 2
        _, rows = train(tmp, 1, ["--fp16", "--micro-batch-size", "8", "--initial-loss-scale", str(2 ** 36),
                                 "--loss-scale-window", str(window), "--hysteresis", str(hyst), "--train-iters", "50",
                                 "--lr-decay-iters", "50"], "fp16")
        used = [r["loss_scale"] for r in rows]
        over = [r["skipped"] == 1 for r in rows]
        want = deepspeed_scales(over, 2.0 ** 36, window, hyst)
        first = next((i for i, (a, b) in enumerate(zip(used, want)) if a != b), None)
        check("fp16: the loss scale of every step follows DeepSpeed's rules for the overflows seen",
              len(rows) == 50 and used == want, f"first difference at step {first}: loom {used}, rules {want}")
        check(f"fp16: overflows skipped and counted ({sum(over)} of 50), the scale halved and grew again",
              sum(over) >= 3 and rows[-1]["skipped_total"] == sum(over) and min(used) < 2 ** 36
              and any(b > a for a, b in zip(used, used[1:])))
        check("fp16: the loss falls once the scale fits", rows[-1]["loss"] < rows[0]["loss"] - 0.3)
        first = next(r for r in rows if not r["skipped"])
        check(f"fp16: skipped steps do not advance the schedule: the first update (step {first['step']}) has step 1's lr",
              abs(first["lr"] - 3e-3 / 3) < 1e-9, f"lr {first['lr']}")

        # 4. model-state memory per rank, bf16, 2 ranks
        n = 2
        p, _ = train(tmp, 1, ["--micro-batch-size", "8", "--train-iters", "1"], "count")
        psi = psi_of(p.stdout)
        for stage in range(4):
            _, rows = train(tmp, n, ["--bf16", "--micro-batch-size", "4", "--zero-stage", str(stage),
                                     "--train-iters", "2"], f"mem{stage}")
            want = {0: (2, 2, 12), 1: (2, 2, 12 / n), 2: (2, 2 / n, 12 / n), 3: (2 / n, 2 / n, 12 / n)}[stage]
            bad = []
            for r, row in enumerate(rows[-1]["mem_by_rank"]):
                for key, per in zip(("params", "grads", "optimizer"), want):
                    if abs(row[key] - per * psi) > 0.05 * per * psi:
                        bad.append(f"rank {r} {key} {row[key]} vs {per * psi:.0f}")
            check(f"bf16 ZeRO-{stage} on {n} ranks: params, grads, optimizer bytes per rank within 5% of "
                  f"{want[0]:g}/{want[1]:g}/{want[2]:g} x Psi (Psi = {psi})", not bad, "; ".join(bad))

        # memory does not grow from step to step (the float32 working copies go back to the pool)
        for stage in (0, 3):
            _, rows = train(tmp, 2, ["--bf16", "--micro-batch-size", "4", "--zero-stage", str(stage), "--train-iters", "8"],
                            f"steady{stage}")
            totals = [r["mem"]["total"] for r in rows[1:]]
            check(f"bf16 ZeRO-{stage} on 2 ranks: the same peak memory at every step after the first",
                  len(set(totals)) == 1, str(totals))

        # 5. non-finite values
        weights = os.path.join(tmp, "nan.safetensors")
        _, _ = train(tmp, 1, ["--micro-batch-size", "8", "--train-iters", "1", "--save", os.path.join(tmp, "w")], "w")
        w = ckpt.weights(os.path.join(tmp, "w"))
        w["h.1.mlp.c_fc.bias"][3] = np.nan
        st.save(weights, w)
        for n in (1, 2):
            for prec in ([], ["--bf16"]):
                p, rows = train(tmp, n, prec + ["--micro-batch-size", str(8 // n), "--load", weights], "nan",
                                expect=None)
                lines = lib.error_lines(p.stderr)
                check(f"NaN weight, {'bf16' if prec else 'fp32'}, {n} rank(s): exit 1 at step 1, one line naming the step and block",
                      p.returncode == 1 and len(lines) == 1 and "step 1" in lines[0] and "block 3 (ln_f.weight)" in lines[0],
                      p.stderr[-400:])
        p, rows = train(tmp, 2, ["--bf16", "--micro-batch-size", "4", "--load", weights, "--on-nonfinite", "skip",
                                 "--train-iters", "3"], "nan-skip", expect=None)
        check("--on-nonfinite skip: every step skipped and counted, exit 0",
              p.returncode == 0 and [r["skipped"] for r in rows] == [1, 1, 1] and rows[-1]["skipped_total"] == 3,
              p.stderr[-300:])

        # 6. checkpoints under mixed precision resume exactly
        for name, n, flags in (("bf16, 1 process", 1, ["--bf16", "--micro-batch-size", "8"]),
                               ("bf16, ZeRO-2 on 2 ranks", 2, ["--bf16", "--micro-batch-size", "4", "--zero-stage", "2"]),
                               ("bf16, ZeRO-1 on 2 ranks with NVMe offload", 2,
                                ["--bf16", "--micro-batch-size", "4", "--zero-stage", "1", "--offload-optimizer", "nvme",
                                 "--nvme-path", tmp, "--offload-buffer-size", "0.004"]),
                               ("fp16 with loss scaling", 1, ["--fp16", "--micro-batch-size", "8",
                                                              "--initial-loss-scale", str(2 ** 20),
                                                              "--loss-scale-window", "3"])):
            full_dir, cut_dir = os.path.join(tmp, "full"), os.path.join(tmp, "cut")
            for d in (full_dir, cut_dir):
                shutil.rmtree(d, ignore_errors=True)
            _, full = train(tmp, n, flags + ["--save", full_dir], "full")
            _, a = train(tmp, n, flags + ["--save", cut_dir, "--train-iters", "10"], "cut1")
            _, b = train(tmp, n, flags + ["--save", cut_dir, "--load", cut_dir], "cut2")
            key = lambda rows: [(r["step"], r["loss"], r.get("loss_scale")) for r in rows]  # noqa: E731
            x, y = ckpt.assemble(full_dir), ckpt.assemble(cut_dir)
            same = not lib.differing(x, y)
            check(f"{name}: 10 + resume + 10 steps is the 20-step run bit for bit (losses, scales, all tensors)",
                  key(a + b) == key(full) and same)
            check(f"{name}: the checkpoint stores the master weights", any(k.startswith("optimizer.master.") for k in x))

        # 7. activations kept in 16 bits: GPT-2 124M at B=4, T=256, peak activation bytes (loom's accounting)
        act = {}
        for layers in (2, 1):
            gpt2 = ["--model", "gpt2", "--seq-length", "256", "--num-layers", str(layers)]
            for prec in ("fp32", "bf16", "fp16"):
                flags = ["--micro-batch-size", "4", "--global-batch-size", "4", "--train-iters", "1"]
                _, rows = train(tmp, 1, flags + ([] if prec == "fp32" else ["--" + prec]), f"act-{prec}-{layers}",
                                model=gpt2)
                act[prec, layers] = rows[-1]["mem"]["activations"] if rows else float("nan")
        layer = {p: act[p, 2] - act[p, 1] for p in ("fp32", "bf16", "fp16")}
        for prec in ("bf16", "fp16"):
            ratio = layer[prec] / layer["fp32"]
            check(f"GPT-2 124M, B=4, T=256: a {prec} layer keeps {layer[prec] / 2**20:.2f} MiB, at most 51% of "
                  f"float32's {layer['fp32'] / 2**20:.2f} MiB ({100 * ratio:.2f}%; the whole 2-layer model "
                  f"{100 * act[prec, 2] / act['fp32', 2]:.1f}%)", ratio <= 0.51)
    return lib.verdict()


def psi_of(stdout):
    """The parameter count from loom's 'model: ...: N parameters' line."""
    line = next(l for l in stdout.splitlines() if l.startswith("model:"))
    return int(line.split(" parameters")[0].split()[-1])


if __name__ == "__main__":
    sys.exit(main())
