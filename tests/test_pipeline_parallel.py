"""Pipeline parallelism (Megatron's and DeepSpeed's) keeps the math.

Equivalence (lib.tiny_run and lib.compare_runs, as test_ddp.py and
test_tensor_parallel.py: per-step loss over 20 steps within 1e-5 relative,
and the final weights assembled from every rank's pieces within 1e-5, a
single tensor within 4x what the reference's own reordering moves it when
that is more: lib.compare_runs says why)
against one process reaching the same global batch of 8 by accumulation, on
an 8-layer model:
  - --pipeline-model-parallel-size 2 and 4 with each schedule: 1f1b, gpipe,
    interleaved (--num-layers-per-virtual-pipeline-stage: 2 chunks a stage);
  - uneven stages (--decoder-first-pipeline-num-layers 1), full
    recomputation per stage, an untied LM head;
  - P 2 x T 2, with and without --sequence-parallel; P 2 x T 2 x DP 2 (8
    ranks) with --use-distributed-optimizer;
    P 2 x DP 2 under ZeRO-2 from a DeepSpeed JSON file, and under ZeRO-3.
Mixed precision, against one process in the same dtype:
  - P 2 under bf16 and fp16 with an untied head: bit for bit (losses and
    weights). A stage runs the same kernels on the same micro-batches.
  - P 2 under fp16 with the tied table: within 1e-4 of the loss and two
    fp16 steps of the weights (1e-3). The table's gradient is summed in
    float32 and rounded once, as one process rounds it, but as the head
    stage's share over the step plus the lookup's, not micro-batch by
    micro-batch: a last-bit difference can flip one rounding.
  - (the untied head from here on) P 2 x DP 2 with the distributed
    optimizer under bf16: within 1e-4 of the
    loss and one bf16 step of the weights (4e-3), for the data-parallel
    reason test_mixed_precision.py gives (ranks sum float32 gradients in
    another order; a last-bit difference can flip one bf16 rounding).
  - P 2 x T 2 x DP 2 with the distributed optimizer under bf16: within 1e-4
    and 4e-3 of one process, for tensor parallelism's reason
    (test_tensor_parallel.py: partial products summed by the all-reduce),
    and bit for bit (losses and weights) T 2 x DP 2 with the distributed
    optimizer in bf16 on the same micro-batches: pipelining adds no rounding.
  - With --layout-invariant 2 (the sums every layout splits in one order;
    the head's share of the tied table sent every micro-batch), P 2 x T 2 x
    DP 2 with the distributed optimizer, P 4 interleaved and P 2 x DP 2
    under ZeRO-3 give one process's run bit for bit in bf16, the first two
    in float32 too.
Resume: a checkpoint saved at step 10 under P 2 x T 2 continues in one
process and under DP 2 x ZeRO-3 with the uninterrupted run's losses (1e-5);
`loom convert` exports it whole (the assembled tensors, bit for bit).
Memory: the measured per-stage activation peak (loom's accounting) is
F + k S for stage s, where k is the micro-batches the schedule keeps in
flight there: all m under GPipe, min(P - s, m) under 1F1B; F and S (a
stage's fixed and per-micro-batch activation bytes) are fitted per stage
from GPipe at m = 4 and m = 8, and 1F1B at m = 8 must match within 1%.
The schedules' order, in-flight counts, deadlock-freedom and bubbles are
tests/test_schedule.c's; the measured bubble is bench/pipeline.py's.
The dry run prints the stage map.
Errors, each exit 2 and one line: more stages than layers, interleaved
micro-batches not a multiple of P, virtual stages that do not divide the
layers, a world that P x T does not divide, first/last stage layers that
leave none for the others or without pipelining, the distributed optimizer with ZeRO-3, loom
sample with P > 1.
"""
import json
import os
import sys
import tempfile

import lib
from lib import check

L8 = ["--global-batch-size", "8", "--num-layers", "8", "--micro-batch-size", "1"]
PP2 = ["--pipeline-model-parallel-size", "2"]
PP4 = ["--pipeline-model-parallel-size", "4"]


def run(tmp, tag, n, extra):
    return lib.tiny_run(tmp, tag, n, L8 + extra)


