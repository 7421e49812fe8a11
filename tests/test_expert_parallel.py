#!/usr/bin/env python3
"""Expert parallelism (--expert-model-parallel-size, with Megatron's two
token dispatchers, --moe-token-dispatcher-type alltoall and allgather)
against one process.

Each case trains mixtral-tiny cut to 4 layers of 64 channels with 4
experts (top 2, Megatron's balancing and z losses on) for lib.STEPS steps
on the built-in corpus with the same global batch and micro-batches of 2,
and compares every step's loss and the final weights (read back from the
saved checkpoint, every expert in it once) with the one-process run by
lib.compare_runs (1e-5 in float32: an expert's rows arrive from every rank
in rank order, so its weight gradient sums them in another order, and the
dense gradients reduce over the data-parallel group as under DDP; its
docstring gives the measurement):

  - each dispatcher: EP 2 on 2 ranks (each rank one data-parallel replica
    of the dense layers and half the experts), EP 2 x DP 2 on 4 ranks (the
    experts' gradients summed over the 2 ranks that hold them), EP 4 on 4
    ranks (one expert a rank), EP 2 x PP 2 (each stage's layers' experts
    over the stage's expert group), and EP 2 with full recomputation (the
    recomputed forward moves the tokens again): the EP 2 run's bits;
  - GPT-2 with dense experts (biases: four tensors an expert; its tied
    table) at EP 2 x DP 2; Llama with shared experts in every other layer
    and Hugging Face's balancing loss at EP 2 x DP 2 with allgather;
  - EP 2 under a capacity (--moe-expert-capacity-factor 1, dropping by
    probs and by position, and by position padded to the capacity, the
    last with both dispatchers): a
    rank's capacity is its own micro-batch's, as one process's is each
    micro-batch's, so the same choices drop. (A drop is discrete: two
    choices whose weights tie within float32's reordering at the capacity's
    edge may drop the other way, moving that step's loss by about 1e-5;
    measured once, padded by probs, at step 19 of 20. Dropping by position
    has no such ties.)
  - bf16 EP 2 x DP 2 at lr 0 (lib.same_steps_at_lr0 says why): every
    step's loss within 1e-5 and gradient norm within 2e-3;
  - the experts' statistics: tokens per expert and the balancing loss in
    the metrics of EP 2 x DP 2 are one process's within 1e-5 (the routing
    is each rank's own, summed over the ranks as over micro-batches);
  - memory: a rank's parameter bytes at EP 2 are the dense tensors' and
    half the experts' (loom's accounting, exactly); the optimizer state at
    EP 2 x DP 2 under
    ZeRO-1 and ZeRO-3 and at EP 2 under ZeRO-3 on 2 ranks is every
    element's once over the ranks, an even part a rank, dense tensors
    included (each expert rank steps a share of its shard's dense
    elements, as Megatron shards the dense optimizer state over all data
    ranks), and under ZeRO-3 the reduced gradients' and the parameters'
    shards too;
  - ZeRO over the ranks that hold the same experts: ZeRO-1, ZeRO-2,
    ZeRO-3 and the distributed optimizer at EP 2 x DP 2, ZeRO-3 with the
    allgather dispatcher and on 2 ranks, against one process within 1e-5;
  - a Hugging Face directory (the one-process run converted; trained with
    Megatron's balancing loss, which config.json cannot state and loom's
    metadata does) loads under EP 2 x DP 2, each rank its own experts: 5
    steps are one process's;
  - checkpoints stay layout-free: an EP 2 run's checkpoint at step 10
    resumed in one process, one process's resumed under EP 2 x DP 2,
    EP 2 x DP 2 ZeRO-3's under EP 4, and EP 4 ZeRO-3's (the dense state in
    four shares) under EP 2 x DP 2 ZeRO-3: the remaining steps against
    the uninterrupted run.

Experts under tensor parallelism (each expert's columns split as a dense
MLP's, the router replicated): TP 2 and TP 2 + SP alone; TP 2 + SP x EP 2
with both dispatchers, ZeRO-3, full recomputation and a padded capacity;
GPT-2's experts (their biases) at TP 2 x EP 2; Llama's shared experts at
TP 2 + SP x EP 2; a TP 2 + SP x EP 2 checkpoint resumed in one process and
a Hugging Face directory loaded there. Under context parallelism (the
balancing losses and the z-loss over the whole micro-batch): CP 2 p2p and
a2a, CP 2 x EP 2, CP 2 x TP 2 + SP with all_gather, Llama's
hf_aux_loss at CP 2 x EP 2. All against one process within 1e-5.

So that the comparisons can fail: a run whose experts see other rows (EP 2
with micro-batches of 1) is checked at least 10x the bound away.

--layout-invariant 2 (invariant()): EP 2, EP 2 x DP 2, EP 4, ZeRO 1-3,
full recomputation, PP 2 x EP 2 interleaved, TP 2 + SP x EP 2, bf16 and
GPT-2's experts give one process's bits, every loss and weight.

Bad settings, one line and exit 2: experts not divisible by the size, a
model without experts, a world whose data-parallel ranks the size does not
divide, `loom sample` given the size (it runs in one process), a
capacity under context parallelism, a tensor-parallel size not dividing
the experts' columns.
"""
import os
import sys
import tempfile

