"""loom's Llama forward and backward against Hugging Face transformers'
LlamaForCausalLM (PyPI transformers 4.39.3 in the test-only virtual
environment lib.hf_python makes, on Debian's torch).

For small random models (every weight random, RMSNorm weights too, so no
gradient is trivially zero or one) and random tokens, transformers' model
in float64 (the reference must be more exact than the float32 code it
checks; RMSNorm's statistics are float32 there too, as transformers
computes them) gives the loss, the logits and every parameter gradient;
$BUILD/tests/tools/llama_grads loads the same weights from one safetensors
file under Hugging Face's names and gives its own.

Models: grouped-query attention with 2 key/value heads for 4 query heads,
multi-query (1 key/value head), full multi-head (G = NH), a tied LM head,
another rotary base and RMSNorm eps.

Bounds: loss relative error <= 1e-5; logits and every gradient relative L2
error <= 1e-4 (loom computes in float32: a few float32 roundings of each
sum, ~1e-6, well inside).

Hugging Face directories (save_pretrained of perturbed random models,
GQA untied and multi-query tied with another theta and eps): `loom eval
--load DIR` with no --model, and of DIR/model.safetensors, gives
transformers' float64 loss on one window within 1e-5; so does a loom
checkpoint made from it (train --load DIR --finetune --lr 0). `loom
convert` of the directory and of that checkpoint gives every tensor bit for
bit, converting its output again gives the same bytes, and transformers
loads the export with the same logits. config.json
fields loom cannot compute (hidden_act gelu, rope_scaling, an unknown
field) and key/value heads that do not divide the heads are refused in one
line; so is --model gpt2-tiny with a Llama directory. 20 training steps of
`loom train --load DIR` (accumulation 2, clipping, warmup + cosine, llm.c's
loader) give PyTorch's per-step losses (float32 LlamaForCausalLM,
torch.optim.AdamW with decay on 2-D tensors) within 1e-4.

Also: `loom train --model llama-tiny` trains on the built-in corpus (its
loss falls), DDP and ZeRO-3 on 2 ranks give one process's per-step losses
within 1e-5, so does pipeline parallelism (P 2 with 1f1b, gpipe and
interleaved, P 2 x DP 2 with the distributed optimizer, P 2 with full
recomputation; the tied table crosses the stages), and tensor parallelism
(T 2 alone, with DP 2, with DP 2 under ZeRO-3, with P 2, and untied; a
vocabulary of 255 split unevenly), sequence parallelism (T 2 alone, T 2 x DP 2
under ZeRO-3 with selective recomputation, T 2 x P 2 with full
recomputation), T 2 x DP 2 with ZeRO-1 and the
optimizer state on NVMe; ZeRO-2 in fp16 gives one process's fp16 run
within 1e-4 (weights 1e-3); a checkpoint saved at step 10 under T 2 x P 2
resumes in one process and under DP 2 x ZeRO-3 with the uninterrupted
run's losses (1e-5); selective and full
(uniform and block) recomputation give
its losses and weights bit for bit, ZeRO-2 in bf16 one process's bf16 run within 1e-4 (and one
bf16 step of the weights: data parallelism's float32 sum order, as
test_mixed_precision.py explains), and the settings that are not Llama's, or that Llama cannot
run in this version, are refused in one line (exit 2).

With --layout-invariant 2 (the sums every layout splits taken in one
order: tensor parallelism's in 2 pieces summed exactly, the micro-batches'
in a binary tree, data-parallel sums in the pairwise tree over the ranks)
every layout above gives one process's run bit for bit in bf16: DDP on 2
and 4 ranks, ZeRO-1, 2 and 3, ZeRO-3 with parameters and optimizer state on
NVMe, full recomputation, T 2 with and without SP, T 2 x DP 2, T 2 + SP x DP
2 under ZeRO-3 with selective recomputation, P 2 (1f1b and interleaved), T 2
x P 2 and T 2 x P 2 x DP 2 with the distributed optimizer; so do DDP and T 2
in fp16 and T 2 x DP 2 and T 2 x P 2 in float32; a bf16 checkpoint saved
under T 2 x P 2 at step 10 continues in one process and under DP 2 x ZeRO-3
with the uninterrupted one-process run's losses bit for bit.
"""
import json
import os
import sys
import tempfile

import lib
from lib import check

lib.use_transformers()
import transformers  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from pyref import st  # noqa: E402

