#!/usr/bin/env python3
"""`loom convert` between llm.c's GPT-2 checkpoint, safetensors and Hugging
Face directories.

llm.c files are written here the way llm.c's train_gpt2.py `write_model`
writes them (header of 256 int32, vocabulary padded, parameters in llm.c's
order, nn.Linear weights [out, in]), from random weights: biases and
LayerNorm parameters randomised too, so that a tensor put in the wrong slot
or left untransposed changes the logits. Checks:
  (a) llm.c -> safetensors / HF directory -> llm.c gives the same bytes, for
      float32 (version 3) and bfloat16 (version 5), zero and non-zero padding
      rows, Vp > V and Vp == V; a loom-style safetensors file (no llm.c
      metadata) -> llm.c gets Vp rounded up to 128 and zero padding;
  (b) the converted weights under Hugging Face names and shapes give the
      same logits in PyTorch (tests/pyref, float64), in loom
      (tests/tools/gpt2_grads), and in a forward written here directly on the
      llm.c arrays with F.linear, which proves the [out, in] layout;
  (c) bad inputs (wrong magic, unsupported version, truncated, trailing
      bytes, absurd header sizes, ...) are exit 2 with one line naming the
      file, also under the sanitizer build when build/asan-loom exists.
Exits 1 on any failure.
"""
import json
import os
import shutil
import struct
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

import lib
from lib import check
from pyref import gpt2, st

GRADS = lib.tool("gpt2_grads")
# Absolute, on logits of scale 3.7 (max |x|): loom's float32 forward against
# float64 ones, sums of up to 4C = 256 terms two layers deep, errs by about
# u sqrt(K) = 1e-6 of the scale per sum in the worst usual order (u = 2^-24),
# a few of those, at any thread count or BLAS core; measured 1.4e-6 (7x
# under). The two float64 forwards differ by 0 (measured). A tensor read
# from the wrong place or layout errs by 1e-1 or more.
LOGITS_TOL = 1e-5
MAGIC = 20240326


def loom(*args, exe=lib.LOOM, env=None):
    """`loom convert ARGS`."""
    return lib.loom("convert", *args, timeout=300, exe=exe, env=env)


# ---- llm.c's side, written from its train_gpt2.py -------------------------

def llmc_layer_names(i):
    """llm.c's per-layer tensors in file order (PyTorch nn.Linear names)."""
    p = f"transformer.h.{i}."
    return [p + n for n in ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                            "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                            "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")]


def llmc_random_params(L, C, V, maxT, seed):
    """Weights of llm.c's GPT (nn.Linear layout [out, in]), random."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape, std=0.1: std * torch.randn(*shape, generator=g)  # noqa: E731
    p = {"transformer.wte.weight": r(V, C), "transformer.wpe.weight": r(maxT, C),
         "transformer.ln_f.weight": 1 + r(C), "transformer.ln_f.bias": r(C)}
    for i in range(L):
        w = dict(zip(llmc_layer_names(i), [1 + r(C), r(C), r(3 * C, C), r(3 * C), r(C, C), r(C), 1 + r(C), r(C),
                                           r(4 * C, C), r(4 * C), r(C, 4 * C), r(C)]))
        p.update(w)
    return p


def llmc_write(path, params, L, NH, Vp, dtype="float32", padding=None, header_patch=None, tail=b""):
    """As train_gpt2.py's write_model: header, wte padded to Vp rows (zeros,
    or `padding`), then every tensor in llm.c's order."""
    wte = params["transformer.wte.weight"]
    V, C = wte.shape
    maxT = params["transformer.wpe.weight"].shape[0]
    header = torch.zeros(256, dtype=torch.int32)
    header[0], header[1] = MAGIC, {"float32": 3, "bfloat16": 5}[dtype]
    header[2], header[3], header[4], header[5], header[6], header[7] = maxT, V, L, NH, C, Vp
    for k, v in (header_patch or {}).items():
        header[k] = v
    pad = F.pad(wte, (0, 0, 0, Vp - V)) if padding is None else torch.cat([wte, padding])
    order = [pad, params["transformer.wpe.weight"]]
    for j in range(12):  # each kind for all layers, then the next kind
        order += [params[llmc_layer_names(i)[j]] for i in range(L)]
    order += [params["transformer.ln_f.weight"], params["transformer.ln_f.bias"]]
    with open(path, "wb") as f:
        f.write(header.numpy().tobytes())
        for t in order:
            if dtype == "float32":
                f.write(t.detach().to(torch.float32).numpy().tobytes())
            else:
                f.write(t.detach().to(torch.bfloat16).view(torch.int16).numpy().tobytes())
        f.write(tail)