def equivalence(tmp, ref):
    cases = [
        ("pp2-1f1b", 2, PP2),
        ("pp2-gpipe", 2, PP2 + ["--pipeline-schedule", "gpipe"]),
        ("pp2-interleaved", 2, PP2 + ["--num-layers-per-virtual-pipeline-stage", "2"]),
        ("pp4-1f1b", 4, PP4),
        ("pp4-gpipe", 4, PP4 + ["--pipeline-schedule", "gpipe"]),
        ("pp4-interleaved", 4, PP4 + ["--pipeline-schedule", "interleaved",
                                      "--num-layers-per-virtual-pipeline-stage", "1"]),
        ("pp2-first1", 2, PP2 + ["--decoder-first-pipeline-num-layers", "1"]),
        ("pp2-recompute-full", 2, PP2 + ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                         "--recompute-num-layers", "2"]),
        ("pp2-tp2", 4, PP2 + ["--tensor-model-parallel-size", "2"]),
        ("pp2-tp2-sp", 4, PP2 + ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
        ("pp2-tp2-dp2-distopt", 8, PP2 + ["--tensor-model-parallel-size", "2", "--use-distributed-optimizer"]),
        ("pp2-dp2-zero3", 4, PP2 + ["--zero-stage", "3"]),
    ]
    for tag, n, extra in cases:
        lib.compare_runs(tag, ref, run(tmp, tag, n, extra))
    ds = os.path.join(tmp, "zero2.json")
    with open(ds, "w") as f:
        json.dump({"zero_optimization": {"stage": 2}, "gradient_clipping": 0.5}, f)
    lib.compare_runs("pp2-dp2-zero2-json", ref, run(tmp, "pp2-dp2-zero2-json", 4, PP2 + ["--deepspeed-config", ds]))
    untied = ["--untie-embeddings-and-output-weights"]
    lib.compare_runs("pp2-untied", run(tmp, "single-untied", 1, untied), run(tmp, "pp2-untied", 2, PP2 + untied))


def mixed_precision(tmp):
    untied = ["--untie-embeddings-and-output-weights"]
    ones = {}
    for dt in ("--bf16", "--fp16"):
        one = ones[dt] = run(tmp, f"single-untied{dt}", 1, [dt] + untied)
        got = run(tmp, f"pp2-untied{dt}", 2, PP2 + [dt] + untied)
        same = got[0] == one[0] and sorted(got[1]) == sorted(one[1]) and all(
            lib.same_bits(got[1][k], one[1][k]) for k in one[1])
        check(f"pp2 {dt}, untied head: every step's loss and every final weight are one process's, bit for bit",
              same, f"{got[0]} vs {one[0]}")
    # a tied table: its float32 gradient is the head stage's share summed over the micro-batches plus the
    # lookup's, where one process adds both micro-batch by micro-batch; the one rounding to 16 bits of two
    # float32 sums that differ in their last bit can land a step apart (fp16: 2^-11 = 4.9e-4 of an element;
    # measured with OpenBLAS's Haswell kernels, one element of the table after 20 steps: the table 1.0e-6
    # relative L2, the whole model 8e-8). --layout-invariant sends each micro-batch's share on its own and gives the bits (below).
    lib.compare_runs("pp2-fp16", run(tmp, "single--fp16", 1, ["--fp16"]), run(tmp, "pp2--fp16", 2, PP2 + ["--fp16"]),
                     tol=1e-4, wtol=1e-3)
    # the untied head from here on, so that the bit-for-bit check below holds for the reason it names
    one = ones["--bf16"]
    # data parallelism's float32 sum order (test_mixed_precision.py): within 1e-4, weights one bf16 step
    lib.compare_runs("pp2-dp2-distopt-bf16", one, run(tmp, "pp2-dp2-distopt-bf16", 4,
                                                      PP2 + ["--bf16", "--use-distributed-optimizer"] + untied),
                     tol=1e-4, wtol=4e-3)
    # tensor parallelism's partial sums (test_tensor_parallel.py): within 1e-4, the whole model's weights one
    # bf16 step (2^-8 = 3.9e-3). A single small tensor may drift further: over 8 layers and 20 steps, an
    # element whose gradient is near zero can take Adam's step (about lr, whatever the gradient's size) the
    # other way once a flipped rounding changes the gradient's sign. Measured with the bf16 products on the
    # AVX512-BF16 units (tied head): 1.27e-2 for h.5.attn.c_attn.bias (one of its 64 elements, 0.0076 against
    # 0.0087), whole model 1.1e-3; every other tensor within 7.2e-3. PP itself changes no bit (the T 2 x DP 2
    # check below).
    # 2e-2 is 1.6x that tensor: how many roundings flip depends on the BLAS core and thread count, so a tensor
    # past it is judged against lib.REORDER_FACTOR times the reference's own reordering (lib.compare_runs).
    three_d = run(tmp, "pp2-tp2-dp2-distopt-bf16", 8,
                  PP2 + ["--bf16", "--tensor-model-parallel-size", "2", "--use-distributed-optimizer"] + untied)
    lib.compare_runs("pp2-tp2-dp2-distopt-bf16", one, three_d, tol=1e-4, wtol=4e-3, tensor_tol=2e-2)
    two_d = run(tmp, "tp2-dp2-distopt-bf16", 4,
                ["--bf16", "--tensor-model-parallel-size", "2", "--use-distributed-optimizer"] + untied)
    same = three_d[0] == two_d[0] and all(lib.same_bits(three_d[1][k], two_d[1][k]) for k in two_d[1])
    check("pp2-tp2-dp2-distopt-bf16: every step's loss and final weight are T 2 x DP 2's, bit for bit", same,
          f"{three_d[0]} vs {two_d[0]}")
    # --layout-invariant: the sums every layout splits in one order; P x T x DP is one process bit for bit
    inv = ["--layout-invariant", "2"]
    for dt in ("--bf16", ""):
        name = dt.lstrip("-") or "fp32"
        dts = [dt] if dt else []
        one = run(tmp, f"inv-single-{name}", 1, inv + dts)
        cases = [("P 2 x T 2 x DP 2, distributed optimizer", 8,
                  PP2 + ["--tensor-model-parallel-size", "2", "--use-distributed-optimizer"]),
                 ("P 4, interleaved", 4, PP4 + ["--num-layers-per-virtual-pipeline-stage", "1"]),
                 ("P 2 x DP 2, ZeRO-3", 4, PP2 + ["--zero-stage", "3"])]
        for tag, n, extra in cases if dt else cases[:2]:
            lib.same_run(f"--layout-invariant {name}, {tag}", one,
                         run(tmp, f"inv-{name}-{n}-{extra[-1]}", n, inv + dts + extra))