transformers.logging.set_verbosity_error()
torch.set_num_threads(2)

TOOL = lib.tool("llama_grads")
LOSS_TOL, REL_TOL = 1e-5, 1e-4

# (name, L, C, NH, G, F, T, V, B, theta, eps, tied)
CONFIGS = [
    ("GQA 4 heads / 2 key-value", 2, 64, 4, 2, 176, 16, 97, 2, 10000.0, 1e-5, False),
    ("multi-query (1 key-value head)", 2, 64, 4, 1, 96, 16, 97, 2, 10000.0, 1e-6, False),
    ("multi-head, tied head, theta 500000, eps 0.1", 1, 32, 2, 2, 64, 12, 61, 3, 500000.0, 0.1, True),
]


def reference(name, L, C, NH, G, F, T, V, B, theta, eps, tied, tmp):
    cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L,
                      num_attention_heads=NH, num_key_value_heads=G, max_position_embeddings=T,
                      rms_norm_eps=eps, rope_theta=theta, tie_word_embeddings=tied, attention_bias=False,
                      hidden_act="silu")
    torch.manual_seed(len(name))
    model = LlamaForCausalLM(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02 if p.ndim == 2 else 0.2)
            if p.ndim == 1:
                p.add_(1.0)
    weights = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()
               if not (tied and k == "lm_head.weight") and "rotary_emb" not in k}
    wpath = os.path.join(tmp, "w.safetensors")
    save_file(weights, wpath)
    # use the float32 weights in the reference too: both sides start from the same numbers
    with torch.no_grad():
        for k, p in model.named_parameters():
            if k in weights:
                p.copy_(weights[k].double())
    rows = np.random.default_rng(len(name)).integers(0, V, size=(B, T + 1), dtype=np.int32)
    tpath = os.path.join(tmp, "tokens.i32")
    rows.tofile(tpath)
    x = torch.tensor(rows[:, :T], dtype=torch.long)
    y = torch.tensor(rows[:, 1:], dtype=torch.long)
    # the body and the head called directly: LlamaForCausalLM.forward casts the logits to float32
    logits = model.lm_head(model.model(input_ids=x).last_hidden_state)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
    loss.backward()
    grads = {k: p.grad.detach() for k, p in model.named_parameters()}
    return wpath, tpath, loss.item(), logits.detach(), grads


def rel_l2(got, ref):
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-300))


def compare(cfg):
    name, L, C, NH, G, F, T, V, B, theta, eps, tied = cfg
    with tempfile.TemporaryDirectory() as tmp:
        wpath, tpath, loss, logits, grads = reference(*cfg, tmp)
        out = os.path.join(tmp, "out.safetensors")
        p = lib.run([TOOL, wpath, tpath, out, str(L), str(C), str(NH), str(G), str(F), str(T), str(V), str(B),
                     repr(theta), repr(eps), "0" if tied else "1"])
        if p.returncode != 0:
            check(f"{name}: llama_grads runs", False, p.stderr)
            return
        got = st.load(out)
        lerr = abs(float(got["loss"][0]) - loss) / abs(loss)
        check(f"{name}: loss {float(got['loss'][0]):.6f} vs {loss:.6f} (rel {lerr:.1e}, tol {LOSS_TOL:g})",
              lerr <= LOSS_TOL)
        e = rel_l2(got["logits"], logits.numpy())
        check(f"{name}: logits rel L2 {e:.1e} (tol {REL_TOL:g})", e <= REL_TOL)
        worst, where, missing = 0.0, "", []
        for k, g in grads.items():
            if tied and k == "lm_head.weight":
                continue  # the same tensor as model.embed_tokens.weight (its gradient holds both uses)
            key = f"grad.{k}"
            if key not in got:
                missing.append(k)
                continue
            e = rel_l2(got[key], g.numpy())
            if e > worst:
                worst, where = e, k
        check(f"{name}: every gradient, worst rel L2 {worst:.1e} ({where}) (tol {REL_TOL:g})",
              not missing and worst <= REL_TOL, f"missing {missing}")


