#!/usr/bin/env python3
"""Activation recomputation changes memory, never the numbers.

Megatron's settings: --recompute-activations (= --recompute-granularity
selective: attention probabilities recomputed from qkv; the fused attention,
the default, keeps none, so there it keeps what no recomputation keeps, and
--attention-backend unfused is checked for it) and
--recompute-granularity full with --recompute-method block|uniform and
--recompute-num-layers N (recomputed layers keep only their input and rerun
their forward before their backward; uniform's last chunk is shorter when N
does not divide the layers, as in Megatron's current code); DeepSpeed's
activation_checkpointing.number_checkpoints alone means full, block.

Checked, bit for bit (recomputation reruns the same kernels on the same
inputs, so there is no tolerance):
  (a) `loom train` on a tiny GPT-2 (L=4 C=64 NH=4 T=32, 10 steps, two
      micro-batches per step) with every setting: the loss and gradient norm
      of every step (--metrics prints them with %.17g) and the final
      checkpoint (weights and both AdamW moments) equal those without
      recomputation; the activation bytes (--metrics "mem") go down;
  (b) the same under ZeRO-3 on 2 ranks, whose gathers and gradient
      reductions follow the block announcements the recompute makes;
  (c) the model alone (tests/tools/gpt2_grads) with activations held in
      bf16 and fp16: loss, logits and every gradient equal, so recomputed
      activations are rounded exactly as the first ones;
  (d) bad settings are one-line errors with exit status 2: Megatron's rules
      (full needs a method and a layer count, selective takes neither, at
      most --num-layers layers), a method or count without full (Megatron
      ignores them silently), and --recompute-activations with another
      granularity.
Exits 1 on any failure.
"""
import json
import os
import sys
import tempfile

import numpy as np

import lib
from lib import ENV, LOOM, check
from pyref import ckpt, gpt2, shard, st

TOOL = lib.tool("gpt2_grads")
L, STEPS = 4, 10

FULL = ["--recompute-granularity", "full"]
SETTINGS = {  # name -> flags
    "selective (--recompute-activations)": ["--recompute-activations"],
    "selective": ["--recompute-granularity", "selective"],
    f"full block N={L}": FULL + ["--recompute-method", "block", "--recompute-num-layers", str(L)],
    "full block N=2": FULL + ["--recompute-method", "block", "--recompute-num-layers", "2"],
    "full uniform N=1": FULL + ["--recompute-method", "uniform", "--recompute-num-layers", "1"],
    "full uniform N=2": FULL + ["--recompute-method", "uniform", "--recompute-num-layers", "2"],
    "full uniform N=3 (chunks of 3 and 1)": FULL + ["--recompute-method", "uniform", "--recompute-num-layers", "3"],
    f"full uniform N={L}": FULL + ["--recompute-method", "uniform", "--recompute-num-layers", str(L)],
}