def resume(tmp, ref):
    """P 2 x T 2 saved at step 10 -> one process, and -> DP 2 x ZeRO-3."""
    run(tmp, "pp2tp2-first", 4, PP2 + ["--tensor-model-parallel-size", "2", "--save-interval", "10"])
    at10 = os.path.join(tmp, "pp2tp2-first", "iter_0000010")
    for tag, n, flags in (("pp2tp2-to-1", 1, []), ("pp2tp2-to-dp2-zero3", 2, ["--zero-stage", "3"])):
        losses, _, _ = run(tmp, tag, n, ["--load", at10] + flags)
        worst = max((lib.rel(a, b) for a, b in zip(losses, ref[0][10:])), default=1.0)
        # another layout after the resume only reorders float32 sums: lib.compare_runs' 1e-5 for the loss
        check(f"{tag}: steps 11-20 after the resume are the uninterrupted run's (worst rel {worst:.1e}, tol 1e-5)",
              len(losses) == 10 and worst <= 1e-5, f"{losses} vs {ref[0][10:]}")
    lib.check_export("a P 2 x T 2 checkpoint", at10, os.path.join(tmp, "pp-export.safetensors"))


def stage_activations(tmp, tag, P, m, schedule):
    """Each stage's peak activation bytes (its first rank's) after a short run."""
    metrics = os.path.join(tmp, f"{tag}.jsonl")
    cmd = [lib.LOOM, "train", "--data-path", os.path.join(tmp, "train.bin")] + lib.TINY_MODEL + [
        "--num-layers", "8", "--micro-batch-size", "1", "--global-batch-size", str(m), "--train-iters", "2",
        "--eval-iters", "0", "--threads", "1", "--metrics", metrics, "--pipeline-model-parallel-size", str(P),
        "--pipeline-schedule", schedule]
    lib.run_ranks(P, cmd, tag=tag)
    rows = [r for r in lib.metrics_rows(metrics) if "pipeline" in r]
    return [s["activations"] for s in rows[-1]["pipeline"]["stages"]] if rows else None