def training(tmp):
    lib.write_corpus(tmp)
    base = ["--model", "llama-tiny", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
            "--num-query-groups", "2", "--ffn-hidden-size", "64", "--seq-length", "16",
            "--max-position-embeddings", "16"]
    one = lib.tiny_run(tmp, "llama-single", 1, base + ["--global-batch-size", "8", "--micro-batch-size", "1"])
    check("llama-tiny trains: the loss falls over 20 steps", one[0][-1] < one[0][0] - 0.5, f"{one[0]}")
    for tag, extra in (("llama-ddp", []), ("llama-zero3", ["--zero-stage", "3"])):
        got = lib.tiny_run(tmp, tag, 2, base + ["--global-batch-size", "8", "--micro-batch-size", "1"] + extra)
        lib.compare_runs(tag, one, got)
    # pipeline parallelism: every schedule, with the distributed optimizer and with recomputation
    four = base + ["--num-layers", "4", "--global-batch-size", "8", "--micro-batch-size", "1"]
    ref4 = lib.tiny_run(tmp, "llama-4-layers", 1, four)
    pp2 = ["--pipeline-model-parallel-size", "2"]
    for tag, n, extra in (("llama-pp2-1f1b", 2, pp2), ("llama-pp2-gpipe", 2, pp2 + ["--pipeline-schedule", "gpipe"]),
                          ("llama-pp2-interleaved", 2, pp2 + ["--num-layers-per-virtual-pipeline-stage", "1"]),
                          ("llama-pp2-dp2-distopt", 4, pp2 + ["--use-distributed-optimizer"]),
                          ("llama-pp2-recompute-full", 2, pp2 + ["--recompute-granularity", "full",
                                                                 "--recompute-method", "uniform",
                                                                 "--recompute-num-layers", "1"])):
        lib.compare_runs(tag, ref4, lib.tiny_run(tmp, tag, n, four + extra))
    # tensor parallelism (Megatron's splits; 255 tokens split unevenly), with DP, ZeRO-3 and PP
    odd = four + ["--vocab-size", "255"]
    ref_odd = lib.tiny_run(tmp, "llama-4-layers-v255", 1, odd)
    tp2 = ["--tensor-model-parallel-size", "2"]
    for tag, n, extra in (("llama-tp2", 2, tp2), ("llama-tp2-dp2", 4, tp2),
                          ("llama-tp2-dp2-zero3", 4, tp2 + ["--zero-stage", "3"]),
                          ("llama-tp2-pp2", 4, tp2 + pp2),
                          ("llama-tp2-untied", 2, tp2 + ["--untie-embeddings-and-output-weights"]),
                          # sequence parallelism: alone, with ZeRO-3 and selective recomputation,
                          # and with P 2 and full recomputation
                          ("llama-tp2-sp", 2, tp2 + ["--sequence-parallel"]),
                          ("llama-tp2-sp-dp2-zero3-selective", 4, tp2 + ["--sequence-parallel", "--zero-stage", "3",
                                                                         "--recompute-activations"]),
                          ("llama-tp2-sp-pp2-full", 4, tp2 + pp2 + ["--sequence-parallel",
                                                                    "--recompute-granularity", "full",
                                                                    "--recompute-method", "uniform",
                                                                    "--recompute-num-layers", "1"])):
        ref = ref_odd
        if "untied" in tag:
            ref = lib.tiny_run(tmp, "llama-4-layers-v255-untied", 1, odd + ["--untie-embeddings-and-output-weights"])
        lib.compare_runs(tag, ref, lib.tiny_run(tmp, tag, n, odd + extra))
    # optimizer state offloaded to NVMe, fp16 with its loss scaler, and resuming across layouts
    lib.compare_runs("llama-tp2-zero1-offload", ref_odd, lib.tiny_run(
        tmp, "llama-tp2-zero1-offload", 4, odd + tp2 + ["--zero-stage", "1", "--offload-optimizer", "nvme",
                                                        "--nvme-path", tmp, "--offload-buffer-size", "0.002"]))
    one_h = lib.tiny_run(tmp, "llama-single-fp16", 1, odd + ["--fp16"])
    lib.compare_runs("llama-dp2-zero2-fp16", one_h, lib.tiny_run(tmp, "llama-dp2-zero2-fp16", 2,
                                                                odd + ["--fp16", "--zero-stage", "2"]),
                     tol=1e-4, wtol=1e-3)
    first = lib.tiny_run(tmp, "llama-tp2-pp2-first", 4, odd + tp2 + pp2 + ["--save-interval", "10"])
    at10 = os.path.join(tmp, "llama-tp2-pp2-first", "iter_0000010")
    for tag, n, extra in (("llama-tp2-pp2-to-1", 1, []), ("llama-tp2-pp2-to-dp2-zero3", 2, ["--zero-stage", "3"])):
        losses = lib.tiny_run(tmp, tag, n, odd + ["--load", at10] + extra)[0]
        worst = max((lib.rel(a, b) for a, b in zip(losses, first[0][10:])), default=1.0)
        # another layout after the resume only reorders float32 sums: lib.compare_runs' 1e-5 for the loss
        check(f"{tag}: steps 11-20 after the resume are the uninterrupted run's (worst rel {worst:.1e}, tol 1e-5)",
              len(losses) == 10 and worst <= 1e-5, f"{losses} vs {first[0][10:]}")
    # recomputation reruns the same kernels on the same inputs: bit for bit
    for tag, extra in (("selective", ["--recompute-activations"]),
                       ("full uniform 2", ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                           "--recompute-num-layers", "2"]),
                       ("full block 1", ["--recompute-granularity", "full", "--recompute-method", "block",
                                         "--recompute-num-layers", "1"])):
        got = lib.tiny_run(tmp, f"llama-recompute-{tag[:4]}-{extra[-1]}", 1,
                           base + ["--num-layers", "3", "--global-batch-size", "8", "--micro-batch-size", "1"] + extra)
        if tag == "selective":
            plain = lib.tiny_run(tmp, "llama-3-layers", 1, base + ["--num-layers", "3", "--global-batch-size", "8",
                                                                   "--micro-batch-size", "1"])
        same = got[0] == plain[0] and all(lib.same_bits(got[1][k], plain[1][k]) for k in plain[1])
        check(f"llama, {tag} recomputation: every loss and final weight bit for bit", same, f"{got[0]} vs {plain[0]}")
    # bf16 (activations rounded at kernel edges): data parallelism's float32 sum order, as in
    # test_mixed_precision.py, within 1e-4 of the loss and one bf16 step of the weights
    one_b = lib.tiny_run(tmp, "llama-single-bf16", 1, base + ["--global-batch-size", "8", "--micro-batch-size", "1",
                                                              "--bf16"])
    check("llama-tiny in bf16 is not the float32 run (its activations are rounded)", one_b[0] != one[0])
    got = lib.tiny_run(tmp, "llama-zero2-bf16", 2, base + ["--global-batch-size", "8", "--micro-batch-size", "1",
                                                           "--bf16", "--zero-stage", "2"])
    lib.compare_runs("llama-zero2-bf16", one_b, got, tol=1e-4, wtol=4e-3)
    invariant(tmp, odd)
    data = ["--data-path", os.path.join(tmp, "train.bin"), "--train-iters", "1"]
    for what, flags, text in (
            ("LayerNorm with a Llama preset", ["--normalization", "LayerNorm"], "Llama models use RMSNorm"),
            ("query groups that do not divide the heads", ["--num-query-groups", "3"], "does not divide"),
            ("key/value groups tensor parallelism does not divide",
             ["--tensor-model-parallel-size", "2", "--num-query-groups", "1"], "whole key/value groups"),
            ("--layout-invariant that does not divide the key/value groups",
             ["--layout-invariant", "4", "--num-query-groups", "2"], "--layout-invariant 4 must divide")):
        n = 2 if "--tensor-model-parallel-size" in flags else 1
        p = lib.run_ranks(n, [lib.LOOM, "train"] + data + ["--model", "llama-tiny"] + flags, expect=2, tag=what)
        lines = lib.error_lines(p.stderr)
        check(f"error: {what}: exit 2, one line", p.returncode == 2 and len(lines) == 1 and text in lines[0],
              p.stderr[-300:])
    p = lib.loom("train", *data, "--model", "gpt2-tiny", "--normalization", "RMSNorm")
    lines = lib.error_lines(p.stderr)
    check("error: RMSNorm with a GPT-2 preset: exit 2, one line",
          p.returncode == 2 and len(lines) == 1 and "GPT-2" in lines[0], p.stderr[-300:])