def llmc_read(path):
    """An llm.c file back into (header, {llm.c name: float32 tensor}, padding
    rows): a reader written here from the layout, independent of loom's."""
    raw = open(path, "rb").read()
    h = np.frombuffer(raw[:1024], dtype="<i4")
    version, maxT, V, L, NH, C, Vp = (int(x) for x in h[1:8])
    if version == 3:
        data = np.frombuffer(raw[1024:], dtype="<f4")
    else:
        data = (np.frombuffer(raw[1024:], dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    pos = 0

    def take(*shape):
        nonlocal pos
        n = int(np.prod(shape))
        a = torch.from_numpy(data[pos:pos + n].copy()).reshape(shape)
        pos += n
        return a

    wte = take(Vp, C)
    p = {"transformer.wte.weight": wte[:V], "transformer.wpe.weight": take(maxT, C)}
    shapes = [(C,), (C,), (3 * C, C), (3 * C,), (C, C), (C,), (C,), (C,), (4 * C, C), (4 * C,), (C, 4 * C), (C,)]
    for j, shape in enumerate(shapes):
        for i in range(L):
            p[llmc_layer_names(i)[j]] = take(*shape)
    p["transformer.ln_f.weight"], p["transformer.ln_f.bias"] = take(C), take(C)
    assert pos == len(data)
    return h, p, wte[V:]


def llmc_forward(p, L, NH, idx):
    """llm.c's GPT forward on its own arrays: nn.Linear weights used as
    F.linear does (x @ W.T), tanh GELU, LM head tied to wte. float64."""
    p = {k: v.double() for k, v in p.items()}
    B, T = idx.shape
    C = p["transformer.wte.weight"].shape[1]
    x = p["transformer.wte.weight"][idx] + p["transformer.wpe.weight"][:T][None]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(L):
        n = dict(zip(["ln1w", "ln1b", "qkvw", "qkvb", "attw", "attb", "ln2w", "ln2b", "fcw", "fcb", "fcpw", "fcpb"],
                     [p[k] for k in llmc_layer_names(i)]))
        h = F.layer_norm(x, (C,), n["ln1w"], n["ln1b"], 1e-5)
        q, k, v = F.linear(h, n["qkvw"], n["qkvb"]).split(C, dim=2)
        q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (C // NH) ** 0.5
        y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        x = x + F.linear(y.transpose(1, 2).reshape(B, T, C), n["attw"], n["attb"])
        h = F.layer_norm(x, (C,), n["ln2w"], n["ln2b"], 1e-5)
        x = x + F.linear(F.gelu(F.linear(h, n["fcw"], n["fcb"]), approximate="tanh"), n["fcpw"], n["fcpb"])
    x = F.layer_norm(x, (C,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], 1e-5)
    return x @ p["transformer.wte.weight"].t()


def same_bytes(a, b):
    x, y = open(a, "rb").read(), open(b, "rb").read()
    if x == y:
        return True, ""
    n = min(len(x), len(y))
    first = next((i for i in range(n) if x[i] != y[i]), n)
    return False, f"sizes {len(x)} vs {len(y)}, first difference at byte {first}"


def hf_names(L):
    """GPT2LMHeadModel's tensors as the hub's gpt2 model.safetensors names
    them (no transformer. prefix; the tied lm_head left out)."""
    return set(gpt2.param_names(gpt2.Config(L, 1, 1, 1, 1)))


with tempfile.TemporaryDirectory() as tmp:
    P = lambda name: os.path.join(tmp, name)  # noqa: E731

    # ---- (a) round trips ---------------------------------------------------
    L, C, NH, maxT, V, Vp = 2, 64, 4, 32, 100, 128
    params = llmc_random_params(L, C, V, maxT, seed=1)
    g = torch.Generator().manual_seed(7)
    padding = 0.05 * torch.randn(Vp - V, C, generator=g)
    padding[0, 0] = -0.0  # a set sign bit is not zero
    padding[1] = 0.0

    cases = [  # name, file, dtype, padding, V, Vp, L, C, NH
        ("fp32, zero padding", "zero.bin", "float32", None, V, Vp, L, C, NH),
        ("fp32, non-zero padding", "pad.bin", "float32", padding, V, Vp, L, C, NH),
        ("bf16, non-zero padding", "bf16.bin", "bfloat16", padding, V, Vp, L, C, NH),
        ("fp32, Vp == V", "nopad.bin", "float32", None, 64, 64, 1, 32, 2),
    ]
    for name, fname, dtype, pad, v, vp, nl, c, nh in cases:
        prm = params if v == V else llmc_random_params(nl, c, v, 16, seed=3)
        llmc_write(P(fname), prm, nl, nh, vp, dtype, padding=pad)
        stem = fname[:-4]
        p = loom(P(fname), P(stem + ".safetensors"))
        q = loom(P(stem + ".safetensors"), P(stem + ".back.bin"))
        ok, why = same_bytes(P(fname), P(stem + ".back.bin")) if p.returncode == 0 and q.returncode == 0 else (
            False, p.stderr + q.stderr)
        check(f"{name}: llm.c -> safetensors -> llm.c is byte-identical", ok, why)
        p = loom(P(fname), P(stem + "_hf"))
        q = loom(P(stem + "_hf"), P(stem + ".back2.bin"))
        ok, why = same_bytes(P(fname), P(stem + ".back2.bin")) if p.returncode == 0 and q.returncode == 0 else (
            False, p.stderr + q.stderr)
        check(f"{name}: llm.c -> HF directory -> llm.c is byte-identical", ok, why)
        tensors, meta = st.load(P(stem + ".safetensors"), with_metadata=True)
        has_pad = "llmc.wte_padding" in tensors
        check(f"{name}: metadata keeps version and Vp; padding tensor only when non-zero",
              meta.get("loom.llmc.version") == ("3" if dtype == "float32" else "5")
              and meta.get("loom.llmc.padded_vocab_size") == str(vp) and has_pad == (pad is not None),
              f"{meta} padding tensor: {has_pad}")

    # bf16 -> float32 llm.c: version 3 with the bf16 values exactly
    p = loom(P("bf16.bin"), P("bf16_as_f32.bin"), "--dtype", "float32")
    h32, p32, pad32 = llmc_read(P("bf16_as_f32.bin"))
    h16, p16, pad16 = llmc_read(P("bf16.bin"))
    check("--dtype float32 turns a bf16 file into version 3 with the same values",
          p.returncode == 0 and h32[1] == 3 and all(torch.equal(p32[k], p16[k]) for k in p16)
          and torch.equal(pad32, pad16), p.stderr)
    p = loom(P("pad.bin"), P("pad_bf16.bin"), "--dtype", "bfloat16")
    hb, pb, _ = llmc_read(P("pad.bin"))
    hb16, pb16, _ = llmc_read(P("pad_bf16.bin"))
    check("--dtype bfloat16 writes version 5 rounded to nearest even as torch does",
          p.returncode == 0 and hb16[1] == 5 and os.path.getsize(P("pad_bf16.bin")) ==
          1024 + (os.path.getsize(P("pad.bin")) - 1024) // 2
          and all(torch.equal(pb16[k], pb[k].to(torch.bfloat16).float()) for k in pb), p.stderr)

    # a loom-style safetensors file (no llm.c metadata) -> llm.c
    ref = gpt2.init_weights(gpt2.GPT2(gpt2.Config(L, C, NH, V, maxT)), 5)
    plain = gpt2.to_numpy(ref)
    # loom's metadata as loom wrote it before the numerics were settings: the shape alone
    loom_meta = {"format": "pt", "loom.model": "gpt2", "loom.num_layers": L, "loom.hidden_size": C,
                 "loom.num_attention_heads": NH, "loom.max_position_embeddings": maxT, "loom.vocab_size": V}
    st.save(P("plain.safetensors"), plain, loom_meta)
    p = loom(P("plain.safetensors"), P("plain.bin"))
    hp, pp, padp = llmc_read(P("plain.bin")) if p.returncode == 0 else (np.zeros(8), {}, None)
    transposed = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    same = p.returncode == 0 and all(
        np.array_equal(pp[k].numpy(), plain[k[12:]].T if k.endswith(transposed) else plain[k[12:]]) for k in pp)
    check("loom safetensors -> llm.c: version 3, Vp rounded up to 128, zero padding, [out, in] matrices",
          same and list(hp[:8]) == [MAGIC, 3, maxT, V, L, NH, C, 128] and not padp.any(), p.stderr)
    # Hugging Face's own layout: transformer. prefix, lm_head.weight, mask buffers
    hf = {"transformer." + k: v for k, v in plain.items()}
    hf["lm_head.weight"] = plain["wte.weight"]
    hf["transformer.h.0.attn.bias"] = np.tril(np.ones((1, 1, maxT, maxT), np.float32))
    os.makedirs(P("hub"))
    st.save(P("hub/model.safetensors"), hf, {"format": "pt"})
    with open(P("hub/config.json"), "w") as f:
        json.dump({"model_type": "gpt2", "n_head": NH, "n_embd": C, "n_layer": L, "n_positions": maxT,
                   "vocab_size": V}, f)
    p = loom(P("hub"), P("hub.bin"))
    check("HF directory (prefixed names, lm_head, mask; heads from config.json) -> llm.c",
          p.returncode == 0 and open(P("hub.bin"), "rb").read() == open(P("plain.bin"), "rb").read(), p.stderr)
    p = loom(P("hub/model.safetensors"), P("hub1.bin"))
    check("HF directory's model.safetensors: heads from the config.json beside it",
          p.returncode == 0 and open(P("hub1.bin"), "rb").read() == open(P("plain.bin"), "rb").read(), p.stderr)
    os.makedirs(P("novocab"))
    shutil.copy(P("hub/model.safetensors"), P("novocab/model.safetensors"))
    with open(P("novocab/config.json"), "w") as f:  # no vocab_size: GPT2Config's 50257, not the tensors' V
        json.dump({"model_type": "gpt2", "n_head": NH, "n_embd": C, "n_layer": L, "n_positions": maxT}, f)
    p = loom(P("novocab"), P("hub3.bin"))
    check("config.json whose vocab_size (absent: 50257) disagrees with wte.weight: exit 2 naming both",
          p.returncode == 2 and "leaves out vocab_size, so GPT2Config's default 50257 holds" in p.stderr
          and f"{V} rows of wte.weight" in p.stderr, p.stderr)
    os.makedirs(P("bare"))
    shutil.copy(P("hub/model.safetensors"), P("bare/model.safetensors"))
    p = loom(P("bare/model.safetensors"), P("hub2.bin"))
    check("safetensors without head count (no metadata, no config.json) is exit 2 asking for "
          "--num-attention-heads", p.returncode == 2 and "--num-attention-heads" in p.stderr and
          "model.safetensors" in p.stderr, p.stderr)
    p = loom(P("bare/model.safetensors"), P("hub2.bin"), "--num-attention-heads", str(NH))
    check("... and converts with it", p.returncode == 0 and open(P("hub2.bin"), "rb").read() ==
          open(P("plain.bin"), "rb").read(), p.stderr)
    stray = dict(plain, **{"h.2.mlp.c_fc.weight": plain["h.1.mlp.c_fc.weight"]})
    st.save(P("stray.safetensors"), stray, loom_meta)
    p = loom(P("stray.safetensors"), P("stray.bin"))
    check("a GPT-2 tensor the model lacks (h.2.* in a 2-layer file) is still refused",
          p.returncode == 2 and "h.2.mlp.c_fc.weight" in p.stderr, p.stderr)

    # ---- (b) names, shapes, config.json, logits ------------------------------
    tensors, meta = st.load(P("pad_hf/model.safetensors"), with_metadata=True)
    want = {n: tuple(t.shape) for n, t in gpt2.GPT2(gpt2.Config(L, C, NH, V, maxT)).named_parameters()}
    got = {n: tuple(t.shape) for n, t in tensors.items() if n != "llmc.wte_padding"}
    check("HF directory: GPT2LMHeadModel's names (unprefixed) and Conv1D shapes [in, out]", got == want,
          f"{sorted(set(got) ^ set(want))} {[(n, got[n], want[n]) for n in got if n in want and got[n] != want[n]]}")
    check("HF directory: safetensors metadata format pt", meta.get("format") == "pt", str(meta))
    cfg = json.load(open(P("pad_hf/config.json")))
    expect = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": C, "n_layer": L, "n_head": NH,
              "n_positions": maxT, "n_ctx": maxT, "vocab_size": V, "activation_function": "gelu_new",
              "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
    check("HF directory: config.json is GPT2Config's", all(cfg.get(k) == v for k, v in expect.items()),
          str({k: cfg.get(k) for k in expect if cfg.get(k) != v}))

    B, T = 2, 16
    rows = torch.randint(0, V, (B, T + 1), generator=torch.Generator().manual_seed(11), dtype=torch.int64)
    rows.numpy().astype("<i4").tofile(P("tokens.i32"))
    idx = rows[:, :T]
    lib.run([GRADS, P("pad_hf/model.safetensors"), P("tokens.i32"), P("out.safetensors"), L, C, NH, T, V, B, maxT],
            check=True)
    loom_logits = torch.from_numpy(st.load(P("out.safetensors"))["logits"]).double()
    model = gpt2.load_numpy(gpt2.GPT2(gpt2.Config(L, C, NH, V, maxT)),
                            {k: v for k, v in tensors.items() if k != "llmc.wte_padding"}).double()
    with torch.no_grad():
        torch_logits, _ = model(idx)
    _, direct_params, _ = llmc_read(P("pad.bin"))
    direct = llmc_forward(direct_params, L, NH, idx)
    d1 = (loom_logits - torch_logits).abs().max().item()
    d2 = (torch_logits - direct).abs().max().item()
    d3 = (loom_logits - direct).abs().max().item()
    scale = direct.abs().max().item()
    print(f"     logits max |x| {scale:.3f}; max diff loom vs PyTorch {d1:.2e}, PyTorch (HF names) vs llm.c layout "
          f"{d2:.2e}, loom vs llm.c layout {d3:.2e} (tolerance {LOGITS_TOL})")
    check("logits: loom on the converted file = PyTorch on HF names", d1 <= LOGITS_TOL, f"{d1:.3e}")
    check("logits: PyTorch on HF names = forward on the llm.c arrays (F.linear, [out, in])", d2 <= LOGITS_TOL,
          f"{d2:.3e}")
    check("logits: loom = forward on the llm.c arrays", d3 <= LOGITS_TOL, f"{d3:.3e}")

    # ---- (c) bad inputs --------------------------------------------------------
    good = open(P("zero.bin"), "rb").read()

    def variant(name, patch=None, data=None):
        raw = bytearray(good if data is None else data)
        for slot, value in (patch or {}).items():
            raw[4 * slot:4 * slot + 4] = struct.pack("<i", value)
        with open(P(name), "wb") as f:
            f.write(raw)
        return P(name)

    bad = [
        ("wrong magic", variant("magic.bin", {0: 12345}), "magic"),
        ("an llm.c token shard", variant("shard.bin", {0: 20240520}), "token shard"),
        ("unsupported version 4", variant("v4.bin", {1: 4}), "version 4"),
        ("old version 1", variant("v1.bin", {1: 1}), "version 1"),
        ("truncated", variant("short.bin", data=good[:-100]), "truncated"),
        ("trailing bytes", variant("long.bin", data=good + b"\0" * 8), "too long"),
        ("shorter than the header", variant("tiny.bin", data=good[:100]), "header"),
        ("absurd layer count", variant("layers.bin", {4: 1 << 30}), "num_layers"),
        ("absurd but bounded sizes", variant("huge.bin", {4: 4096, 6: 65536, 5: 64}), "needs"),
        ("zero channels", variant("c0.bin", {6: 0}), "channels"),
        ("negative vocabulary", variant("vneg.bin", {3: -5}), "vocab_size"),
        ("heads not dividing channels", variant("heads.bin", {5: 3}), "divisible"),
        ("padded vocabulary below the vocabulary", variant("vp.bin", {7: 50}), "padded_vocab_size"),
        ("unknown header field", variant("field.bin", {9: 1}), "int 9"),
    ]
    with open(P("garbage.dat"), "wb") as f:
        f.write(b"hello world, not a model")
    for name, path, word in bad:
        p = loom(path, P("x.safetensors"))
        lines = p.stderr.strip().splitlines()
        check(f"bad input, {name}: exit 2, one line naming the file",
              p.returncode == 2 and len(lines) == 1 and lines[0].startswith("loom: error:")
              and os.path.basename(path) in lines[0] and word in lines[0] and not os.path.exists(P("x.safetensors")),
              f"rc {p.returncode}: {p.stderr.strip()}")
    usage = [
        ("missing input", [P("nope.bin"), P("x.bin")], "nope.bin"),
        ("unrecognised input", [P("garbage.dat"), P("x.bin")], "garbage.dat"),
        ("output name without a known kind", [P("zero.bin"), P("x.pt")], "--to"),
        ("unknown --to", [P("zero.bin"), P("x.bin"), "--to", "onnx"], "onnx"),
        ("--dtype with safetensors output", [P("zero.bin"), P("x.safetensors"), "--dtype", "bfloat16"], "--dtype"),
        ("unknown flag", [P("zero.bin"), P("x.bin"), "--frob", "1"], "--frob"),
        ("one argument", [P("zero.bin")], "usage"),
        ("HF directory without model.safetensors", [tmp, P("x.bin")], "model.safetensors"),
        ("heads flag disagreeing with the header", [P("zero.bin"), P("x.bin"), "--num-attention-heads", "2"],
         "disagrees"),
    ]
    for name, args, word in usage:
        p = loom(*args)
        lines = p.stderr.strip().splitlines()
        check(f"bad usage, {name}: exit 2, one line", p.returncode == 2 and len(lines) == 1
              and lines[0].startswith("loom: error:") and word in lines[0], f"rc {p.returncode}: {p.stderr.strip()}")
    # llm.c's format holds GPT-2's architecture only: a Llama model is refused, nothing written
    llama = P("llama-ckpt")
    p = lib.loom("train", "--model", "llama-tiny", "--train-iters", "1", "--eval-iters", "0", "--save", llama,
                 timeout=300)
    check("a llama-tiny checkpoint to convert", p.returncode == 0, p.stderr[-500:])
    p = loom(llama, P("llama.bin"))
    lines = p.stderr.strip().splitlines()
    check("a Llama model to llm.c's format: exit 2, one line naming why", p.returncode == 2 and len(lines) == 1
          and "cannot hold a Llama model" in lines[0] and not os.path.exists(P("llama.bin")),
          f"rc {p.returncode}: {p.stderr.strip()}")
    p = loom("--help")
    check("convert --help", p.returncode == 0 and "--to llmc|safetensors|hf" in p.stdout)
    p = loom(P("zero.bin"), P("forced"), "--to", "safetensors")
    check("--to forces the output kind", p.returncode == 0 and os.path.isfile(P("forced")), p.stderr)

    # ---- sanitizer build, when there is one --------------------------------------
    if os.path.exists(lib.ASAN_LOOM):
        b = lib.make_asan_loom()
        if b.returncode != 0:
            print("skip sanitizer run: the sanitizer build of loom failed (test_asan_parallel reports it)")
        else:
            env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1", UBSAN_OPTIONS="halt_on_error=1")
            exe = lib.ASAN_LOOM
            runs = [loom(P("pad.bin"), P("asan_hf"), exe=exe, env=env),
                    loom(P("asan_hf"), P("asan.bin"), exe=exe, env=env)]
            ok = all(r.returncode == 0 for r in runs) and open(P("asan.bin"), "rb").read() == open(
                P("pad.bin"), "rb").read()
            for name, path, _ in bad:
                runs.append(loom(path, P("y.safetensors"), exe=exe, env=env))
                ok = ok and runs[-1].returncode == 2
            clean = not any("Sanitizer" in r.stderr or "runtime error" in r.stderr for r in runs)
            check("under ASan+UBSan: a round trip and every bad input, no report",
                  ok and clean, "".join(r.stderr for r in runs)[-3000:])
    else:
        print(f"skip sanitizer run: no {lib.ASAN_LOOM} (test_asan_parallel builds it)")

sys.exit(lib.verdict())