import lib
from lib import check

BASE = ["--model", "mixtral-tiny", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
        "--num-query-groups", "2", "--ffn-hidden-size", "64", "--num-experts", "4", "--seq-length", "16",
        "--max-position-embeddings", "16", "--global-batch-size", "8", "--micro-batch-size", "2",
        "--moe-aux-loss-coeff", "0.01", "--moe-z-loss-coeff", "0.001"]
# another family: GPT-2's dense experts with biases (four tensors an expert), its tied table
GPT2 = ["--model", "gpt2-tiny", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
        "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48", "--seq-length", "16",
        "--max-position-embeddings", "16", "--global-batch-size", "8", "--micro-batch-size", "2",
        "--moe-aux-loss-coeff", "0.01"]
# Llama with shared experts (dense, on every rank) in every other layer (blocks without experts between),
# Hugging Face's balancing loss over all layers
LLAMA = ["--model", "llama-tiny", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
         "--num-query-groups", "2", "--ffn-hidden-size", "64", "--num-experts", "4", "--moe-router-topk", "2",
         "--moe-ffn-hidden-size", "48", "--moe-shared-expert-intermediate-size", "32", "--moe-layer-freq", "2",
         "--moe-router-load-balancing-type", "hf_aux_loss", "--moe-aux-loss-coeff", "0.01", "--seq-length", "16",
         "--max-position-embeddings", "16", "--global-batch-size", "8", "--micro-batch-size", "2"]
FULL = ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "2"]


def ep(n):
    return ["--expert-model-parallel-size", str(n)]


def dispatcher(kind):
    return ["--moe-token-dispatcher-type", kind]


def run(tmp, tag, n, extra):
    return lib.tiny_run(tmp, tag, n, BASE + extra)


