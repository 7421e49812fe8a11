"""Mistral, Qwen2 and Gemma against Hugging Face transformers (PyPI
transformers 4.39.3 in the test-only virtual environment lib.hf_python
makes, on Debian's torch), each from a Hugging Face directory and back.

For each family a small random model (every weight moved from its
initialisation, the norms' too, so a tensor read wrongly shows) is saved by
save_pretrained:

- Mistral: grouped-query attention, sliding_window 5 on sequences of 16
  (transformers 4.39's eager mask lets query i see keys i - 5 .. i, six
  keys: loom's --attention-window 6), untied head;
- Qwen2: q/k/v biases, rope_theta 1e6, untied head;
- Gemma: head_dim 24 on 64 channels and 4 heads (not 64 / 4), multi-query,
  GeGLU, RMSNorm as (1 + w), the embedding scaled by sqrt(64), tied head
  (no padding row: transformers' padding_idx only drops that row's lookup
  gradient, which loom does not).

$BUILD/tests/tools/hf_logits loads the directory through the family
registry (as `loom eval --load DIR` does) and gives the logits of random
tokens: within 1e-5 of transformers' float64 forward of the same float32
weights (loom's float32 sums of at most 4 C = 256 terms are off by a few
units of 2^-24 each, ~1e-6 on logits of size ~1; a wrong norm, scale,
mask or bias moves them by 1e-3 or more). transformers runs its eager
attention: 4.39's sdpa path ignores sliding_window.

20 training steps of `loom train --load DIR` (accumulation 2, clipping,
warmup + cosine) give PyTorch's per-step losses (float32 model,
torch.optim.AdamW with decay on tensors of two or more dimensions) within
1e-5 relative: two float32 implementations that sum in other orders drift
apart by ~1e-7 over 20 steps (Llama measures 1.3e-7 in test_llama_hf.py).

`loom convert` of the directory writes a directory whose tensors are the
source's bit for bit, which transformers loads with no missing or
unexpected keys and the same logits, and which converts again to the same
bytes; a loom checkpoint of the trained model converts to a directory
transformers loads with no missing or unexpected keys.

Layouts (each family's tiny preset cut to 4 layers of 64 channels on the
built-in corpus, 20 steps): TP 2 + SP, PP 2 and ZeRO-3 on 2 ranks give one
process's per-step losses and final weights within lib.compare_runs' 1e-5
(float32 sums in another order); `--layout-invariant 2` in bf16 gives one
process's run bit for bit on TP 2 x PP 2 (4 ranks).
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
from safetensors.torch import load_file  # noqa: E402
from transformers import (GemmaConfig, GemmaForCausalLM, MistralConfig, MistralForCausalLM,  # noqa: E402
                          Qwen2Config, Qwen2ForCausalLM)

from pyref import shard, st, train  # noqa: E402

transformers.logging.set_verbosity_error()
torch.set_num_threads(2)

TOOL = lib.tool("hf_logits")
V, T, B = 256, 16, 2
LOGIT_TOL, STEP_TOL = 1e-5, 1e-5
COMMON = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
              attn_implementation="eager")
FAMILIES = {
    "mistral": (MistralForCausalLM, lambda: MistralConfig(intermediate_size=160, num_key_value_heads=2,
                                                           sliding_window=5, tie_word_embeddings=False,
                                                           rms_norm_eps=1e-5, **COMMON)),
    "qwen2": (Qwen2ForCausalLM, lambda: Qwen2Config(intermediate_size=160, num_key_value_heads=2, rope_theta=1e6,
                                                    tie_word_embeddings=False, **COMMON)),
    # pad_token_id None: GemmaConfig's default 0 makes nn.Embedding(padding_idx=0), which drops the lookup's
    # gradient of row 0; loom's embedding has no padding row (the forward is the same either way)
    "gemma": (GemmaForCausalLM, lambda: GemmaConfig(intermediate_size=160, num_key_value_heads=1, head_dim=24,
                                                    hidden_activation="gelu_pytorch_tanh", pad_token_id=None,
                                                    **COMMON)),
}


def hf_model(family, seed):
    cls, make = FAMILIES[family]
    torch.manual_seed(seed)
    model = cls(make())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.05 if p.ndim == 2 else 0.3))
    return model


def forward(model, ids):
    """The body and the head called directly (forward casts the logits)."""
    return model.lm_head(model.model(input_ids=ids).last_hidden_state)


def logits_check(family, model, d, tmp):
    rows = np.random.default_rng(1).integers(0, V, size=(B, T + 1), dtype=np.int32)
    tpath, out = os.path.join(tmp, f"{family}.i32"), os.path.join(tmp, f"{family}-logits.safetensors")
    rows.tofile(tpath)
    p = lib.run([TOOL, d, tpath, out, str(B), str(T)])
    if p.returncode != 0:
        return check(f"{family}: hf_logits runs", False, p.stderr[-500:])
    ref = type(model)(model.config).double()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    torch.set_default_dtype(torch.float64)  # 4.39 builds the float64 model's causal mask in the default dtype
    try:
        with torch.no_grad():
            want = forward(ref, torch.tensor(rows[:, :T], dtype=torch.long)).numpy()
    finally:
        torch.set_default_dtype(torch.float32)
    got = st.load(out)["logits"]
    diff = float(np.max(np.abs(got.astype(np.float64) - want)))
    check(f"{family}: logits of a random model, max |loom - transformers (float64)| {diff:.1e} "
          f"(max |logit| {np.max(np.abs(want)):.2f}, tol {LOGIT_TOL:g})", diff <= LOGIT_TOL)
    return diff


def loads_cleanly(family, out):
    cls = FAMILIES[family][0]
    back, info = cls.from_pretrained(out, output_loading_info=True, attn_implementation="eager")
    missing, unexpected = info["missing_keys"], info["unexpected_keys"]
    # a tied head is no key of its own: transformers reports nothing for it
    return back, not missing and not unexpected, f"missing {missing}, unexpected {unexpected}"


def convert_check(family, model, d, tmp):
    out1, out2 = os.path.join(tmp, f"{family}-conv-1"), os.path.join(tmp, f"{family}-conv-2")
    ps = [lib.loom("convert", d, out1), lib.loom("convert", out1, out2)]
    if any(p.returncode for p in ps):
        return check(f"{family}: loom convert runs", False, " ".join(p.stderr for p in ps)[-500:])
    src, got = load_file(os.path.join(d, "model.safetensors")), load_file(os.path.join(out1, "model.safetensors"))
    check(f"{family}: loom convert of the directory: every tensor bit for bit",
          sorted(got) == sorted(src) and all(torch.equal(got[k], src[k]) for k in src), f"{sorted(got)} vs {sorted(src)}")
    check(f"{family}: converting loom's export again gives the same bytes",
          all(open(os.path.join(out1, f), "rb").read() == open(os.path.join(out2, f), "rb").read()
              for f in ("model.safetensors", "config.json", "generation_config.json")))
    back, clean, why = loads_cleanly(family, out1)
    check(f"{family}: transformers loads loom's export with no missing or unexpected keys", clean, why)
    ids = torch.tensor(np.random.default_rng(2).integers(0, V, size=(1, T)))
    with torch.no_grad():
        a, b = forward(model, ids), forward(back, ids)
    check(f"{family}: ... and computes the same logits", torch.equal(a, b),
          f"max |diff| {(a - b).abs().max().item():.2e}")


def train_check(family, model, d, tmp):
    """20 steps of `loom train --load DIR` against the same steps in PyTorch."""
    G, clip, HT = 8, 1.0, T
    tokens = train.make_tokens(30000, 3) % V
    data = os.path.join(tmp, f"{family}-train.bin")
    shard.write(data, tokens)
    metrics, ck = os.path.join(tmp, f"{family}-train.jsonl"), os.path.join(tmp, f"{family}-ck")
    args = ["--load", d, "--data-path", data, "--data-order", "sequential", "--seq-length", HT,
            "--micro-batch-size", G // 2, "--global-batch-size", G, "--train-iters", train.ITERS, "--lr",
            train.MAX_LR, "--min-lr", train.MIN_LR, "--lr-warmup-iters", train.WARMUP, "--lr-decay-style", "cosine",
            "--weight-decay", train.WD, "--adam-beta1", train.BETA1, "--adam-beta2", train.BETA2, "--adam-eps",
            train.EPS, "--clip-grad", clip, "--log-interval", 1, "--eval-iters", 0, "--metrics", metrics,
            "--threads", 2, "--save", ck]
    p = lib.loom("train", *[str(a) for a in args], timeout=600)
    if p.returncode != 0:
        return check(f"{family}: loom train --load of its directory", False, p.stderr[-500:])
    got = [r["loss"] for r in lib.metrics_rows(metrics)]
    decay = [q for q in model.parameters() if q.ndim >= 2]
    no_decay = [q for q in model.parameters() if q.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": train.WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=train.MAX_LR, betas=(train.BETA1, train.BETA2), eps=train.EPS)
    nblocks, want = (len(tokens) - 1) // (G * HT), []
    for s in range(train.ITERS):
        for g in opt.param_groups:
            g["lr"] = train.lr_at(s + 1)
        opt.zero_grad(set_to_none=True)
        start = (s % nblocks) * G * HT
        block = torch.tensor(tokens[start:start + G * HT + 1].astype(np.int64))
        total = 0.0
        for a in range(2):
            rows = range(a * G // 2, (a + 1) * G // 2)
            x = torch.stack([block[r * HT:(r + 1) * HT] for r in rows])
            y = torch.stack([block[r * HT + 1:(r + 1) * HT + 1] for r in rows])
            loss = torch.nn.functional.cross_entropy(forward(model, x).reshape(-1, V), y.reshape(-1))
            (loss / 2).backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        want.append(total / 2)
    worst = max((abs(a - b) / b for a, b in zip(got, want)), default=1.0)
    check(f"{family}: 20 training steps from its directory, every loss PyTorch's (worst rel {worst:.1e}, "
          f"tol {STEP_TOL:g})", len(got) == train.ITERS and worst <= STEP_TOL, f"{got} vs {want}")
    out = os.path.join(tmp, f"{family}-ck-hf")
    p = lib.loom("convert", ck, out)
    _, clean, why = loads_cleanly(family, out) if p.returncode == 0 else (None, False, p.stderr[-300:])
    check(f"{family}: its trained checkpoint converts to a directory transformers loads with no missing or "
          "unexpected keys", clean, why)
    if p.returncode == 0:  # and the settings that change the function, as the source states them
        src, got = (json.load(open(os.path.join(x, "config.json"))) for x in (d, out))
        keys = ("sliding_window", "head_dim", "rope_theta", "rms_norm_eps", "num_key_value_heads", "tie_word_embeddings")
        if src.get("use_sliding_window") is False:
            keys = keys[1:]  # Qwen2's window is off: without effect, exported as null
        differ = [k for k in keys if k in src and src[k] != got.get(k)]
        check(f"{family}: ... whose config.json states the source's {', '.join(k for k in keys if k in src)}",
              not differ, f"{[(k, src[k], got.get(k)) for k in differ]}")
    return worst


def layouts(family, tmp):
    """The tiny preset on the built-in corpus: TP 2 + SP, PP 2, ZeRO-3 within
    1e-5 of one process; --layout-invariant 2 on TP 2 x PP 2 bit for bit."""
    base = ["--model", f"{family}-tiny", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
            "--num-query-groups", "2", "--ffn-hidden-size", "128", "--seq-length", "16", "--max-position-embeddings",
            "16", "--global-batch-size", "8", "--micro-batch-size", "1"]
    if family == "mistral":
        base += ["--attention-window", "6"]
    if family == "gemma":
        base += ["--kv-channels", "24"]
    one = lib.tiny_run(tmp, f"{family}-one", 1, base)
    tp2, pp2 = ["--tensor-model-parallel-size", "2"], ["--pipeline-model-parallel-size", "2"]
    for tag, n, extra in (("TP 2 + SP", 2, tp2 + ["--sequence-parallel"]), ("PP 2", 2, pp2),
                          ("ZeRO-3", 2, ["--zero-stage", "3"])):
        lib.compare_runs(f"{family} {tag}", one, lib.tiny_run(tmp, f"{family}-{tag[:4].strip()}", n, base + extra))
    inv = base + ["--layout-invariant", "2", "--bf16"]
    one_inv = lib.tiny_run(tmp, f"{family}-inv-one", 1, inv)
    lib.same_run(f"{family} --layout-invariant 2, TP 2 x PP 2", one_inv,
                 lib.tiny_run(tmp, f"{family}-inv-tp2pp2", 4, inv + tp2 + pp2))


def main():
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        for family in FAMILIES:
            model = hf_model(family, 3)
            d = os.path.join(tmp, f"hf-{family}")
            model.save_pretrained(d)
            cfg = json.load(open(os.path.join(d, "config.json")))
            check(f"{family}: transformers wrote model_type {cfg['model_type']}", cfg["model_type"] == family)
            figures[family] = [logits_check(family, model, d, tmp)]
            convert_check(family, model, d, tmp)
            figures[family].append(train_check(family, model, d, tmp))
            layouts(family, tmp)
    for family, (logit, step) in figures.items():
        print(f"     {family}: max logit diff {logit}, max loss rel diff over 20 steps {step}")
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
