#!/usr/bin/env python3
"""Packed documents: Megatron's --reset-position-ids, --reset-attention-mask
and --eod-mask-loss against PyTorch.

Data: test_train_torch's token chain with the end-of-document token
(--eod-token-id 5) replacing about one token in eight, so every row of 32
holds several documents, some ending on a row's last token.

GPT-2 (tests/pyref/gpt2.py in float32, the masks and positions from
gpt2.ltor_masks_and_position_ids, Megatron's get_ltor_masks_and_position_ids
written out; the loss the mean over the tokens the loss mask keeps, per
micro-batch): 20 steps of `loom train` with two accumulated micro-batches
and clipping, for the three settings together and each alone. Checked per
step, with test_train_torch's bounds and reasons: loss and gradient norm
within 1e-4 relative (two float32 programs summing in other orders; measured
in the 1e-7s). So that the checks can fail: the reference without documents
is at least 10x the bound away from the one with them, for each setting.

Llama (transformers 4.39's LlamaForCausalLM, rotary positions, grouped
query attention, float32): the reference needs no mask at all. With
positions and attention both restarting, a packed row is its documents run
as sequences of their own, so each document is run through transformers
alone (positions from 0) and the losses of the tokens whose input is not
the end-of-document token are averaged. 20 steps of `loom train --load DIR`
(accumulation 2, clipping, warmup + cosine): every loss within 1e-5
relative, test_families_hf's bound (two float32 programs over 20 steps,
measured about 1e-7); the whole rows run causally are far off (checked).

Layouts, all three settings on, GPT-2 and Llama tiny models: TP 2 + SP,
PP 2 and ZeRO-3 on 2 ranks give one process's per-step losses and the whole
model's final weights within lib.compare_runs' 1e-5 (float32 sums in another
order), each tensor within TENSOR_TOL (below, with its reason).
"""
import os
import sys
import tempfile

import lib
from lib import check, rel

lib.use_transformers()
import transformers  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from pyref import shard, st, train  # noqa: E402
from pyref.train import B, ITERS, T  # noqa: E402

transformers.logging.set_verbosity_error()
torch.set_num_threads(2)

EOD = 5
TOL, LLAMA_TOL = 1e-4, 1e-5
# One tensor's final weights under another layout: lib.compare_runs judges a
# tensor past 1e-5 against the run's own reordering, remade with other
# micro-batch sizes; under --eod-mask-loss that is not the same math (the
# loss is a mean per micro-batch over the tokens kept), so it cannot be
# measured so here. Adam's per-element steps (see lib.REORDER_FACTOR) move
# the worst tensor by 1.8e-5 under TP 2 + SP; 1e-4 leaves 5x, and a wrong
# mask or position moves the weights by 1e-2 or more. The whole model's
# bound stays 1e-5.
TENSOR_TOL = 1e-4
FLAGS = {"reset_position_ids": "--reset-position-ids", "reset_attention_mask": "--reset-attention-mask",
         "eod_mask_loss": "--eod-mask-loss"}


def doc_tokens(n, seed, vocab=train.V):
    """The chain's tokens with EOD in place of about one in eight."""
    toks = train.make_tokens(n, seed) % vocab
    toks[np.random.default_rng(seed + 100).random(n) < 1 / 8] = EOD
    return toks


def gpt2_case(name, on, init, init_path, tokens, data, tmp):
    G, clip = 2 * B, 1.2
    docs = (EOD, "reset_position_ids" in on, "reset_attention_mask" in on, "eod_mask_loss" in on)
    ref = train.reference(init, tokens, G, clip, docs=docs)
    plain = train.reference(init, tokens, G, clip)
    metrics = os.path.join(tmp, f"m_{name}.jsonl")
    extra = ["--eod-token-id", EOD] + [FLAGS[k] for k in on]
    steps, err = lib.train_steps(train.loom_args(init_path, data, G, clip, metrics, extra), metrics)
    if err or sorted(steps) != list(range(1, ITERS + 1)):
        return check(f"gpt2 {name}: loom trains {ITERS} steps", False, err or sorted(steps))
    worst_loss = max(rel(steps[s]["loss"], ref[s - 1][0]) for s in steps)
    worst_norm = max(rel(steps[s]["grad_norm"], ref[s - 1][2]) for s in steps)
    apart = max(max(rel(a[0], b[0]), rel(a[2], b[2])) for a, b in zip(ref, plain))
    check(f"gpt2 {name}: every step's loss and gradient norm PyTorch's (worst {worst_loss:.1e}, {worst_norm:.1e}; "
          f"tol {TOL:g})", worst_loss <= TOL and worst_norm <= TOL)
    check(f"gpt2 {name}: ... and the run without documents is {apart:.1e} away (at least 10x the bound)",
          apart >= 10 * TOL)


def llama_model():
    torch.manual_seed(5)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=train.V, hidden_size=64, intermediate_size=160,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=T, tie_word_embeddings=False,
                                         rms_norm_eps=1e-5, attn_implementation="eager"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.05 if p.ndim == 2 else 0.3))
    return model