def layouts(tmp, refs):
    """The layouts without tensor parallelism; the one-process runs the
    others compare with go into refs."""
    one = run(tmp, "one", 1, [])
    got = {}
    for kind in ("alltoall", "allgather"):
        for tag, n, size, more in (("EP 2", 2, 2, []), ("EP 2 x DP 2", 4, 2, []), ("EP 4", 4, 4, []),
                                   ("EP 2 x PP 2", 4, 2, ["--pipeline-model-parallel-size", "2"])):
            name = tag.replace(" ", "") + ("" if kind == "alltoall" else "-ag")
            got[tag, kind] = run(tmp, name, n, ep(size) + dispatcher(kind) + more)
            lib.compare_runs(f"mixtral {tag}, {kind}", one, got[tag, kind])
        lib.same_run(f"mixtral EP 2, {kind}, full recomputation: the EP 2 run's bits", got["EP 2", kind],
                     run(tmp, f"ep2-full-{kind}", 2, ep(2) + dispatcher(kind) + FULL))
    cap = ["--moe-expert-capacity-factor", "1"]
    pos = cap + ["--moe-token-drop-policy", "position"]
    padded = pos + ["--moe-pad-expert-input-to-capacity"]
    for tag, extra, kinds in (("probs", cap, ("alltoall",)), ("position", pos, ("alltoall",)),
                              ("position, padded", padded, ("alltoall", "allgather"))):
        ref = refs[tag] = run(tmp, f"cap-{tag}-one", 1, extra)
        for kind in kinds:
            lib.compare_runs(f"mixtral EP 2, {kind}, capacity 1 ({tag})", ref,
                             run(tmp, f"cap-{tag}-ep2-{kind}", 2, ep(2) + dispatcher(kind) + extra))
    bf16(tmp)
    # ZeRO over the ranks that hold the same experts (the dense shards' gradients summed over the expert group)
    for tag, n, extra in (("ZeRO-1", 4, ["--zero-stage", "1"]), ("ZeRO-2", 4, ["--zero-stage", "2"]),
                          ("ZeRO-3", 4, ["--zero-stage", "3"]), ("the distributed optimizer", 4,
                                                                  ["--use-distributed-optimizer"]),
                          ("ZeRO-3, allgather", 4, ["--zero-stage", "3"] + dispatcher("allgather")),
                          ("ZeRO-3 on 2 ranks", 2, ["--zero-stage", "3"])):
        name = "ep2-" + tag.replace(" ", "").replace(",", "")
        got[tag] = run(tmp, name, n, ep(2) + extra)
        lib.compare_runs(f"mixtral EP 2{' x DP 2' if n == 4 else ''}, {tag}", one, got[tag])
    refs["gpt2"] = lib.tiny_run(tmp, "gpt2-one", 1, GPT2)
    lib.compare_runs("gpt2 with experts, EP 2 x DP 2, alltoall", refs["gpt2"],
                     lib.tiny_run(tmp, "gpt2-ep2dp2", 4, GPT2 + ep(2)))
    refs["llama"] = lib.tiny_run(tmp, "llama-one", 1, LLAMA)
    lib.compare_runs("llama, shared experts every other layer, hf_aux_loss, EP 2 x DP 2, allgather", refs["llama"],
                     lib.tiny_run(tmp, "llama-ep2dp2", 4, LLAMA + ep(2) + dispatcher("allgather")))
    other = run(tmp, "ep2-mb1", 2, ep(2) + ["--micro-batch-size", "1"])
    apart = max(lib.rel(a, b) for a, b in zip(other[0], one[0]))
    check(f"a run whose experts see other rows is {apart:.1e} away (at least 10x the bound)", apart >= 1e-4)
    return one


def tp(n, sp=True):
    return ["--tensor-model-parallel-size", str(n)] + (["--sequence-parallel"] if sp else [])