def invariant(tmp, odd):
    """--layout-invariant 2: every layout gives one process's run bit for
    bit in bf16 (and fp16 and float32 on a few), and a resume across
    layouts continues it bit for bit."""
    inv = odd + ["--layout-invariant", "2"]
    tp2, pp2 = ["--tensor-model-parallel-size", "2"], ["--pipeline-model-parallel-size", "2"]
    z3 = ["--zero-stage", "3"]
    layouts = [("DDP", 2, []), ("ZeRO-1", 2, ["--zero-stage", "1"]), ("ZeRO-2", 2, ["--zero-stage", "2"]),
               ("ZeRO-3", 2, z3), ("DDP on 4 ranks", 4, []),
               ("ZeRO-3, parameters and optimizer on NVMe", 2,
                z3 + ["--offload-param", "nvme", "--offload-optimizer", "nvme", "--nvme-path", tmp]),
               ("full recomputation", 1, ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                          "--recompute-num-layers", "2"]),
               ("T 2", 2, tp2), ("T 2 + SP", 2, tp2 + ["--sequence-parallel"]), ("T 2 x DP 2", 4, tp2),
               ("T 2 + SP x DP 2, ZeRO-3, selective", 4, tp2 + ["--sequence-parallel", "--recompute-activations"] + z3),
               ("P 2", 2, pp2), ("P 2 interleaved", 2, pp2 + ["--num-layers-per-virtual-pipeline-stage", "1"]),
               ("T 2 x P 2", 4, tp2 + pp2), ("T 2 x P 2 x DP 2, distributed optimizer", 8,
                                             tp2 + pp2 + ["--use-distributed-optimizer"])]
    for dt, which in (("--bf16", layouts), ("--fp16", layouts[:1] + layouts[7:8]), ("", layouts[9:10] + layouts[13:14])):
        name = dt.lstrip("-") or "fp32"
        dts = [dt] if dt else []
        one = lib.tiny_run(tmp, f"llama-inv-{name}", 1, inv + dts)
        for tag, n, extra in which:
            run_tag = f"llama-inv-{name}-{layouts.index((tag, n, extra))}"
            lib.same_run(f"llama --layout-invariant {name}, {tag}", one, lib.tiny_run(tmp, run_tag, n, inv + dts + extra))
        if dt != "--bf16":
            continue
        # saved at step 10 under T 2 x P 2, resumed in one process and under DP 2 x ZeRO-3: steps 11-20 bit for bit
        lib.tiny_run(tmp, "llama-inv-first", 4, inv + dts + tp2 + pp2 + ["--save-interval", "10"])
        at10 = os.path.join(tmp, "llama-inv-first", "iter_0000010")
        for tag, n, extra in (("one process", 1, []), ("DP 2 x ZeRO-3", 2, z3)):
            losses = lib.tiny_run(tmp, f"llama-inv-resume-{n}", n, inv + dts + ["--load", at10] + extra)[0]
            check(f"llama --layout-invariant bf16: saved under T 2 x P 2, resumed under {tag}: steps 11-20 bit for bit",
                  losses == one[0][10:], f"{losses} vs {one[0][10:]}")


