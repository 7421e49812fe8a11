#!/usr/bin/env python3
"""loom's GPT-2 forward and backward against PyTorch.

For a few tiny models with random weights (biases and LayerNorm parameters
randomised too, so their gradients are not trivially zero or one) and random
tokens, runs $BUILD/tests/tools/gpt2_grads (with a tenth argument, the rows
of wpe, when the position table is longer than T) and compares its loss,
logits and every parameter gradient with tests/pyref/gpt2.py.

The reference runs in float64: it must be more exact than the float32 code it
checks, so the measured error is loom's own rounding and not the sum of two
float32 computations that happen to round differently.

Bounds: loss relative error <= 1e-5; logits and every gradient relative L2
error ||loom - ref|| / ||ref|| <= 1e-4. Exits 1 on any failure. loom's error
is float32's: u = 2^-24 = 6e-8 per rounding, sums of at most V = 97 or
B T = 96 terms (about u sqrt(K) = 6e-7 each in the worst usual order), a few
layers deep; measured here at most 3.6e-8 for the loss (280x under),
4.5e-7 for the logits and 7.7e-7 for a gradient (130x under), with
gpt2_grads at its default thread count (all cores, unpinned): the margin
covers another BLAS core or thread count, whose orders err alike. A wrong
term errs by 1e-2 or more.
"""
import os
import sys
import tempfile

import numpy as np
import torch

import lib
from lib import rel_l2
from pyref import gpt2, st

TOOL = lib.tool("gpt2_grads")

LOSS_TOL = 1e-5
REL_TOL = 1e-4

# (name, L, C, NH, T, maxT, V, B[, numerics]); numerics: Hugging Face's
# config.json settings loom honours, as gpt2_grads options and pyref fields
CONFIGS = [
    ("base", 2, 64, 4, 32, 32, 97, 3),
    ("T<maxT", 2, 48, 3, 20, 32, 97, 3),
    ("1 layer, 1 head", 1, 32, 1, 16, 24, 61, 2),
    ("eps 0.1, exact GELU, untied head", 2, 64, 8, 32, 32, 97, 3,
     {"eps": 0.1, "activation": "gelu", "untied": True}),
]


def random_weights(cfg, seed):
    """GPT-2 initialisation, then every bias and LayerNorm parameter moved
    away from 0/1, and every matrix made larger: with GPT-2's 0.02 at these
    widths the MLP pre-activations stay near 0, where the tanh GELU, the exact
    GELU and even a linear function agree to about 1e-5, and the attention
    is nearly uniform, so a wrong nonlinearity would hide under the bound.
    float32, as loom stores them."""
    return gpt2.perturbed_weights(cfg, seed, matrix_scale=6.0)


def show_mismatches(got, ref, k=5):
    g, r = got.astype(np.float64).ravel(), ref.ravel()
    err = np.abs(g - r)
    for i in np.argsort(-err)[:k]:
        print(f"      [{np.unravel_index(i, ref.shape)}] loom {g[i]: .9e} ref {r[i]: .9e} diff {err[i]:.3e}")


def run_case(name, L, C, NH, T, maxT, V, B, numerics=None, *, seed, tmp):
    numerics = numerics or {}
    cfg = gpt2.Config(L, C, NH, V, maxT, **numerics)
    weights = random_weights(cfg, seed)
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, V, size=(B, T + 1), dtype=np.int32)
    wpath = os.path.join(tmp, f"w{seed}.safetensors")
    tpath = os.path.join(tmp, f"t{seed}.i32")
    opath = os.path.join(tmp, f"o{seed}.safetensors")
    st.save(wpath, weights, {"format": "pt"})
    rows.astype("<i4").tofile(tpath)
    opts = []
    if numerics:  # the float32 eps, as loom's config narrows it
        opts = ["--norm-eps", repr(float(np.float32(cfg.eps))), "--activation", cfg.activation,
                "--untied", int(cfg.untied)]
    args = [TOOL, *opts, wpath, tpath, opath, L, C, NH, T, V, B]
    if maxT != T:  # optional tenth argument: rows of wpe when they exceed T
        args.append(maxT)
    p = lib.run(args, timeout=300)
    print(f"== {name}: L={L} C={C} NH={NH} T={T} maxT={maxT} V={V} B={B} {numerics or ''}")
    if p.returncode != 0:
        print(f"   FAIL gpt2_grads exited {p.returncode}: {p.stderr.strip()}")
        return 1
    out = st.load(opath)

    # reference, float64
    model = gpt2.load_numpy(gpt2.GPT2(cfg).double(), weights)
    idx = torch.from_numpy(rows[:, :T].astype(np.int64))
    tgt = torch.from_numpy(rows[:, 1:].astype(np.int64))
    logits, loss = model(idx, tgt)
    loss.backward()
    ref = {"loss": np.array([loss.item()]), "logits": logits.detach().numpy()}
    for n, prm in model.named_parameters():
        ref["grad." + n] = prm.grad.numpy()

    fails = 0
    missing = sorted(set(ref) - set(out))
    extra = sorted(set(out) - set(ref))
    if missing or extra:
        print(f"   FAIL tensors missing from loom's output: {missing}; unexpected: {extra}")
        fails += 1
    for key in ref:  # model order: loss, logits, then wte ... ln_f
        if key not in out:
            continue
        got, want = out[key], ref[key]
        if got.shape != want.shape:
            print(f"   FAIL {key:34s} shape {got.shape}, expected {want.shape}")
            fails += 1
            continue
        if not np.all(np.isfinite(got)):
            print(f"   FAIL {key:34s} has non-finite values")
            fails += 1
            continue
        if key == "loss":
            err = abs(float(got[0]) - want[0]) / abs(want[0])
            tol = LOSS_TOL
            extra_txt = f" (loom {float(got[0]):.7f} ref {want[0]:.7f})"
        else:
            err = rel_l2(got, want)
            tol = REL_TOL
            extra_txt = f" (max abs diff {np.max(np.abs(got - want)):.2e}, |ref| {np.linalg.norm(want):.3e})"
        ok = err <= tol
        print(f"   {'ok  ' if ok else 'FAIL'} {key:34s} rel err {err:.3e} <= {tol:.0e}{extra_txt}")
        if not ok:
            fails += 1
            show_mismatches(got, want)
    # positions >= T never take part: their wpe gradient must be exactly zero
    if T < maxT and "grad.wpe.weight" in out:
        tail = out["grad.wpe.weight"][T:]
        ok = np.all(tail == 0)
        print(f"   {'ok  ' if ok else 'FAIL'} grad.wpe.weight rows {T}..{maxT - 1} are zero"
              f" (max |g| {np.max(np.abs(tail)):.2e})")
        fails += not ok
    return fails


def main():
    if not lib.built(TOOL):
        return 1
    torch.set_num_threads(1)
    fails = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, c in enumerate(CONFIGS):
            fails += run_case(*c, seed=100 + i, tmp=tmp)
    return lib.verdict(fails)


if __name__ == "__main__":
    sys.exit(main())