def train(tmp, tag, flags, ranks=1):
    """Per-step (loss, grad_norm) as printed, the checkpoint, and the peak activation bytes of the last step."""
    metrics, save = os.path.join(tmp, f"{tag}.jsonl"), os.path.join(tmp, tag)
    cmd = [LOOM, "train", "--data-path", os.path.join(tmp, "train.bin"), "--num-layers", str(L),
           "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32", "--train-iters", str(STEPS),
           "--global-batch-size", "8", "--micro-batch-size", str(4 // ranks), "--log-interval", "1",
           "--eval-iters", "0", "--threads", str(2 // ranks), "--metrics", metrics, "--save", save,
           "--comm-timeout", "120"] + flags
    lib.run_ranks(ranks, cmd, tag=tag, timeout=600)
    rows = lib.metrics_rows(metrics)
    return [(r["loss"], r["grad_norm"]) for r in rows], ckpt.assemble(save), rows[-1]["mem"]["activations"]


def compare(tag, ref, got):
    steps_ref, ck_ref, _ = ref
    steps, ck, act = got
    diff = [i + 1 for i, (x, y) in enumerate(zip(steps, steps_ref)) if x != y]
    check(f"{tag}: loss and grad_norm of all {STEPS} steps bit for bit",
          len(steps) == STEPS and not diff, f"steps {diff} differ: {steps[diff[0] - 1] if diff else ''} vs "
          f"{steps_ref[diff[0] - 1] if diff else ''}")
    bad = lib.differing(ck, ck_ref)
    check(f"{tag}: all {len(ck_ref)} checkpoint tensors (weights, AdamW moments) bit for bit", not bad,
          f"differ: {bad[:5]}")


def model_alone(tmp):
    """(c): gpt2_grads with activations in bf16/fp16, every setting against none."""
    V, C, NH, T, B = 97, 48, 4, 24, 3
    model = gpt2.init_weights(gpt2.GPT2(gpt2.Config(L, C, NH, V, T)), 5)
    rng = np.random.default_rng(5)
    w = {n: a + rng.standard_normal(a.shape).astype(np.float32) * (0.1 if a.ndim == 1 else 0.05)
         for n, a in gpt2.to_numpy(model).items()}  # LayerNorms and biases off 1 and 0, larger matrices
    wpath, tpath = os.path.join(tmp, "w.safetensors"), os.path.join(tmp, "t.i32")
    st.save(wpath, w, {"format": "pt"})
    rng.integers(0, V, size=(B, T + 1), dtype=np.int32).astype("<i4").tofile(tpath)
    # the tool takes the model's settings: --recompute GRANULARITY, then the trainer's method and count flags
    tool_settings = {"none": []}
    tool_settings.update({name: ["--recompute", flags[1]] + flags[2:] for name, flags in SETTINGS.items()
                          if flags[0] == "--recompute-granularity"})
    for dt in ("bf16", "fp16", "fp32"):
        outs = {}
        for name, flags in tool_settings.items():
            out = os.path.join(tmp, f"o-{dt}-{len(outs)}.safetensors")
            p = lib.run([TOOL, "--act-dtype", dt] + flags + [wpath, tpath, out, L, C, NH, T, V, B], timeout=300)
            if p.returncode != 0:
                check(f"gpt2_grads --act-dtype {dt} {' '.join(flags)}", False, p.stderr.strip())
                continue
            outs[name] = st.load(out)
        ref = outs.pop("none")
        for name, got in outs.items():
            bad = lib.differing(got, ref)
            check(f"model alone, activations in {dt}, {name}: loss, logits and {len(ref) - 2} gradients bit for bit",
                  not bad, f"differ: {bad[:5]}")


def errors(tmp):
    """(d): one line on stderr, exit 2."""
    cases = [
        (FULL + ["--recompute-method", "block", "--recompute-num-layers", str(L + 1)],
         f"--recompute-num-layers {L + 1} exceeds --num-layers {L}"),
        (FULL + ["--recompute-method", "block"], "--recompute-granularity full needs --recompute-num-layers"),
        (FULL + ["--recompute-num-layers", "2"], "--recompute-granularity full needs --recompute-method"),
        (["--recompute-granularity", "selective", "--recompute-num-layers", "2"],
         "--recompute-num-layers 2 needs --recompute-granularity full (it is selective)"),
        (["--recompute-granularity", "selective", "--recompute-method", "block"],
         "--recompute-method block needs --recompute-granularity full (it is selective)"),
        (["--recompute-num-layers", "2"], "--recompute-num-layers 2 needs --recompute-granularity full (it is none)"),
        (["--recompute-activations"] + FULL, "--recompute-activations means --recompute-granularity selective"),
    ]
    for flags, want in cases:
        p = lib.loom("train", "--num-layers", L, "--data-path", os.path.join(tmp, "train.bin"), "--train-iters", "1",
                     "--eval-iters", "0", *flags, env=ENV, timeout=60)
        lines = [line for line in p.stderr.splitlines() if line.strip()]
        check(f"{' '.join(flags)}: exit 2, one line naming it", p.returncode == 2 and len(lines) == 1 and
              lines[0].startswith("loom: error:") and want in lines[0], f"exit {p.returncode}: {p.stderr.strip()}")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        shard.write(os.path.join(tmp, "train.bin"), np.random.default_rng(0).integers(0, 256, 200000))
        # (a) one process, every setting against none
        ref = train(tmp, "none", [])
        acts = {"none": ref[2]}
        for i, (name, flags) in enumerate(SETTINGS.items()):
            got = train(tmp, f"s{i}", flags)
            compare(name, ref, got)
            acts[name] = got[2]
        ds = os.path.join(tmp, "ds.json")
        with open(ds, "w") as f:
            json.dump({"activation_checkpointing": {"partition_activations": False, "cpu_checkpointing": False,
                                                   "contiguous_memory_optimization": False, "number_checkpoints": 2,
                                                   "synchronize_checkpoint_boundary": False, "profile": False}}, f)
        p = lib.loom("train", "--deepspeed-config", ds, "--num-layers", L, "--dry-run", env=ENV, timeout=60)
        rows = {line.split()[0]: line.split()[1:] for line in p.stdout.splitlines() if line.startswith("  recompute")}
        check("DeepSpeed activation_checkpointing.number_checkpoints 2: full, block, 2 layers",
              rows.get("recompute-granularity") == ["full", "(derived)"] and
              rows.get("recompute-method") == ["block", "(derived)"] and
              rows.get("recompute-num-layers") == ["2", "(json)"], p.stdout + p.stderr)
        ignored = [k for k in ("partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
                               "synchronize_checkpoint_boundary", "profile")
                   if f"activation_checkpointing.{k} is accepted, not used" not in p.stderr]
        check("DeepSpeed's other activation_checkpointing keys: accepted, each said to be unused", not ignored,
              f"not reported: {ignored}")
        compare("DeepSpeed number_checkpoints 2", ref, train(tmp, "ds", ["--deepspeed-config", ds]))
        print("activation bytes (peak of the last step): " + ", ".join(f"{k} {v}" for k, v in acts.items()))
        check("selective keeps what none keeps (the fused attention keeps no probabilities), full block N=L "
              "less", acts[f"full block N={L}"] < acts["selective"] == acts["none"])
        # the (T,T) kernels keep probabilities, which selective drops and recomputes
        uref = train(tmp, "u-none", ["--attention-backend", "unfused"])
        usel = train(tmp, "u-selective", ["--attention-backend", "unfused", "--recompute-granularity", "selective"])
        compare("--attention-backend unfused, selective", uref, usel)
        check(f"--attention-backend unfused: selective keeps less than none ({usel[2]} < {uref[2]} bytes)",
              usel[2] < uref[2])
        check("full uniform N=1 keeps as little as full block N=L",
              acts["full uniform N=1"] == acts[f"full block N={L}"])
        # (b) ZeRO-3 on 2 ranks
        ref3 = train(tmp, "z3-none", ["--zero-stage", "3"], ranks=2)
        for name in (f"full block N={L}", "full uniform N=2", "selective"):
            compare(f"ZeRO-3, 2 ranks, {name}", ref3, train(tmp, "z3-" + name.replace(" ", "_"),
                                                            ["--zero-stage", "3"] + SETTINGS[name], ranks=2))
        # (c), (d)
        model_alone(tmp)
        errors(tmp)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