# ---- Hugging Face directories, and training against PyTorch ------------------------

HV, HT = 256, 32  # the directories' vocabulary and sequence length


def hf_model(tied, seed, G=2, theta=10000.0, eps=1e-5):
    cfg = LlamaConfig(vocab_size=HV, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=G, max_position_embeddings=HT, rms_norm_eps=eps,
                      rope_theta=theta, tie_word_embeddings=tied)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # every weight moved, the norms too, so a tensor read wrongly shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.05 if p.ndim == 2 else 0.3))
    return model


def window_loss(model, ids):
    """float64 loss of tokens[0:T] predicting tokens[1:T+1]."""
    m = LlamaForCausalLM(model.config).double()
    m.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    with torch.no_grad():
        logits = m.lm_head(m.model(input_ids=ids[None, :-1]).last_hidden_state)[0]
        return torch.nn.functional.cross_entropy(logits, ids[1:]).item()


def loom_eval(tmp, path, shard_path, *extra):
    metrics = os.path.join(tmp, f"eval-{abs(hash((path,) + extra))}.jsonl")
    p = lib.loom("eval", "--load", path, "--valid-data-path", shard_path, "--eval-iters", "1",
                 "--micro-batch-size", "1", "--seq-length", str(HT), "--metrics", metrics, *extra)
    rows = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            rows = [json.loads(line) for line in f if '"val_loss"' in line]
    return (rows[-1]["val_loss"] if p.returncode == 0 and rows else None), p