def tensor_parallel(tmp, one, refs):
    """Experts split over tensor-parallel ranks (each expert's gate and up
    by columns, its down by rows; the router replicated), alone and with
    EP, against one process within 1e-5."""
    for tag, n, extra in (("TP 2", 2, tp(2, sp=False)), ("TP 2 + SP", 2, tp(2)),
                          ("TP 2 + SP x EP 2, alltoall", 4, tp(2) + ep(2)),
                          ("TP 2 + SP x EP 2, allgather", 4, tp(2) + ep(2) + dispatcher("allgather")),
                          ("TP 2 + SP x EP 2, ZeRO-3", 4, tp(2) + ep(2) + ["--zero-stage", "3"]),
                          ("TP 2 x EP 2, full recomputation", 4, tp(2, sp=False) + ep(2) + FULL)):
        lib.compare_runs(f"mixtral {tag}", one, run(tmp, "tp-" + "".join(c for c in tag if c.isalnum()), n, extra))
    padded = ["--moe-expert-capacity-factor", "1", "--moe-token-drop-policy", "position",
              "--moe-pad-expert-input-to-capacity"]
    lib.compare_runs("mixtral TP 2 + SP x EP 2, capacity 1 (position, padded)",
                     refs["position, padded"],
                     run(tmp, "tp-cap", 4, tp(2) + ep(2) + padded))
    # GPT-2's experts' biases: a column bias split, a row bias added once; Llama's shared experts split too
    lib.compare_runs("gpt2 with experts, TP 2 x EP 2", refs["gpt2"],
                     lib.tiny_run(tmp, "gpt2-tp2ep2", 4, GPT2 + tp(2, sp=False) + ep(2)))
    lib.compare_runs("llama, shared experts, TP 2 + SP x EP 2, allgather",
                     refs["llama"],
                     lib.tiny_run(tmp, "llama-tp2ep2", 4, LLAMA + tp(2) + ep(2) + dispatcher("allgather")))


def cp(n, kind):
    return ["--context-parallel-size", str(n), "--cp-comm-type", kind]


def context_parallel(tmp, one, refs):
    """Experts under context parallelism: each context rank routes its
    rows, and the balancing losses (Megatron's per layer, Hugging Face's
    over all layers) and the z-loss are the whole micro-batch's (the
    experts' choices and the softmax's sums added over the context group);
    against one process within 1e-5."""
    for tag, n, extra in (("CP 2 p2p", 2, cp(2, "p2p")), ("CP 2 a2a", 2, cp(2, "a2a")),
                          ("CP 2 x EP 2, alltoall", 4, cp(2, "p2p") + ep(2)),
                          ("CP 2 x TP 2 + SP, all_gather", 4, cp(2, "all_gather") + tp(2))):
        lib.compare_runs(f"mixtral {tag}", one, run(tmp, "cp-" + "".join(c for c in tag if c.isalnum()), n, extra))
    lib.compare_runs("llama, shared experts, hf_aux_loss, CP 2 x EP 2, allgather", refs["llama"],
                     lib.tiny_run(tmp, "llama-cp2ep2", 4, LLAMA + cp(2, "p2p") + ep(2) + dispatcher("allgather")))


def bf16(tmp):
    """bf16 at a learning rate of 0 (lib.same_steps_at_lr0 says why)."""
    zero = ["--bf16", "--lr", "0"]
    run(tmp, "bf16-one", 1, zero)
    run(tmp, "bf16-ep2dp2", 4, ep(2) + zero)
    lib.same_steps_at_lr0("bf16 EP 2 x DP 2", os.path.join(tmp, "bf16-one.jsonl"),
                          os.path.join(tmp, "bf16-ep2dp2.jsonl"))


def statistics(tmp):
    """The metrics' MoE statistics of EP 2 x DP 2 against one process's."""
    rows = {}
    for tag, n, extra in (("one", 1, []), ("EP2xDP2", 4, ep(2))):
        rows[tag] = lib.metrics_rows(os.path.join(tmp, f"{tag}.jsonl"))
    worst = 0.0
    same_shape = len(rows["one"]) == len(rows["EP2xDP2"]) == lib.STEPS
    for a, b in zip(rows["one"], rows["EP2xDP2"]):
        ta, tb = a["moe"]["tokens_per_expert"], b["moe"]["tokens_per_expert"]
        for x, y in [(ta[key], tb[key]) for key in ("min", "max", "cv")] + \
                [(a[key], b[key]) for key in ("load_balancing_loss", "z_loss")]:
            worst = max(worst, abs(x - y) / max(abs(x), 1e-30))
    check(f"EP 2 x DP 2: tokens per expert (min, max, cv), the balancing loss and the z-loss in every step's "
          f"metrics are one process's (worst rel {worst:.1e}, tol 1e-5)", same_shape and worst <= 1e-5)