def memory(tmp):
    P = 4
    g4 = stage_activations(tmp, "gpipe-m4", P, 4, "gpipe")
    g8 = stage_activations(tmp, "gpipe-m8", P, 8, "gpipe")
    f8 = stage_activations(tmp, "1f1b-m8", P, 8, "1f1b")
    if not (g4 and g8 and f8):
        check("per-stage activation peaks in the metrics", False)
        return
    print(f"    activation peak per stage (bytes), P={P}:")
    print(f"    {'stage':>5} {'gpipe m=4':>10} {'gpipe m=8':>10} {'1f1b m=8':>10} {'per micro':>10} {'fixed':>10}"
          f" {'1f1b slots':>10}")
    ok = True
    for s in range(P):
        per = (g8[s] - g4[s]) / 4
        fixed = g4[s] - 4 * per
        k = min(P - s, 8)
        want = fixed + k * per
        print(f"    {s:5d} {g4[s]:10.0f} {g8[s]:10.0f} {f8[s]:10.0f} {per:10.0f} {fixed:10.0f} {k:10d}")
        ok = ok and per > 0 and abs(f8[s] - want) <= 0.01 * want
    check("1F1B holds min(P - s, m) micro-batches of activations on stage s, GPipe all m (fitted within 1%)",
          ok)
    check("1F1B's first stage holds fewer activation bytes than GPipe's", f8[0] < g8[0], f"{f8[0]} vs {g8[0]}")


def dry_run():
    p = lib.run_ranks(4, [lib.LOOM, "train", "--dry-run"] + lib.TINY_MODEL + [
        "--num-layers", "8", "--global-batch-size", "8", "--micro-batch-size", "1"] + PP2 + [
        "--tensor-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "2"], tag="dry-run")
    want = ["stage 0 (ranks 0-1): embedding, layers 0-1; layers 4-5",
            "stage 1 (ranks 2-3): layers 2-3; layers 6-7, final norm, LM head and loss"]
    check("--dry-run prints the stage map", all(w in p.stdout for w in want), p.stdout[-600:])


def errors(tmp):
    data = ["--data-path", os.path.join(tmp, "train.bin"), "--train-iters", "1"]
    cases = [
        ("more stages than layers", 4, PP4 + ["--num-layers", "2"], "every stage needs a layer"),
        ("interleaved micro-batches not a multiple of P", 2,
         PP2 + ["--num-layers", "8", "--num-layers-per-virtual-pipeline-stage", "2", "--global-batch-size", "3",
                "--micro-batch-size", "1"], "multiple of --pipeline-model-parallel-size 2"),
        ("virtual stages that do not divide the layers", 2,
         PP2 + ["--num-layers", "8", "--num-layers-per-virtual-pipeline-stage", "3"], "not divisible"),
        ("a world P x T does not divide", 3, PP2, "not divisible by tensor-parallel size 1 x pipeline"),
        ("first and last stage layers leave none for the others", 2,
         PP2 + ["--num-layers", "8", "--decoder-first-pipeline-num-layers", "4",
                "--decoder-last-pipeline-num-layers", "2"], "none may be left over"),
        ("first stage layers without pipelining", 1, ["--decoder-first-pipeline-num-layers", "1"],
         "need --pipeline-model-parallel-size 2 or more"),
        ("the distributed optimizer with ZeRO-3", 2, PP2 + ["--num-layers", "8", "--use-distributed-optimizer",
                                                             "--zero-stage", "3"], "ZeRO-1"),
    ]
    for what, n, flags, text in cases:
        p = lib.run_ranks(n, [lib.LOOM, "train"] + data + lib.TINY_MODEL + flags, expect=2, tag=what)
        lines = lib.error_lines(p.stderr)
        check(f"error: {what}: exit 2, one line", p.returncode == 2 and len(lines) == 1 and text in lines[0],
              p.stderr[-400:])
    p = lib.loom("sample", "--load", os.path.join(tmp, "pp2tp2-first"), "--pipeline-model-parallel-size", "2")
    lines = lib.error_lines(p.stderr)
    check("error: loom sample with P > 1: exit 2, one line",
          p.returncode == 2 and len(lines) == 1 and "pipeline-model-parallel-size" in lines[0], p.stderr)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        ref = run(tmp, "single", 1, [])
        equivalence(tmp, ref)
        mixed_precision(tmp)
        resume(tmp, ref)
        memory(tmp)
        dry_run()
        errors(tmp)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
