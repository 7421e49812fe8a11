"""The fused attention kernels (flash_attention_forward/backward) against
PyTorch's scaled dot-product attention.

Seeded random float32 inputs are written for tests/tools/flash_probe, which
runs the CPU backend's kernels and writes out, lse, dq, dk and dv back. The
reference is PyTorch on the same values promoted to float64 (its own
rounding then out of the picture): torch.nn.functional's
scaled_dot_product_attention where the PyTorch has it (2.x; is_causal=True
for plain causal attention), else its math path written out (softmax of
the masked scaled scores, times v: what the function computes on the CPU
in float64), with an explicit boolean mask (B,1,T,T) for a window (key j for query t when t - W < j <= t) and
for packed documents (causal within each document: block-diagonal), grouped
key/value heads repeated for the reference only (head h reads kv head
h // (NH/G)), and its autograd for the gradients; lse is the log-sum-exp of
the same masked scaled scores.

Error per tensor: max |ours - ref| / max |ref| (the worst element against
the tensor's scale, as tests/test_kernels_torch.py measures), within 1e-5;
at T = 1, where dq and dk are exactly zero, against the scale of the terms
that cancel (run_case says why).

Debian's torch is 1.13, which has the math path only; bench/attention.py
runs the function itself, timed, in PyTorch 2.x. BUILD names the build
folder. Prints one line per check; exits
1 on any failure.
"""
import os
import sys
import tempfile

import lib

TOL = 1e-5
PROBE = lib.tool("flash_probe")

# B, T, NH, G, hs, window, documents per row (0: one)
CASES = [
    (2, 150, 3, 3, 32, 0, 0),  # multi-head causal, tiles of 64 and a partial one
    (1, 1, 2, 2, 16, 0, 0),
    (2, 200, 8, 2, 16, 50, 0),  # grouped heads and a window
    (1, 130, 8, 1, 64, 0, 0),  # one key/value head for eight
    (2, 180, 4, 2, 24, 0, 4),  # packed documents, boundaries off the tiles
    (1, 300, 4, 4, 16, 70, 5),  # documents and a window together
]


def sdpa(q, k, v, allowed, causal):
    """scaled_dot_product_attention, or where PyTorch lacks it (1.x) its math
    path: softmax(q k^T / sqrt(hs), masked) v. Returns (out, how)."""
    import torch
    import torch.nn.functional as F

    if hasattr(F, "scaled_dot_product_attention"):
        if causal:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True), "is_causal"
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed), "boolean mask"
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    p = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return p @ v, "math path, masked"


def doc_starts(rng, B, T, docs):
    """(B,T) int32: each token's document start, about docs documents a row."""
    import numpy as np

    d = np.zeros((B, T), dtype=np.int32)
    for b in range(B):
        cuts = sorted(rng.choice(np.arange(1, T), size=min(docs - 1, T - 1), replace=False)) if docs > 1 else []
        start = 0
        for t in range(T):
            if cuts and t == cuts[0]:
                start = t
                cuts.pop(0)
            d[b, t] = start
    return d


def rel(ours, ref, floor=0.0):
    import numpy as np

    ref = np.asarray(ref, dtype=np.float64)
    scale = max(float(np.abs(ref).max()), floor, 1e-30)
    return float(np.abs(np.asarray(ours, dtype=np.float64) - ref).max()) / scale


def run_case(case, rng):
    import numpy as np
    import torch

    B, T, NH, G, hs, W, docs = case
    tag = f"B={B} T={T} NH={NH} G={G} hs={hs} W={W} docs={docs}"
    x = {"q": rng.standard_normal((B, T, NH, hs)), "k": rng.standard_normal((B, T, G, hs)),
         "v": rng.standard_normal((B, T, G, hs)), "dout": rng.standard_normal((B, T, NH, hs))}
    x = {n: a.astype(np.float32) for n, a in x.items()}
    doc = doc_starts(rng, B, T, docs) if docs > 1 else None
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "dims.txt"), "w") as f:
            f.write(f"{B} {T} {NH} {G} {hs} {W} {1 if doc is not None else 0}\n")
        for n, a in x.items():
            a.tofile(os.path.join(d, f"{n}.bin"))
        if doc is not None:
            doc.tofile(os.path.join(d, "doc.bin"))
        p = lib.run([PROBE, d], timeout=300)
        if not lib.check(f"flash_probe runs ({tag})", p.returncode == 0, p.stderr.strip()[-500:]):
            return
        shapes = {"out": (B, T, NH, hs), "lse": (B, NH, T), "dq": (B, T, NH, hs), "dk": (B, T, G, hs),
                  "dv": (B, T, G, hs)}
        got = {n: np.fromfile(os.path.join(d, f"{n}.bin"), dtype=np.float32).reshape(s) for n, s in shapes.items()}

    # the reference, in float64, heads first
    q, k, v = (torch.tensor(x[n], dtype=torch.float64).transpose(1, 2).requires_grad_() for n in "qkv")
    R = NH // G
    kr, vr = k.repeat_interleave(R, dim=1), v.repeat_interleave(R, dim=1)
    t = torch.arange(T)
    allowed = t[None, :] <= t[:, None]  # (T,T): query row, key column
    if W:
        allowed = allowed & (t[None, :] > t[:, None] - W)
    allowed = allowed.expand(B, T, T)
    if doc is not None:
        ds = torch.tensor(doc, dtype=torch.int64)
        allowed = allowed & (t[None, None, :] >= ds[:, :, None])  # key at or after the query's document start
    out, how = sdpa(q, kr, vr, allowed[:, None], not W and doc is None)
    out.backward(torch.tensor(x["dout"], dtype=torch.float64).transpose(1, 2))
    scores = (q @ kr.transpose(-1, -2)) / hs**0.5
    lse = torch.logsumexp(scores.masked_fill(~allowed[:, None], float("-inf")), dim=-1)
    ref = {"out": out.transpose(1, 2), "lse": lse, "dq": q.grad.transpose(1, 2), "dk": k.grad.transpose(1, 2),
           "dv": v.grad.transpose(1, 2)}
    # T = 1: each query sees one key, so dq and dk are exactly zero (dS = P (dP - D) with P = 1 and
    # D = dP): the reference's max is 0 and the error's scale is the terms that cancel, dP's, times
    # the other operand's over sqrt(hs) (float32 leaves their rounding, 1e-9 here; AVX512's order
    # happens to cancel exactly, AVX2's does not)
    dP = float((torch.tensor(x["dout"], dtype=torch.float64) * torch.tensor(x["v"], dtype=torch.float64).repeat_interleave(
        R, dim=2)).sum(-1).abs().max()) if T == 1 else 0.0
    floor = {"dq": dP * float(np.abs(x["k"]).max()) / hs**0.5, "dk": dP * float(np.abs(x["q"]).max()) / hs**0.5}
    for n in ("out", "lse", "dq", "dk", "dv"):
        e = rel(got[n], ref[n].detach().numpy(), floor.get(n, 0.0))
        lib.check(f"{n} vs PyTorch's attention ({how}; {tag}): {e:.2e}", e <= TOL, f"{e:.3g} > {TOL}")


def main():
    if not lib.built(PROBE):
        return 1
    import numpy as np
    import torch

    torch.set_num_threads(2)
    print(f"PyTorch {torch.__version__}")
    rng = np.random.default_rng(1234)
    for case in CASES:
        run_case(case, rng)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