def memory(tmp):
    """A rank's parameter bytes at EP 2: the dense tensors and half the
    experts. Under ZeRO (EP 2 x DP 2 at stages 1 and 3, EP 2 at stage 3 on
    2 ranks) the optimizer state, and at stage 3 the reduced gradients and
    the parameter shard, hold every element once over the ranks, an even
    part a rank: the experts' shards over the 2 ranks that hold them, the
    dense tensors' over all data ranks (each expert rank owns a share of
    its shard's dense elements)."""
    from pyref import ckpt

    w = ckpt.weights(os.path.join(tmp, "one"))
    total = sum(t.size for t in w.values())
    experts = sum(t.size for k, t in w.items() if ".experts." in k)
    row = lib.metrics_rows(os.path.join(tmp, "EP2.jsonl"))[-1]
    ranks = row.get("mem_by_rank", [row["mem"]])
    want = 4 * (total - experts // 2)
    got = [r["params"] for r in ranks]
    check(f"EP 2: every rank's parameters are the dense tensors' and half the experts' ({want} bytes; got {got})",
          len(got) == 2 and all(g == want for g in got), f"{ranks}")
    # the optimizer state over all 4 data ranks, dense tensors too (each expert rank steps a share of its
    # shard's dense elements): the moments (float32, 8 bytes an element) of every element once in all, a
    # quarter a rank up to the shards' rounding (a shard over the expert group had the dense ones twice)
    for name, tag in (("ep2-ZeRO-3", "EP 2 x DP 2, ZeRO-3"), ("ep2-ZeRO-1", "EP 2 x DP 2, ZeRO-1"),
                      ("ep2-ZeRO-3on2ranks", "EP 2, ZeRO-3 on 2 ranks")):
        ranks = lib.metrics_rows(os.path.join(tmp, f"{name}.jsonl"))[-1]["mem_by_rank"]
        got = [r["optimizer"] for r in ranks]
        check(f"{tag}: the optimizer state is every element's once over the ranks ({8 * total} bytes), "
              f"1/{len(got)} a rank (got {got})",
              sum(got) == 8 * total and all(abs(g - 8 * total / len(got)) <= 64 for g in got), f"{ranks}")
        for part in ("grads", "params") if "ZeRO-3" in tag else ():  # float32: 4 bytes an element
            have = [r[part] for r in ranks]
            check(f"{tag}: the {part} shards are every element's once over the ranks ({4 * total} bytes; "
                  f"got {have})", sum(have) == 4 * total and all(2 * g == o for g, o in zip(have, got)), f"{ranks}")


def resume(tmp, one):
    """An EP 2 run's checkpoint at step 10 resumed in one process, and one
    process's under EP 2 x DP 2: the last 10 steps against the
    uninterrupted one-process run one."""
    for tag, first, then in (("EP 2 -> 1 process", (2, ep(2)), (1, [])),
                             ("1 process -> EP 2 x DP 2", (1, []), (4, ep(2))),
                             ("EP 2 x DP 2 ZeRO-3 -> EP 4", (4, ep(2) + ["--zero-stage", "3"]), (4, ep(4))),
                             ("EP 4 ZeRO-3 -> EP 2 x DP 2 ZeRO-3", (4, ep(4) + ["--zero-stage", "3"]),
                              (4, ep(2) + ["--zero-stage", "3"])),
                             ("TP 2 + SP x EP 2 -> 1 process", (4, tp(2) + ep(2)), (1, []))):
        lib.resume_check(tmp, tag, BASE, first, then, one)


def hf_directory(tmp):
    """A Hugging Face directory (loom convert of the one-process checkpoint)
    loaded under EP 2 x DP 2 and TP 2 + SP x EP 2: each rank reads its
    experts (and its columns of them) and skips the others'; 5 steps from
    it are one process's."""
    d = os.path.join(tmp, "one-hf")
    p = lib.loom("convert", os.path.join(tmp, "one"), d)
    losses = {}
    for tag, n, extra in (("one process", 1, []), ("EP 2 x DP 2", 4, ep(2)), ("TP 2 + SP x EP 2", 4, tp(2) + ep(2))):
        metrics = os.path.join(tmp, f"hf-{''.join(c for c in tag if c.isalnum())}.jsonl")
        cmd = [lib.LOOM, "train", "--load", d, "--data-path", os.path.join(tmp, "train.bin"), "--micro-batch-size",
               "2", "--global-batch-size", "8", "--train-iters", "5", "--eval-iters", "0", "--threads", "1",
               "--log-interval", "1", "--metrics", metrics] + extra
        q = lib.run_ranks(n, cmd, expect=None, timeout=300)
        losses[tag] = [r["loss"] for r in lib.metrics_rows(metrics)] if q.returncode == 0 else []
    a = losses["one process"]
    for tag in ("EP 2 x DP 2", "TP 2 + SP x EP 2"):
        b = losses[tag]
        worst = max((lib.rel(x, y) for x, y in zip(b, a)), default=1.0)
        check(f"a Hugging Face directory loaded under {tag}: 5 steps, one process's losses (worst rel {worst:.1e}, "
              f"tol 1e-5)", p.returncode == 0 and len(a) == len(b) == 5 and worst <= 1e-5, f"{a} vs {b}")


def invariant(tmp):
    """--layout-invariant 2 with expert parallelism: one process's bits.
    Each source rank's rows are their own grouped products (one process's
    shapes for that rank's micro-batch) with their own weight gradients,
    summed over the source's micro-batches in a tree of their own and then
    in the pairwise tree over the sources; the experts' and ZeRO's dense
    sums over the expert group go through the tree too; under tensor
    parallelism the experts are whole on each tensor-parallel rank. Micro-
    batches of 2 (4 a step in one process): EP 2 (2 a rank) alone, with
    ZeRO-3 and under full recomputation; with the allgather dispatcher
    (each choice's row in a slot of its own, combined on the token's rank)
    EP 2 and EP 4 under ZeRO-3; EP 2 x DP 2 under ZeRO-1 and
    ZeRO-2, EP 4 under ZeRO-3, PP 2 x EP 2 with the interleaved schedule,
    TP 2 + SP x EP 2; one micro-batch a rank (micro-batches of 4); bf16 at
    EP 2 x DP 2 under ZeRO-2 with the optimizer state in files;
    GPT-2's experts (biases, the [in, out] orientation) with shared experts
    and a capacity, at EP 2 and TP 2 + SP x EP 2. Without the flag EP 2 is
    not one process's bits (so the checks can fail)."""
    inv = ["--layout-invariant", "2"]
    mb4 = ["--micro-batch-size", "4"]
    one = run(tmp, "inv-one", 1, inv)
    for tag, n, extra in (("EP 2", 2, ep(2)), ("EP 2 ZeRO-3", 2, ep(2) + ["--zero-stage", "3"]),
                          ("EP 2 full recomputation", 2, ep(2) + FULL),
                          ("EP 2 allgather", 2, ep(2) + dispatcher("allgather")),
                          ("EP 4 allgather, ZeRO-3", 4, ep(4) + dispatcher("allgather") + ["--zero-stage", "3"]),
                          ("EP 2 x DP 2 ZeRO-1", 4, ep(2) + ["--zero-stage", "1"]),
                          ("EP 2 x DP 2 ZeRO-2", 4, ep(2) + ["--zero-stage", "2"]),
                          ("EP 4 ZeRO-3", 4, ep(4) + ["--zero-stage", "3"]),
                          ("PP 2 interleaved x EP 2", 4, ep(2) + ["--pipeline-model-parallel-size", "2",
                                                                  "--num-layers-per-virtual-pipeline-stage", "1"]),
                          ("TP 2 + SP x EP 2", 4, tp(2) + ep(2))):
        lib.same_run(f"invariant {tag}", one, run(tmp, f"inv-{tag.replace(' ', '')}", n, inv + extra))
    one4 = run(tmp, "inv-one4", 1, inv + mb4)
    lib.same_run("invariant EP 2, one micro-batch a rank", one4, run(tmp, "inv-ep2-mb4", 2, inv + mb4 + ep(2)))
    b1 = run(tmp, "inv-bf16-one", 1, inv + ["--bf16"])
    # each expert rank's share of the dense master weights and moments, in the optimizer's file
    os.makedirs(os.path.join(tmp, "nvme"), exist_ok=True)
    lib.same_run("invariant bf16 EP 2 x DP 2 ZeRO-2, the optimizer in files", b1,
                 run(tmp, "inv-bf16-ep2", 4, inv + ["--bf16"] + ep(2) + [
                     "--zero-stage", "2", "--offload-optimizer", "nvme", "--nvme-path", os.path.join(tmp, "nvme")]))
    gpt = GPT2 + ["--moe-shared-expert-intermediate-size", "32", "--moe-expert-capacity-factor", "1"]
    g1 = lib.tiny_run(tmp, "inv-gpt2-one", 1, gpt + inv)
    lib.same_run("invariant GPT-2 experts, shared, capacity, EP 2", g1,
                 lib.tiny_run(tmp, "inv-gpt2-ep2", 2, gpt + inv + ep(2)))
    lib.same_run("invariant GPT-2 experts, shared, capacity, TP 2 + SP x EP 2", g1,
                 lib.tiny_run(tmp, "inv-gpt2-tp2ep2", 4, gpt + inv + tp(2) + ep(2)))
    plain = run(tmp, "inv-plain-ep2", 2, ep(2))
    base = run(tmp, "inv-plain-one", 1, [])
    check("without the flag EP 2 is not one process's bits (the checks above can fail)", plain[0] != base[0])


def bad_settings(tmp):
    data = ["--data-path", os.path.join(tmp, "train.bin")]
    base = [lib.LOOM, "train"] + data + BASE + ["--train-iters", "1", "--eval-iters", "0"]
    cases = [
        ("experts not divisible by the size", 2, ep(2) + ["--num-experts", "3", "--moe-router-topk", "2"],
         ["--expert-model-parallel-size 2", "--num-experts 3"]),
        ("a model without experts", 2, "dense", ["--expert-model-parallel-size 2", "--num-experts 0"]),
        ("a world the size does not divide", 3, ep(2), ["expert-parallel size 2", "3"]),
        ("context parallelism with a capacity", 2, cp(2, "p2p") + ["--moe-expert-capacity-factor", "1"],
         ["--context-parallel-size", "--moe-expert-capacity-factor"]),
        ("a tensor-parallel size not dividing the experts' columns", 2,
         tp(2, sp=False) + ["--moe-ffn-hidden-size", "33"], ["--tensor-model-parallel-size 2", "33"]),
    ]
    cases += [("loom sample with expert parallelism", 1, "sample", ["--expert-model-parallel-size 2", "one process"])]
    for name, n, extra, needles in cases:
        if extra == "dense":  # the flag on a model without experts
            cmd = [lib.LOOM, "train"] + data + ["--model", "llama-tiny", "--train-iters", "1", "--eval-iters", "0"] + ep(2)
        elif extra == "sample":
            cmd = [lib.LOOM, "sample", "--load", os.path.join(tmp, "one"), "--prompt", "a"] + ep(2)
        else:
            cmd = base + extra
        lib.check_refused(name, lib.run_ranks(n, cmd, expect=None, timeout=120), needles)


def main():
    if not lib.built(lib.LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        refs = {}
        one = layouts(tmp, refs)
        tensor_parallel(tmp, one, refs)
        context_parallel(tmp, one, refs)
        statistics(tmp)
        memory(tmp)
        resume(tmp, one)
        hf_directory(tmp)
        invariant(tmp)
        bad_settings(tmp)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