def convert_round_trip(tmp, tag, model, d, ck, ids):
    """loom convert of transformers' directory, and of a loom checkpoint of it:
    the same tensors bit for bit; converting loom's export again gives the same
    bytes; transformers loads the export and computes the same logits."""
    from safetensors.torch import load_file
    out1, out2, out3 = (os.path.join(tmp, f"conv-{tag[:3]}-{i}") for i in (1, 2, 3))
    ps = [lib.loom("convert", d, out1), lib.loom("convert", out1, out2), lib.loom("convert", ck, out3)]
    if any(p.returncode for p in ps):
        check(f"{tag}: loom convert runs", False, " ".join(p.stderr for p in ps)[-500:])
        return
    src = load_file(os.path.join(d, "model.safetensors"))
    for what, out in (("the directory", out1), ("a loom checkpoint of it", out3)):
        got = load_file(os.path.join(out, "model.safetensors"))
        same = sorted(got) == sorted(src) and all(torch.equal(got[k], src[k]) for k in src)
        check(f"{tag}: loom convert of {what}: every tensor bit for bit", same, f"{sorted(got)} vs {sorted(src)}")
    same = all(open(os.path.join(out1, f), "rb").read() == open(os.path.join(out2, f), "rb").read()
               for f in ("model.safetensors", "config.json", "generation_config.json"))
    check(f"{tag}: converting loom's export again gives the same bytes", same)
    back = LlamaForCausalLM.from_pretrained(out1)
    with torch.no_grad():
        a = model(input_ids=ids[None, :-1]).logits
        b = back(input_ids=ids[None, :-1]).logits
    check(f"{tag}: transformers loads loom's export and computes the same logits", torch.equal(a, b),
          f"max |diff| {(a - b).abs().max().item():.2e}")


def directories(tmp):
    from pyref import shard
    ids = torch.tensor(np.random.default_rng(5).integers(0, HV, HT + 1))
    shard_path = os.path.join(tmp, "window.bin")
    shard.write(shard_path, ids.numpy())
    for tag, tied, G, theta, eps in (("GQA, untied", False, 2, 10000.0, 1e-5),
                                     ("multi-query, tied, theta 500000, eps 1e-6", True, 1, 500000.0, 1e-6)):
        model = hf_model(tied, 3, G, theta, eps)
        d = os.path.join(tmp, f"hf-{G}-{int(tied)}")
        model.save_pretrained(d)
        want = window_loss(model, ids)
        for what, path in (("the directory", d), ("its model.safetensors", os.path.join(d, "model.safetensors"))):
            got, p = loom_eval(tmp, path, shard_path)
            # loom's float32 forward (any thread count: loom eval runs unpinned) against transformers'
            # float64: the window's mean loss carries a few float32 roundings of each sum (u sqrt(K),
            # K <= 4C terms, ~1e-6) averaged over the window: ~1e-7, 1e-5 leaves 100x; a wrong rotary
            # angle, norm or head mapping moves it by 1e-3 or more
            ok = got is not None and abs(got - want) / want <= 1e-5
            check(f"{tag}: loom eval of {what} (no --model) is transformers' loss {want:.6f} "
                  f"(got {got}, tol 1e-5)", ok, p.stderr[-500:])
        # through loom's own file: a checkpoint of it, and the weights file loom saves
        ck = os.path.join(tmp, f"ck-{G}-{int(tied)}")
        p = lib.loom("train", "--load", d, "--finetune", "--lr", "0", "--train-iters", "1", "--data-path",
                     shard_path, "--micro-batch-size", "1", "--seq-length", str(HT), "--eval-iters", "0",
                     "--save", ck, timeout=300)
        got, p2 = loom_eval(tmp, ck, shard_path)
        check(f"{tag}: a loom checkpoint of it (train --load DIR --finetune --lr 0) evaluates the same",
              p.returncode == 0 and got is not None and abs(got - want) / want <= 1e-5, (p.stderr + p2.stderr)[-500:])
        convert_round_trip(tmp, tag, model, d, ck, ids)
    # refusals: one line naming the field, exit 2
    base = os.path.join(tmp, "hf-2-0")
    for field, value, text in (("hidden_act", "gelu", "hidden_act"), ("rope_scaling", {"type": "linear", "factor": 2.0},
                                                                       "rope_scaling"),
                               ("sliding_window", 4096, "unknown field sliding_window"),
                               ("num_key_value_heads", 3, "does not divide")):
        d = os.path.join(tmp, f"bad-{field}")
        os.makedirs(d, exist_ok=True)
        cfg = json.load(open(os.path.join(base, "config.json")))
        cfg[field] = value
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
        if not os.path.exists(os.path.join(d, "model.safetensors")):
            os.symlink(os.path.join(base, "model.safetensors"), os.path.join(d, "model.safetensors"))
        got, p = loom_eval(tmp, d, shard_path)
        lines = lib.error_lines(p.stderr)
        check(f"config.json {field} {json.dumps(value)}: exit 2, one line naming it",
              p.returncode == 2 and len(lines) == 1 and text in lines[0], p.stderr[-300:])
    got, p = loom_eval(tmp, base, shard_path, "--model", "gpt2-tiny")
    lines = lib.error_lines(p.stderr)
    check("--model gpt2-tiny with a Llama directory: exit 2, one line", p.returncode == 2 and len(lines) == 1
          and "holds a Llama model" in lines[0], p.stderr[-300:])


