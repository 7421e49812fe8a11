#!/usr/bin/env python3
"""Hugging Face GPT-2 models whose config.json is not GPT-2's default, against
transformers' GPT2LMHeadModel itself (4.39.3, in the test virtual
environment lib.hf_python makes; this script re-runs itself there when
transformers does not import).

Each model is built by transformers from GPT2Config (vocab 256, 64
positions, 2 layers, 64 channels), its random weights perturbed (biases and
LayerNorm parameters too, so a tensor read wrongly shows), saved with
save_pretrained. The validation shard is one window (T + 1 tokens), so
`loom eval --eval-iters 1` computes the loss of exactly the batch the
reference does: F.cross_entropy of the logits of tokens[0:T] against
tokens[1:T+1], float32.

Checks:
  (a) variants n_head 8 (gpt2-tiny's preset has 4), layer_norm_epsilon 0.1,
      activation gelu (erf), gelu_pytorch_tanh, an untied LM head, and all of
      the first, second, third and fifth together: loom's loss on the
      directory is the reference's; so is it on dir/model.safetensors, on
      `loom convert` to a loom safetensors file (no config.json beside it),
      to a Hugging Face directory (which transformers loads back to the same
      logits, with a generation_config.json it reads), to llm.c's .bin where
      that format can say the model (else exit 2), and on a loom checkpoint
      written by `loom train --load DIR --finetune --lr 0`; and the weights
      read with the field at its default give a loss far outside the
      tolerance (the tokens are chosen so), so ignoring a field fails;
      (training with dropout off by flag: the file's GPT2Config 0.1 is the
      run's dropout otherwise, as the dry run's settings show);
  (b) shape flags that contradict the file are exit 2 naming the flag (and
      both values, the integer ones); flags that agree are accepted; a bare
      safetensors file (no config.json, no loom metadata) asks for
      --num-attention-heads; a model trained from the new flags exports
      them to config.json;
  (c) config.json fields that change the math away from GPT-2's are refused
      by eval and convert (exit 2, one line naming the field); fields that
      don't (the hub's gpt2 config.json, explicit defaults) are accepted;
  (d) eval on a file without --data-path reports no corpus floor and
      generates no corpus.
Exits 1 on any failure.
"""
import json
import os
import re
import shutil
import sys
import tempfile

import lib
from lib import check

lib.use_transformers()
import transformers  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel  # noqa: E402

from pyref import shard  # noqa: E402

transformers.logging.set_verbosity_error()
torch.set_num_threads(2)

V, T, L, C = 256, 64, 2, 64
BASE = dict(vocab_size=V, n_positions=T, n_embd=C, n_layer=L, n_head=4)  # 4 heads: gpt2-tiny's preset
# loom and PyTorch both compute in float32 but sum the 64 channels of each
# dot product and the 256 logits of each softmax in different orders: that
# moves a loss of about 6 nats by a few float32 epsilons (1.2e-7) relative.
# 1e-6 allows for that, and is 100 times below what reading any one field at
# its default moves these losses (checked per variant, (a)).
TOL = 1e-6
SEPARATION = 100 * TOL
LOGITS_TOL = 1e-5

VARIANTS = [  # directory, name, config, .bin can say it, the wrong readings (the closest first)
    ("heads", "n_head 8", dict(n_head=8), True, [dict(n_head=4)]),
    ("eps", "layer_norm_epsilon 0.1", dict(layer_norm_epsilon=0.1), False, [dict(layer_norm_epsilon=1e-5)]),
    ("erf", "activation gelu (erf)", dict(activation_function="gelu"), False,
     [dict(activation_function="gelu_new")]),
    ("pttanh", "activation gelu_pytorch_tanh", dict(activation_function="gelu_pytorch_tanh"), True,
     [dict(activation_function="gelu")]),
    ("untied", "untied LM head", dict(tie_word_embeddings=False), False, [dict(tie_word_embeddings=True)]),
    ("all", "n_head 8, epsilon 0.1, gelu, untied",
     dict(n_head=8, layer_norm_epsilon=0.1, activation_function="gelu", tie_word_embeddings=False), False,
     [dict(activation_function="gelu_new"), dict(n_head=4), dict(layer_norm_epsilon=1e-5),
      dict(tie_word_embeddings=True)]),
]


