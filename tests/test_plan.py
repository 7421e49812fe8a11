"""loom plan and the footprint it counts with.

1. Memory: for every layout loom runs here (one process, DDP, ZeRO 1-3,
   NVMe offload, bf16, fp16, recomputation, TP, SP, PP, interleaved PP, 3D,
   --layout-invariant, context parallelism of each comm type, expert
   parallelism with each dispatcher)
   on gpt2-tiny, GPT-2 124M and llama-tiny, the planner's bytes by category (params,
   grads, optimizer, activations, comm) are within 5% of what the trainer's
   accounting measures at a step (the `mem_by_rank` of --metrics, the
   largest over the ranks), and --dry-run prints the same figures.
2. The ZeRO paper's model-state memory per device (Rajbhandari et al.,
   Table 1: 16, 4 + 12/Nd, 2 + 14/Nd and 16/Nd bytes a parameter for the
   baseline and stages 1-3) for a 1T-parameter GPT on 1024 ranks, exactly,
   from the same count.
3. Megatron-LM's Table 1 (Narayanan et al., SC'21) on the built-in
   a100-80gb cluster: for the rows from 18B to 1T, with their tensor,
   pipeline and data-parallel sizes, the predicted per-GPU throughput (the
   paper's FLOP count, recomputation included) is within 15% of the
   published; left to choose, the planner's layout fits in 80 GB and its
   step is no slower than 1.1x the published step.
4. The outputs and the errors (and the expert-parallel sizes searched for
   a model with experts): --json is one document, the text names the
   best layout's flags, rejected layouts carry their reason; bad flags and
   cluster files are one-line errors with exit 2.
5. An allocation that fails while training explains itself (the memory it
   held, the layout's count, the leanest layout) and exits 1.
6. Long context: GPT-2 124M at B=1 and T = 1024, 4096, 16384, one process,
   no recomputation: with the fused attention (the default) the activations
   grow linearly with T (each 4x of T gives 4x within 1%: every activation
   is (T, width) or smaller); with --attention-backend unfused the stored
   probabilities make them grow faster (over 8x for 4x of T). At T = 32768
   on 8 ranks of 24 GB the data-parallel layouts without recomputation fit
   only with context parallelism.
"""
import json
import os
import sys
import tempfile

import lib

TAGS = ["params", "grads", "optimizer", "activations", "comm"]
TINY = ["--model", "gpt2-tiny", "--seq-length", "64"]
GPT2 = ["--model", "gpt2", "--seq-length", "64"]
LLAMA = ["--model", "llama-tiny"]
# --layout-invariant 2 under CP 2 cuts a sequence into 4 row blocks of at least 128 rows
LONG = ["--seq-length", "512", "--max-position-embeddings", "512"]
MIXTRAL = ["--model", "mixtral-tiny", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
           "--num-query-groups", "2", "--ffn-hidden-size", "64", "--num-experts", "4", "--seq-length", "16",
           "--max-position-embeddings", "16"]