def train_against_torch(tmp):
    """20 steps of `loom train --load DIR` against the same steps in PyTorch
    (float32 LlamaForCausalLM, torch.optim.AdamW with decay on tensors of two
    or more dimensions, clip_grad_norm_, warmup + cosine, llm.c's loader)."""
    from pyref import shard, train
    G, clip = 8, 1.0
    model = hf_model(False, 11)
    d = os.path.join(tmp, "hf-train")
    model.save_pretrained(d)
    tokens = train.make_tokens(30000, 3) % HV
    data = os.path.join(tmp, "train-seq.bin")
    shard.write(data, tokens)
    metrics = os.path.join(tmp, "train-llama.jsonl")
    B = 4
    args = ["--load", d, "--data-path", data, "--data-order", "sequential", "--seq-length", str(HT),
            "--micro-batch-size", B, "--global-batch-size", G, "--train-iters", train.ITERS, "--lr", train.MAX_LR,
            "--min-lr", train.MIN_LR, "--lr-warmup-iters", train.WARMUP, "--lr-decay-style", "cosine",
            "--weight-decay", train.WD, "--adam-beta1", train.BETA1, "--adam-beta2", train.BETA2, "--adam-eps",
            train.EPS, "--clip-grad", clip, "--log-interval", 1, "--eval-iters", 0, "--metrics", metrics,
            "--threads", 2]
    p = lib.loom("train", *[str(a) for a in args], timeout=600)
    if p.returncode != 0:
        check("loom train --load of a Llama directory", False, p.stderr[-500:])
        return
    got = [r["loss"] for r in lib.metrics_rows(metrics)]
    torch.manual_seed(0)
    decay = [q for q in model.parameters() if q.ndim >= 2]
    no_decay = [q for q in model.parameters() if q.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": train.WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=train.MAX_LR, betas=(train.BETA1, train.BETA2), eps=train.EPS)
    nblocks = (len(tokens) - 1) // (G * HT)
    want = []
    for s in range(train.ITERS):
        for g in opt.param_groups:
            g["lr"] = train.lr_at(s + 1)
        opt.zero_grad(set_to_none=True)
        start = (s % nblocks) * G * HT
        block = torch.tensor(tokens[start:start + G * HT + 1].astype(np.int64))
        total = 0.0
        for a in range(G // B):
            x = torch.stack([block[r * HT:(r + 1) * HT] for r in range(a * B, (a + 1) * B)])
            y = torch.stack([block[r * HT + 1:(r + 1) * HT + 1] for r in range(a * B, (a + 1) * B)])
            logits = model.lm_head(model.model(input_ids=x).last_hidden_state)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, HV), y.reshape(-1))
            (loss / (G // B)).backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        want.append(total / (G // B))
    # two float32 implementations, every sum in another order, 20 AdamW steps: tests/test_train_torch.py's
    # bound and reason (1e-4; GPT-2 measures 1.0e-7 there)
    worst = max((abs(a - b) / b for a, b in zip(got, want)), default=1.0)
    check(f"20 training steps from a Llama directory: every step's loss is PyTorch's (worst rel {worst:.1e}, "
          f"tol 1e-4)", len(got) == train.ITERS and worst <= 1e-4, f"{got} vs {want}")


def main():
    for cfg in CONFIGS:
        compare(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        directories(tmp)
        train_against_torch(tmp)
    with tempfile.TemporaryDirectory() as tmp:
        training(tmp)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