# ---- the reference: transformers --------------------------------------------

def build(seed, **kw):
    """GPT2LMHeadModel of BASE updated by kw, in eval mode, its weights
    perturbed: 0.1 * randn added to every parameter, and the MLP pushed to
    where the two GELUs differ most relative to their value (pre-activations
    around -2.5, the output projection scaled up), so that reading one as the
    other changes the loss beyond TOL."""
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(**dict(BASE, **kw))).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.1 * torch.randn_like(p))
            if name.endswith("mlp.c_fc.bias"):
                p.sub_(2.5)
            if name.endswith("mlp.c_proj.weight"):
                p.mul_(3)
    return model


def reread(model, kw, wrong):
    """model's weights in a model whose config is kw updated by wrong (a tied
    head takes the token embedding)."""
    cfg = GPT2Config(**{**BASE, **kw, **wrong})
    other = GPT2LMHeadModel(cfg).eval()
    sd = {k: v for k, v in model.state_dict().items() if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
    other.load_state_dict(sd, strict=False)
    other.tie_weights()
    return other


def logits(model, ids):
    with torch.no_grad():
        return model(ids[:T][None]).logits[0].float()


def ref_loss(model, ids):
    return F.cross_entropy(logits(model, ids), ids[1:T + 1]).item()


def separating_tokens(model, other, seed):
    """T + 1 tokens, each next one picked (among 32 at random) where model's
    logit most exceeds other's, so that the two losses differ in a sum, not a
    mean that cancels."""
    g = torch.Generator().manual_seed(seed)
    ids = [int(torch.randint(0, V, (1,), generator=g))]
    with torch.no_grad():
        for _ in range(T):
            x = torch.tensor(ids)[None]
            d = model(x).logits[0, -1] - other(x).logits[0, -1]
            cand = torch.randperm(V, generator=g)[:32]
            ids.append(int(cand[d[cand].argmax()]))
    return torch.tensor(ids)


# ---- loom --------------------------------------------------------------------

TMP = None
runs = 0


def evaluate(path, tokens_path, *extra, env=None):
    """`loom eval --load PATH` on the one window of tokens_path with extra
    flags: (the metrics file's last val_loss or None, the process)."""
    global runs
    runs += 1
    metrics = os.path.join(TMP, f"eval-{runs}.jsonl")
    p = lib.loom("eval", "--load", path, "--valid-data-path", tokens_path, "--eval-iters", "1",
                 "--micro-batch-size", "1", "--seq-length", T, "--metrics", metrics, *extra, env=env)
    rows = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            rows = [json.loads(line) for line in f if '"val_loss"' in line]
    return (rows[-1]["val_loss"] if p.returncode == 0 and rows else None), p


def tail(p):
    return f"exit {p.returncode}: {p.stderr.strip()[-1500:]}"


def same_loss(name, got, p, want):
    """One check: loom's loss got (from process p) within TOL of want."""
    if got is None:
        return check(f"{name}: loom's loss is the reference's", False,
                     tail(p) if p.returncode else "exit 0 but no val_loss line in the --metrics file")
    err = lib.rel(got, want)
    return check(f"{name}: loom's loss is the reference's (rel err {err:.1e}, tol {TOL:g})", err <= TOL,
                 f"{got:.9g} vs {want:.9g}")


def says(line, *words):
    """Whether line, its paths left out (they hold digits and names of this
    test's choosing), has every word, a number not as part of a longer one."""
    s = re.sub(re.escape(TMP) + r"\S*", "<path>", line)
    return all(re.search(r"(?<![\w.])" + re.escape(str(w)) + r"(?![\w])(?!\.\d)", s) for w in words)


def refusal(p):
    """The one stderr line of an exit-2 refusal, or None."""
    lines = p.stderr.strip().splitlines()
    if p.returncode == 2 and len(lines) == 1 and lines[0].startswith("loom: error:"):
        return lines[0]
    return None


def refused(name, p, *words, output=None):
    """One check: p is a refusal (exit 2, one 'loom: error:' line) that says
    every word, and left no output."""
    line = refusal(p)
    ok = line is not None and says(line, *words) and not (output and os.path.exists(output))
    return check(f"{name}: exit 2, one line naming {', '.join(str(w) for w in words)}", ok,
                 tail(p) + (f" (and {output} was written)" if output and os.path.exists(output) else ""))


def write_config(d, cfg):
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def read_config(d):
    with open(os.path.join(d, "config.json")) as f:
        return json.load(f)


# ---- (a) the variants ----------------------------------------------------------

def variant(slug, name, kw, llmc_ok, wrongs):
    """Every check of one variant; returns (model, tokens, shard path, reference loss, directory)."""
    base = os.path.join(TMP, slug)
    hf, conv = os.path.join(base, "hf"), os.path.join(base, "conv")
    os.makedirs(conv)
    model = build(1, **kw)
    model.save_pretrained(hf)
    ids = separating_tokens(model, reread(model, kw, wrongs[0]), 5)
    vbin = os.path.join(base, "V.bin")
    shard.write(vbin, ids.numpy())
    want = ref_loss(model, ids)
    away = [(w, lib.rel(ref_loss(reread(model, kw, w), ids), want)) for w in wrongs]
    check(f"{name}: read with the field at its default the loss moves >= {SEPARATION:g} relative "
          f"({', '.join(f'{list(w.items())[0][0]} {e:.1e}' for w, e in away)})",
          all(e >= SEPARATION for _, e in away), "the test cannot tell a wrong reading from rounding")

    got, p = evaluate(hf, vbin)
    same_loss(f"{name}: HF directory", got, p, want)
    got, p = evaluate(os.path.join(hf, "model.safetensors"), vbin)
    same_loss(f"{name}: dir/model.safetensors (config.json beside it)", got, p, want)

    x_st = os.path.join(conv, "x.safetensors")
    p = lib.loom("convert", hf, x_st, timeout=300)
    got, q = evaluate(x_st, vbin) if p.returncode == 0 else (None, p)
    same_loss(f"{name}: convert to a loom safetensors file (no config.json beside it)", got, q, want)

    out = os.path.join(base, "out_hf")
    p = lib.loom("convert", hf, out, timeout=300)
    got, q = evaluate(out, vbin) if p.returncode == 0 else (None, p)
    same_loss(f"{name}: convert to a HF directory", got, q, want)
    if p.returncode == 0:
        try:
            back = GPT2LMHeadModel.from_pretrained(out).eval()
            d = (logits(back, ids) - logits(model, ids)).abs().max().item()
            why = f"max |diff| {d:.2e}; config.json {read_config(out)}"
        except Exception as e:  # noqa: BLE001 (any failure to load is the finding)
            d, why = float("inf"), f"from_pretrained: {type(e).__name__}: {e}"
        check(f"{name}: transformers loads loom's HF directory to the same logits (max |diff| {d:.1e}, "
              f"tol {LOGITS_TOL:g})", d < LOGITS_TOL, why)
        try:
            GenerationConfig.from_pretrained(out)
            ok, why = os.path.isfile(os.path.join(out, "generation_config.json")), "no generation_config.json"
        except Exception as e:  # noqa: BLE001
            ok, why = False, f"{type(e).__name__}: {e}"
        check(f"{name}: the HF directory's generation_config.json loads in transformers", ok, why)
    else:
        check(f"{name}: transformers loads loom's HF directory", False, tail(p))

    x_bin = os.path.join(conv, "x.bin")
    p = lib.loom("convert", hf, x_bin, timeout=300)
    if llmc_ok:
        got, q = evaluate(x_bin, vbin) if p.returncode == 0 else (None, p)
        same_loss(f"{name}: convert to llm.c .bin", got, q, want)
    else:
        check(f"{name}: convert to llm.c .bin is refused (the format cannot say the model): exit 2, one line, "
              "no file", refusal(p) is not None and not os.path.exists(x_bin), tail(p))

    ck, train_metrics = os.path.join(base, "ck"), os.path.join(base, "train.jsonl")
    # dropout off by flag (the file's GPT2Config 0.1 would drop while training; the flags win over it)
    p = lib.loom("train", "--load", hf, "--finetune", "--train-iters", "1", "--lr", "0", "--weight-decay", "0",
                 "--hidden-dropout", "0", "--attention-dropout", "0", "--embedding-dropout", "0",
                 "--micro-batch-size", "1", "--global-batch-size", "1", "--seq-length", T, "--data-path", vbin,
                 "--valid-data-path", vbin, "--eval-interval", "0", "--eval-iters", "1", "--save", ck,
                 "--metrics", train_metrics, timeout=300)
    rows = lib.metrics_rows(train_metrics)
    if p.returncode == 0 and rows:
        same_loss(f"{name}: train --load DIR, step 1", rows[0]["loss"], p, want)
    else:
        check(f"{name}: train --load DIR runs", False, tail(p))
    got, q = evaluate(ck, vbin) if p.returncode == 0 else (None, p)
    same_loss(f"{name}: loom checkpoint of train --load DIR --finetune --lr 0", got, q, want)
    return model, ids, vbin, want, hf


# ---- (b) flags -----------------------------------------------------------------

def flags(heads, everything):
    """Shape flags against the file: heads is variant 1's (model, ids, shard,
    loss, dir), everything variant 6's."""
    model, ids, vbin, want, hf = heads
    _, p = evaluate(hf, vbin, "--num-attention-heads", "4")
    refused("--num-attention-heads 4 on an n_head 8 config.json", p, "--num-attention-heads", 4, 8)
    got, p = evaluate(hf, vbin, "--num-attention-heads", "8")
    same_loss("--num-attention-heads 8 agreeing with config.json", got, p, want)
    _, p = evaluate(hf, vbin, "--hidden-size", "32")
    refused("--hidden-size 32 on a 64-channel file", p, "--hidden-size", 32, 64)
    _, p = evaluate(hf, vbin, "--num-layers", "3")
    refused("--num-layers 3 on a 2-layer file", p, "--num-layers", 3, 2)
    p = lib.loom("train", "--dry-run", "--load", hf, "--data-path", vbin)
    line = [ln for ln in p.stdout.splitlines() if ln.split()[:1] == ["num-attention-heads"]]
    check("train --dry-run --load DIR: the settings table says the heads came from --load",
          p.returncode == 0 and line and line[0].split()[1:] == ["8", "(--load)"], f"{tail(p)} {line}")
    drops = [ln.split()[:3] for ln in p.stdout.splitlines() if ln.split()[:1] and ln.split()[0].endswith("-dropout")]
    check(f"train --dry-run --load DIR: resid_pdrop, attn_pdrop, embd_pdrop (GPT2Config's 0.1) are the run's "
          f"dropout ({drops})", sorted(drops) == [[f"{k}-dropout", "0.1", "(--load)"]
                                                  for k in ("attention", "embedding", "hidden")], tail(p))
    p = lib.loom("train", "--dry-run", "--load", hf, "--data-path", vbin, "--hidden-dropout", "0.2")
    line = [ln.split()[:3] for ln in p.stdout.splitlines() if ln.split()[:1] == ["hidden-dropout"]]
    check(f"--hidden-dropout 0.2 over the file's 0.1: the flag wins ({line})",
          p.returncode == 0 and line == [["hidden-dropout", "0.2", "(flag)"]], tail(p))
    _, _, vbin6, want6, hf6 = everything
    got, p = evaluate(hf6, vbin6, "--num-attention-heads", "8", "--norm-epsilon", "0.1", "--activation-function",
                      "gelu", "--untie-embeddings-and-output-weights", "--hidden-size", C, "--num-layers", L,
                      "--max-position-embeddings", T, "--vocab-size", V)
    same_loss("every shape flag agreeing with config.json", got, p, want6)
    _, p = evaluate(hf6, vbin6, "--norm-epsilon", "1e-5")
    refused("--norm-epsilon 1e-5 on a layer_norm_epsilon 0.1 config.json", p, "--norm-epsilon")
    _, p = evaluate(hf6, vbin6, "--activation-function", "gelu_new")
    refused("--activation-function gelu_new on a gelu config.json", p, "--activation-function")

    # a Hugging Face Trainer checkpoint-N directory: its own trainer_state.json beside the model
    trainer = os.path.join(TMP, "checkpoint-500")
    shutil.copytree(hf, trainer)
    with open(os.path.join(trainer, "trainer_state.json"), "w") as f:
        json.dump({"best_metric": None, "epoch": 1.0, "global_step": 500, "log_history": []}, f)
    got, p = evaluate(trainer, vbin)
    same_loss("a Hugging Face Trainer checkpoint-N directory (its trainer_state.json is not loom's)", got, p, want)
    # loom's metadata and a config.json beside it that disagree: one of them is wrong
    exported = os.path.join(TMP, "exported")
    q = lib.loom("convert", hf, exported, timeout=300)
    cfg_e = read_config(exported) if q.returncode == 0 else {}
    write_config(exported, dict(cfg_e, n_head=4))
    _, p = evaluate(exported, vbin)
    refused("loom's metadata says 8 heads, the config.json beside it 4", p, "num_attention_heads", 8, 4)
    # a bare safetensors file: Hugging Face's names, no config.json, no metadata
    bare_dir = os.path.join(TMP, "bare")
    os.makedirs(bare_dir)
    bare = os.path.join(bare_dir, "bare.safetensors")
    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
              bare)
    _, p = evaluate(bare, vbin)
    refused("bare safetensors (64 channels) without --num-attention-heads", p, "--num-attention-heads")
    got, p = evaluate(bare, vbin, "--num-attention-heads", "8")
    same_loss("bare safetensors with --num-attention-heads 8", got, p, want)

    # a model made from the new flags: its HF export says them, and transformers agrees
    d = os.path.join(TMP, "flags")
    ck, out = os.path.join(d, "ck"), os.path.join(d, "hf")
    p = lib.loom("train", "--num-layers", L, "--hidden-size", C, "--num-attention-heads", "8",
                 "--max-position-embeddings", T, "--vocab-size", V, "--seq-length", T, "--norm-epsilon", "0.1",
                 "--activation-function", "gelu", "--untie-embeddings-and-output-weights", "--train-iters", "2",
                 "--micro-batch-size", "1", "--global-batch-size", "1", "--data-path", vbin,
                 "--valid-data-path", vbin, "--eval-iters", "1", "--save", ck, timeout=300)
    q = lib.loom("convert", ck, out, timeout=300) if p.returncode == 0 else p
    if q.returncode != 0:
        check("a model trained with --norm-epsilon 0.1 --activation-function gelu --untie-...: converts", False,
              tail(q))
        return
    cfg = read_config(out)
    want_cfg = {"n_head": 8, "layer_norm_epsilon": 0.1, "activation_function": "gelu",
                "tie_word_embeddings": False}
    check("trained with --num-attention-heads 8 --norm-epsilon 0.1 --activation-function gelu "
          "--untie-embeddings-and-output-weights: config.json says so",
          all(cfg.get(k) == v for k, v in want_cfg.items()), str({k: cfg.get(k) for k in want_cfg}))
    got, p = evaluate(ck, vbin)
    try:
        ref = ref_loss(GPT2LMHeadModel.from_pretrained(out).eval(), ids)
    except Exception as e:  # noqa: BLE001
        check("... and transformers loads it", False, f"{type(e).__name__}: {e}")
        return
    same_loss("... and transformers on its HF export gives loom's loss", got, p, ref)