# (name, ranks, model, flags): every layout is given in full, so the
# planner evaluates that one layout
LAYOUTS = [
    ("one process f32", 1, TINY, "--micro-batch-size 4 --global-batch-size 8"),
    ("one process bf16", 1, TINY, "--micro-batch-size 4 --global-batch-size 8 --bf16"),
    ("one process fp16", 1, TINY, "--micro-batch-size 4 --global-batch-size 4 --fp16"),
    ("recompute full", 1, TINY, "--micro-batch-size 4 --global-batch-size 4 --recompute-granularity full "
                                "--recompute-method uniform --recompute-num-layers 2"),
    ("recompute selective", 1, TINY, "--micro-batch-size 4 --global-batch-size 4 --recompute-granularity selective"),
    ("DDP", 2, TINY, "--micro-batch-size 4 --global-batch-size 8 --zero-stage 0"),
    ("DDP bf16 accumulation", 2, TINY, "--micro-batch-size 4 --global-batch-size 16 --zero-stage 0 --bf16"),
    ("ZeRO-1", 2, TINY, "--micro-batch-size 4 --global-batch-size 8 --zero-stage 1"),
    ("ZeRO-1 bf16", 2, TINY, "--micro-batch-size 4 --global-batch-size 8 --zero-stage 1 --bf16"),
    ("ZeRO-2", 2, TINY, "--micro-batch-size 4 --global-batch-size 8 --zero-stage 2"),
    ("ZeRO-2 bf16 accumulation", 2, TINY, "--micro-batch-size 4 --global-batch-size 16 --zero-stage 2 --bf16"),
    ("ZeRO-3", 2, TINY, "--micro-batch-size 4 --global-batch-size 8 --zero-stage 3"),
    ("ZeRO-3 bf16", 2, TINY, "--micro-batch-size 4 --global-batch-size 8 --zero-stage 3 --bf16"),
    ("ZeRO-1 NVMe offload", 2, TINY, "--micro-batch-size 4 --global-batch-size 8 --zero-stage 1 --bf16 "
                                     "--offload-optimizer nvme --nvme-path NVME"),
    ("TP", 2, TINY, "--micro-batch-size 4 --global-batch-size 4 --tensor-model-parallel-size 2"),
    ("TP + SP", 2, TINY, "--micro-batch-size 4 --global-batch-size 4 --tensor-model-parallel-size 2 "
                         "--sequence-parallel"),
    ("PP 1F1B bf16", 2, TINY, "--micro-batch-size 2 --global-batch-size 8 --pipeline-model-parallel-size 2 --bf16"),
    ("PP interleaved", 2, TINY, "--micro-batch-size 2 --global-batch-size 8 --pipeline-model-parallel-size 2 "
                                "--num-layers-per-virtual-pipeline-stage 1"),
    ("3D tp 2 x pp 2 x dp 2 ZeRO-1", 8, TINY, "--micro-batch-size 2 --global-batch-size 8 "
                                              "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                                              "--zero-stage 1"),
    ("Llama tiny bf16", 1, LLAMA, "--micro-batch-size 4 --global-batch-size 4 --bf16"),
    ("Llama tiny ZeRO-2", 2, LLAMA, "--micro-batch-size 2 --global-batch-size 4 --zero-stage 2"),
    ("Llama tiny TP + SP", 2, LLAMA, "--micro-batch-size 2 --global-batch-size 4 --tensor-model-parallel-size 2 "
                                     "--sequence-parallel"),
    # --layout-invariant: the micro-batch tree's levels, the pieces' scratch, the tied table's per-micro-batch sends
    ("layout-invariant bf16 accumulation", 1, TINY, "--micro-batch-size 2 --global-batch-size 8 --bf16 "
                                                    "--layout-invariant 2"),
    ("layout-invariant TP + SP bf16", 2, TINY, "--micro-batch-size 2 --global-batch-size 4 --bf16 "
                                               "--tensor-model-parallel-size 2 --sequence-parallel --layout-invariant 2"),
    ("layout-invariant ZeRO-3 bf16", 2, TINY, "--micro-batch-size 2 --global-batch-size 8 --zero-stage 3 --bf16 "
                                              "--layout-invariant 1"),
    ("layout-invariant PP bf16", 2, TINY, "--micro-batch-size 2 --global-batch-size 8 "
                                          "--pipeline-model-parallel-size 2 --bf16 --layout-invariant 1"),
    ("Llama tiny layout-invariant TP", 2, LLAMA, "--micro-batch-size 2 --global-batch-size 4 --bf16 "
                                                 "--tensor-model-parallel-size 2 --layout-invariant 2"),
    ("CP 2 p2p", 2, TINY, "--micro-batch-size 4 --global-batch-size 4 --context-parallel-size 2 "
                          "--cp-comm-type p2p"),
    ("CP 2 all_gather bf16", 2, TINY, "--micro-batch-size 4 --global-batch-size 4 --context-parallel-size 2 "
                                      "--cp-comm-type all_gather --bf16"),
    ("CP 2 x DP 2 ZeRO-3", 4, TINY, "--micro-batch-size 2 --global-batch-size 4 --context-parallel-size 2 "
                                    "--zero-stage 3"),
    ("Llama tiny CP 2 a2a", 2, LLAMA, "--micro-batch-size 2 --global-batch-size 4 --context-parallel-size 2 "
                                      "--cp-comm-type a2a --num-query-groups 2"),
    # --layout-invariant under CP: the row blocks' float64 gradients, the whole keys and their float64 gradients,
    # the embedding's whole rows
    ("CP 2 p2p --layout-invariant bf16", 2, TINY + LONG, "--micro-batch-size 2 --global-batch-size 4 "
                                                  "--context-parallel-size 2 --bf16 --layout-invariant 2"),
    ("Llama tiny CP 2 a2a --layout-invariant", 2, LLAMA + LONG, "--micro-batch-size 2 --global-batch-size 4 "
                                                         "--context-parallel-size 2 --cp-comm-type a2a "
                                                         "--num-query-groups 2 --layout-invariant 2"),
    ("Mixtral tiny EP 2 alltoall", 2, MIXTRAL, "--micro-batch-size 2 --global-batch-size 8 "
                                               "--expert-model-parallel-size 2"),
    ("Mixtral tiny EP 2 allgather", 2, MIXTRAL, "--micro-batch-size 2 --global-batch-size 8 "
                                                "--expert-model-parallel-size 2 --moe-token-dispatcher-type allgather"),
    ("Mixtral tiny EP 2 x DP 2 ZeRO-3", 4, MIXTRAL, "--micro-batch-size 2 --global-batch-size 8 "
                                                    "--expert-model-parallel-size 2 --zero-stage 3"),
    ("Mixtral tiny EP 2 --layout-invariant", 2, MIXTRAL, "--micro-batch-size 2 --global-batch-size 16 "
                                                        "--expert-model-parallel-size 2 --layout-invariant 2"),
    ("Mixtral tiny EP 2 x DP 2 ZeRO-1", 4, MIXTRAL, "--micro-batch-size 2 --global-batch-size 8 "
                                                    "--expert-model-parallel-size 2 --zero-stage 1"),
    # each choice's slot (the allgather dispatcher under the flag), the dense optimizer shares' gather
    ("Mixtral tiny EP 2 x DP 2 ZeRO-2 allgather --layout-invariant", 4, MIXTRAL,
     "--micro-batch-size 2 --global-batch-size 16 --expert-model-parallel-size 2 --zero-stage 2 "
     "--moe-token-dispatcher-type allgather --layout-invariant 2"),
    ("Mixtral tiny TP 2 + SP x EP 2", 4, MIXTRAL, "--micro-batch-size 2 --global-batch-size 8 "
                                                  "--tensor-model-parallel-size 2 --sequence-parallel "
                                                  "--expert-model-parallel-size 2"),
    ("GPT-2 124M bf16", 1, GPT2, "--micro-batch-size 2 --global-batch-size 2 --bf16"),
    ("GPT-2 124M ZeRO-3 bf16", 2, GPT2, "--micro-batch-size 1 --global-batch-size 2 --zero-stage 3 --bf16"),
    ("GPT-2 124M TP + SP", 2, GPT2, "--micro-batch-size 2 --global-batch-size 2 --tensor-model-parallel-size 2 "
                                    "--sequence-parallel"),
]
# what a layout leaves unsaid is the default, given explicitly to the planner
DEFAULTS = {"--zero-stage": "0", "--tensor-model-parallel-size": "1", "--pipeline-model-parallel-size": "1",
            "--context-parallel-size": "1",
            "--recompute-granularity": "none", "--num-layers-per-virtual-pipeline-stage": "0"}


def plan(args, expect=0):
    p = lib.loom("plan", *args, timeout=600)
    if p.returncode != expect:
        raise SystemExit(f"loom plan {' '.join(args)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    return p


def planned(model, flags, world, sp):
    """The planner's one layout for flags on world ranks (SP as given)."""
    args = model + flags + ["--world", str(world), "--cluster", "a100-80gb", "--json"]
    for k, v in DEFAULTS.items():
        if k not in flags:
            args += [k, v]
    doc = json.loads(plan(args).stdout)
    ents = [e for e in doc["layouts"] + doc["rejected"] if e["layout"]["sequence_parallel"] == sp]
    return ents


def memory_section(tmp):
    print("1. memory: the planner's count against the trainer's accounting (largest over the ranks, MB)")
    os.makedirs(os.path.join(tmp, "nvme"))
    for name, n, model, flags in LAYOUTS:
        flags = flags.replace("NVME", os.path.join(tmp, "nvme")).split()
        metrics = os.path.join(tmp, "m.jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)
        cmd = [lib.LOOM, "train", *model, *flags, "--train-iters", "2", "--log-interval", "1", "--eval-iters", "0",
               "--threads", "1", "--metrics", metrics]
        lib.run_ranks(n, cmd, tag=name, timeout=600)
        step = lib.metrics_rows(metrics)[-1]
        ranks = step.get("mem_by_rank", [step["mem"]])
        ents = planned(model, flags, n, "--sequence-parallel" in flags)
        if not lib.check(f"{name}: the planner evaluates the one layout", len(ents) == 1 and "memory" in ents[0],
                         f"{len(ents)} layouts: {[e['layout']['flags'] for e in ents]}"):
            continue
        mem = ents[0]["memory"]
        worst = 0.0
        line = []
        for t in TAGS:
            got, want = mem[t], max(r[t] for r in ranks)
            err = abs(got - want) / want if want else (0.0 if got == 0 else 1.0)
            worst = max(worst, err)
            line.append(f"{t} {want / 1e6:.3f}/{got / 1e6:.3f}")
        lib.check(f"{name}: every category within 5% ({', '.join(line)}; worst {worst * 100:.2f}%)",
                  worst <= 0.05)
    # --dry-run prints the same count, for the layout its flags give
    name, n, model, flags = next(x for x in LAYOUTS if x[0] == "ZeRO-3")
    p = lib.run_ranks(n, [lib.LOOM, "train", *model, *flags.split(), "--dry-run"], tag="dry-run")
    ents = planned(model, flags.split(), n, False)
    want = f"activations {ents[0]['memory']['activations'] / 1e6:10.1f} MB".split()
    lines = [l.split() for l in p.stdout.splitlines()]
    lib.check("--dry-run prints the memory a rank holds by category, as the planner counts it",
              "memory per rank at a step's peak" in p.stdout and any(l[:3] == want for l in lines),
              p.stdout[-600:])


def gpt(layers, hidden, heads):
    return ["--model", "gpt2", "--num-layers", str(layers), "--hidden-size", str(hidden), "--num-attention-heads",
            str(heads), "--seq-length", "2048", "--max-position-embeddings", "2048", "--vocab-size", "51200"]


def zero_section():
    print("2. ZeRO's model-state memory per device, 1T parameters on 1024 ranks (Rajbhandari et al., Table 1)")
    # a GPT of about 1T parameters; the bytes a parameter are what the paper tabulates
    model = gpt(128, 25600, 160)
    paper = {0: lambda nd: 16.0, 1: lambda nd: 4 + 12 / nd, 2: lambda nd: 2 + 14 / nd, 3: lambda nd: 16 / nd}
    table = {0: 16000.0, 1: 4011.7, 2: 2013.7, 3: 15.6}  # GB at exactly 1T parameters, as the paper prints them
    for stage in range(4):
        flags = ["--global-batch-size", "1024", "--micro-batch-size", "1", "--bf16", "--zero-stage", str(stage),
                 "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
                 "--world", "1024", "--cluster", "a100-80gb", "--mem-per-rank", "1e6", "--json",
                 "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
                 "--num-layers-per-virtual-pipeline-stage", "0"]
        doc = json.loads(plan(model + flags).stdout)
        e = [x for x in doc["layouts"] if not x["layout"]["sequence_parallel"]][0]
        m = e["memory"]
        psi = m["rank_params"]
        states = m["params"] + m["grads"] + m["optimizer"]
        # the optimizer keeps one float past its range (an end marker): 4 bytes, and the arena
        # rounds up to a multiple of 1024; both are far below the 0.1 GB the paper prints
        per_param = states / psi
        at_1t = per_param * 1e12 / 1e9
        lib.check(f"stage {stage}: {per_param:.6f} bytes a parameter = paper's {paper[stage](1024):.6f}; "
                  f"{at_1t:.1f} GB at 1T = paper's {table[stage]}",
                  abs(per_param - paper[stage](1024)) < 1e-6 and round(at_1t, 1) == table[stage])


# Table 1 of Narayanan et al. (SC'21), rows 18B-1T: billions of parameters,
# heads, hidden, layers, tp, pp, GPUs, batch, published TFLOP/s per GPU
MEGATRON = [(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135), (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
            (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140), (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
            (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155), (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
            (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163)]


def megatron_section():
    print("3. Megatron-LM Table 1 on a100-80gb: predicted against published TFLOP/s per GPU")
    for size, heads, h, layers, tp, pp, gpus, batch, published in MEGATRON:
        s, V = 2048, 51200
        flops = 96 * batch * s * layers * h * h * (1 + s / (6 * h) + V / (16 * layers * h))  # the paper's count
        published_step = flops / (published * 1e12 * gpus)
        base = gpt(layers, h, heads) + ["--global-batch-size", str(batch), "--bf16", "--world", str(gpus),
                                        "--cluster", "a100-80gb", "--json", "--top", "1"]
        # the paper's layout: its tp, pp and dp, plain data parallelism, full recomputation
        doc = json.loads(plan(base + ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size",
                                      str(pp), "--zero-stage", "0", "--recompute-granularity", "full"]).stdout)
        if not lib.check(f"{size}B: the paper's layout fits in 80 GB", doc["layouts"],
                         doc["rejected"][0]["reason"] if doc["rejected"] else ""):
            continue
        e = doc["layouts"][0]
        got = flops / (e["time"]["step"] * gpus) / 1e12
        lib.check(f"{size}B tp {tp} pp {pp} dp {gpus // (tp * pp)}: {got:.0f} TFLOP/s a GPU against {published} "
                  f"({(got / published - 1) * 100:+.1f}%), within 15%", abs(got / published - 1) <= 0.15)
        # left to choose
        doc = json.loads(plan(base).stdout)
        best = doc["layouts"][0] if doc["layouts"] else None
        lib.check(f"{size}B, the planner's choice ({best['layout']['flags'] if best else 'none'}): "
                  f"{best['memory']['total'] / 1e9 if best else 0:.1f} GB, step {best['time']['step'] if best else 0:.1f} s "
                  f"against the published {published_step:.1f} s",
                  best and best["memory"]["total"] <= 80e9 and best["time"]["step"] <= 1.1 * published_step)


def outputs_section(tmp):
    print("4. outputs and errors")
    p = plan(TINY + ["--global-batch-size", "8", "--world", "2", "--cluster", "a100-80gb"])
    lib.check("the text ranks layouts and names the best one's flags",
              "layouts considered" in p.stdout and "recommended: --tensor-model-parallel-size" in p.stdout
              and "why: " in p.stdout, p.stdout[-800:])
    p = plan(TINY + ["--global-batch-size", "8", "--world", "2", "--cluster", "a100-80gb", "--json",
                     "--mem-per-rank", "0.02"])
    doc = json.loads(p.stdout)
    times = [e["time"]["step"] for e in doc["layouts"]]
    lib.check("--json: one document, the recommended layout first (within 10% of the fastest), then fastest "
              "first, each within --mem-per-rank",
              times[1:] == sorted(times[1:]) and times[0] <= 1.1 * min(times) and doc["why"]
              and all(e["memory"]["total"] <= 0.02e9 for e in doc["layouts"]))
    lib.check("a layout over --mem-per-rank is rejected with its size and the limit",
              any("above 0.02 GB" in e["reason"] for e in doc["rejected"]))
    # expert parallelism is searched for a model with experts: sizes dividing the experts and the data ranks
    for tag, model, extra, want in (("an MoE model", MIXTRAL, [], [1, 2, 4]),
                                    ("an MoE model given --expert-model-parallel-size 2", MIXTRAL,
                                     ["--expert-model-parallel-size", "2"], [2]),
                                    ("a dense model", TINY, [], [1])):
        p = plan(model + extra + ["--global-batch-size", "8", "--world", "4", "--cluster", "a100-80gb", "--json",
                                  "--top", "10000"])
        eps = sorted({e["layout"].get("ep", 1) for e in json.loads(p.stdout)["layouts"]})
        lib.check(f"{tag}: the plan's expert-parallel sizes at 4 ranks are {want} (got {eps})", eps == want)
    bad_cluster = os.path.join(tmp, "bad.json")
    with open(bad_cluster, "w") as f:
        json.dump({"name": "x", "ranks_per_node": 2}, f)
    cases = [
        (["--world", "0"], "--world 0"),
        (["--world", "2", "--mem-per-rank", "x"], "--mem-per-rank x"),
        (["--world", "2", "--cluster", "nosuch"], "not a built-in cluster"),
        (["--world", "2", "--cluster", os.path.join(tmp, "none.json")], "cannot read"),
        (["--world", "2", "--cluster", bad_cluster], '"shared_node" is missing'),
        (["--world", "3", "--global-batch-size", "8", "--cluster", "a100-80gb", "--tensor-model-parallel-size", "2"],
         "no layout of 3 ranks"),
    ]
    for args, want in cases:
        a = TINY + (["--global-batch-size", "8"] if "--global-batch-size" not in args else []) + args
        p = lib.loom("plan", *a)
        errs = lib.error_lines(p.stderr)
        lib.check(f"loom plan {' '.join(args)}: exit 2, one line naming it", p.returncode == 2 and len(errs) == 1 and
                  want in errs[0], f"exit {p.returncode}: {p.stderr.strip()[-300:]}")
    p = lib.loom("plan", "--model", "gpt2-tiny", "--world", "2", "--cluster", "a100-80gb")
    lib.check("loom plan without --global-batch-size says it needs one", p.returncode == 2 and
              "--global-batch-size" in p.stderr, p.stderr[-300:])
    out = os.path.join(tmp, "local.json")
    p = lib.loom("plan", "--calibrate", "-o", out)
    ok = p.returncode == 0 and os.path.exists(out)
    if lib.check("--calibrate writes a cluster description", ok, p.stderr[-300:]):
        c = json.load(open(out))
        p = plan(TINY + ["--global-batch-size", "8", "--world", "1", "--cluster", out, "--json"])
        lib.check("its measured peaks are positive and plan reads the file back",
                  c["peak_f32"] > 0 and c["peak_bf16"] > 0 and json.loads(p.stdout)["cluster"]["name"] == "local")


def oom_section():
    print("5. an allocation that fails while training")
    p = lib.run(["prlimit", "--as=3000000000", lib.LOOM, "train", "--model", "gpt2", "--micro-batch-size", "16",
                 "--train-iters", "1", "--threads", "1"], timeout=300)
    notes = [l for l in p.stderr.splitlines() if l.startswith("loom: note:")]
    errs = lib.error_lines(p.stderr)
    lib.check("exit 1 with one error line naming the size and category",
              p.returncode == 1 and len(errs) == 1 and "out of memory" in errs[0] and "activations" in errs[0],
              p.stderr[-800:])
    lib.check("the notes give the memory held, the layout's count and what loom plan would change",
              len(notes) == 3 and "held params" in notes[0] and "this layout needs" in notes[1] and
              "--recompute-granularity" in notes[2], "\n".join(notes))


def long_context_section():
    print("6. long context: GPT-2 124M, B=1, activations against T")
    for backend in ("auto", "unfused"):
        act = {}
        for T in (1024, 4096, 16384):
            args = ["--model", "gpt2", "--seq-length", str(T), "--max-position-embeddings", str(T),
                    "--global-batch-size", "1", "--micro-batch-size", "1", "--world", "1", "--cluster", "local",
                    "--mem-per-rank", "1000", "--attention-backend", backend, "--json"] + \
                   [x for k, v in DEFAULTS.items() for x in (k, v)]
            act[T] = json.loads(plan(args).stdout)["layouts"][0]["memory"]["activations"]
        r1, r2 = act[4096] / act[1024], act[16384] / act[4096]
        figures = ", ".join(f"T={T} {a / 1e9:.3f} GB" for T, a in act.items())
        if backend == "auto":
            lib.check(f"fused attention: activations linear in T ({figures}; ratios {r1:.3f}, {r2:.3f})",
                      abs(r1 - 4) < 0.04 and abs(r2 - 4) < 0.04)
        else:
            lib.check(f"--attention-backend unfused: faster than linear ({figures}; ratios {r1:.2f}, {r2:.2f})",
                      r1 > 8 and r2 > 8)
    # context parallelism: at T = 32768 on 8 ranks of 24 GB a data-parallel layout without recomputation fits
    # only with the sequence split (a rank holding whole sequences' activations needs 28 GB or more)
    args = ["--model", "gpt2", "--seq-length", "32768", "--max-position-embeddings", "32768",
            "--global-batch-size", "8", "--world", "8", "--cluster", "local", "--mem-per-rank", "24", "--json"]
    doc = json.loads(plan(args).stdout)
    plain = [e["layout"] for e in doc["layouts"] if e["layout"]["tp"] == 1 and e["layout"]["pp"] == 1 and
             e["layout"]["recompute"] == "none"]
    cps = sorted({x["cp"] for x in plain})
    lib.check(f"T=32768 on 8 x 24 GB: the data-parallel layouts without recomputation that fit split the sequence "
              f"(cp {cps}, {len(plain)} layouts)", plain and all(x["cp"] > 1 for x in plain))


def main():
    if not lib.built(lib.LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        memory_section(tmp)
        zero_section()
        megatron_section()
        outputs_section(tmp)
        oom_section()
        long_context_section()
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