def row_loss(model, x, y, split):
    """Summed losses of row x (targets y) whose input is not EOD, and their
    count; split: each document run alone (else the row as one sequence)."""
    cuts = [0] + [i + 1 for i in range(T - 1) if split and x[i] == EOD] + [T]
    total, count = 0.0, 0
    for a, b in zip(cuts, cuts[1:]):
        h = model.model(input_ids=x[a:b][None]).last_hidden_state
        each = torch.nn.functional.cross_entropy(model.lm_head(h)[0], y[a:b], reduction="none")
        keep = (x[a:b] != EOD).to(each.dtype)
        total = total + (each * keep).sum()
        count += int(keep.sum())
    return total, count


def llama_reference(model, tokens, G, clip, split):
    decay = [q for q in model.parameters() if q.ndim >= 2]
    no_decay = [q for q in model.parameters() if q.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": train.WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=train.MAX_LR, betas=(train.BETA1, train.BETA2), eps=train.EPS)
    out = []
    for s in range(ITERS):
        for g in opt.param_groups:
            g["lr"] = train.lr_at(s + 1)
        opt.zero_grad(set_to_none=True)
        x, y = train.batch(tokens, s, G)
        total = 0.0
        for m in range(2):
            rows = [row_loss(model, x[r], y[r], split) for r in range(m * G // 2, (m + 1) * G // 2)]
            loss = sum(r[0] for r in rows) / sum(r[1] for r in rows)
            (loss / 2).backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        out.append(total / 2)
    return out


def llama_case(tokens, data, tmp):
    G, clip = 2 * B, 1.0
    model = llama_model()
    d = os.path.join(tmp, "hf-llama")
    model.save_pretrained(d)
    metrics = os.path.join(tmp, "m_llama.jsonl")
    args = ["--load", d, "--data-path", data, "--data-order", "sequential", "--seq-length", T,
            "--micro-batch-size", G // 2, "--global-batch-size", G, "--train-iters", ITERS, "--lr", train.MAX_LR,
            "--min-lr", train.MIN_LR, "--lr-warmup-iters", train.WARMUP, "--lr-decay-style", "cosine",
            "--weight-decay", train.WD, "--adam-beta1", train.BETA1, "--adam-beta2", train.BETA2, "--adam-eps",
            train.EPS, "--clip-grad", clip, "--log-interval", 1, "--eval-iters", 0, "--metrics", metrics,
            "--threads", 2, "--eod-token-id", EOD, *FLAGS.values()]
    p = lib.loom("train", *[str(a) for a in args], timeout=600)
    if p.returncode != 0:
        return check("llama: loom train --load with packed documents", False, p.stderr[-500:])
    got = [r["loss"] for r in lib.metrics_rows(metrics)]
    want = llama_reference(model, tokens, G, clip, split=True)
    whole = llama_reference(llama_model(), tokens, G, clip, split=False)
    worst = max((rel(a, b) for a, b in zip(got, want)), default=1.0)
    apart = max(rel(a, b) for a, b in zip(want, whole))
    check(f"llama: 20 steps with packed documents, every loss that of its documents run alone in transformers "
          f"(worst rel {worst:.1e}, tol {LLAMA_TOL:g})", len(got) == ITERS and worst <= LLAMA_TOL, f"{got} vs {want}")
    check(f"llama: ... and the rows run whole are {apart:.1e} away (at least 10x the bound)", apart >= 10 * LLAMA_TOL)


def layouts(tmp):
    rng = np.random.default_rng(9)
    toks = train.make_tokens(200000, 9) % 256
    toks[rng.random(len(toks)) < 1 / 6] = EOD
    shard.write(os.path.join(tmp, "train.bin"), toks)
    docs = ["--eod-token-id", str(EOD), *FLAGS.values(), "--global-batch-size", "8", "--micro-batch-size", "2"]
    tp2, pp2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel"], ["--pipeline-model-parallel-size", "2"]
    for family, base in (("gpt2", []), ("llama", ["--model", "llama-tiny", "--num-query-groups", "2"])):
        one = lib.tiny_run(tmp, f"{family}-docs-one", 1, base + lib.TINY_MODEL + docs)
        for tag, extra in (("TP 2 + SP", tp2), ("PP 2", pp2), ("ZeRO-3", ["--zero-stage", "3"])):
            got = lib.tiny_run(tmp, f"{family}-docs-{tag[:4].strip()}", 2, base + lib.TINY_MODEL + docs + extra)
            lib.compare_runs(f"{family} packed documents, {tag}", tuple(one), got, tensor_tol=TENSOR_TOL)


def main():
    if not lib.built(lib.LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        init = train.initial_weights()
        init_path = os.path.join(tmp, "init.safetensors")
        st.save(init_path, init, {"format": "pt"})
        tokens = doc_tokens(ITERS * 2 * B * T + 1 + 11, 21)
        data = os.path.join(tmp, "docs.bin")
        shard.write(data, tokens)
        print(f"   {int((tokens == EOD).sum())} end-of-document tokens in {len(tokens)}")
        gpt2_case("all three", list(FLAGS), init, init_path, tokens, data, tmp)
        for k in FLAGS:
            gpt2_case(FLAGS[k], [k], init, init_path, tokens, data, tmp)
        llama_case(tokens, data, tmp)
        layouts(tmp)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