# ---- (c) config.json fields -----------------------------------------------------

REFUSED = [  # field, value, words the line must also have
    ("scale_attn_weights", False, []),
    ("scale_attn_by_inverse_layer_idx", True, []),
    ("n_inner", 128, [128]),
    ("add_cross_attention", True, []),
    ("pruned_heads", {"0": [1]}, []),
    ("activation_function", "relu", ["relu"]),
    ("activation_function", "quick_gelu", ["quick_gelu"]),
    ("activation_function", "silu", ["silu"]),
    ("model_type", "gptj", ["gptj"]),
    ("foo_bar", 1, []),
]


def fields(heads):
    """config.json fields refused and accepted; heads is variant 1's."""
    base = os.path.join(TMP, "default")
    build(2).save_pretrained(base)
    cfg = read_config(base)
    for i, (field, value, words) in enumerate(REFUSED):
        d = os.path.join(TMP, f"refuse-{chr(ord('a') + i)}")  # not named after the field: the line names it
        os.makedirs(d)
        shutil.copy(os.path.join(base, "model.safetensors"), d)
        write_config(d, dict(cfg, **{field: value}))
        tag = f"config.json {field} {json.dumps(value)}"
        _, p = evaluate(d, heads[2])
        refused(f"eval refuses {tag}", p, field, *words)
        out = os.path.join(d + ".safetensors")
        refused(f"convert refuses {tag}", lib.loom("convert", d, out, timeout=300), field, *words, output=out)

    model, ids, vbin, want, hf = heads
    cfg = read_config(hf)
    hub = {  # the hub's gpt2 config.json, its shape made ours
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
        "bos_token_id": 255, "embd_pdrop": 0.1, "eos_token_id": 255, "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": T, "n_embd": C, "n_head": 8, "n_layer": L,
        "n_positions": T, "resid_pdrop": 0.1, "summary_activation": None, "summary_first_dropout": 0.1,
        "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
        "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}}, "vocab_size": V}
    defaults = dict(cfg, n_inner=4 * C, scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
                    add_cross_attention=False, pruned_heads={}, architectures=["GPT2Model"], torch_dtype="float32",
                    use_cache=False, attn_pdrop=0.5, embd_pdrop=0.3, resid_pdrop=0.2, bos_token_id=0, eos_token_id=1,
                    pad_token_id=2, n_ctx=T, tie_word_embeddings=True, max_length=20, do_sample=False)
    for tag, c in (("the hub's gpt2 config.json fields", hub),
                   ("explicit defaults, n_inner 4*n_embd, GPT2Model, dropouts, token ids, use_cache", defaults)):
        d = os.path.join(TMP, "accept-" + ("hub" if c is hub else "defaults"))
        os.makedirs(d)
        shutil.copy(os.path.join(hf, "model.safetensors"), d)
        write_config(d, c)
        got, p = evaluate(d, vbin)
        same_loss(f"accepted: {tag}", got, p, want)
        out = os.path.join(TMP, f"accepted-{'hub' if c is hub else 'defaults'}.safetensors")
        p = lib.loom("convert", d, out, timeout=300)
        check(f"accepted by convert: {tag}", p.returncode == 0, tail(p))


# ---- (d) no corpus floor ----------------------------------------------------------

def no_floor(heads):
    _, _, vbin, want, hf = heads
    cache = os.path.join(TMP, "cache")
    os.makedirs(cache)
    got, p = evaluate(hf, vbin, env=dict(os.environ, XDG_CACHE_HOME=cache))
    made = [os.path.join(r, n) for r, ds, fs in os.walk(cache) for n in ds + fs]
    check("eval without --data-path: runs, no corpus floor printed, nothing generated under XDG_CACHE_HOME",
          got is not None and "corpus floor" not in (p.stdout + p.stderr).lower() and not made,
          f"{tail(p)}\nstdout: {p.stdout.strip()[-500:]}\ncreated: {made[:5]}")


def main():
    global TMP
    if not lib.built(lib.LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        TMP = tmp
        done = {}
        for slug, name, kw, llmc_ok, wrongs in VARIANTS:
            done[slug] = variant(slug, name, kw, llmc_ok, wrongs)
        flags(done["heads"], done["all"])
        fields(done["heads"])
        no_floor(done["heads"])
    return lib.verdict()


sys.exit(main())
