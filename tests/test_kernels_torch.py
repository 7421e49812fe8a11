"""Every CPU kernel, forward and backward, against PyTorch autograd.

Random float32 inputs (seeded) are written for tests/tools/kernel_probe,
which runs each kernel and writes its outputs back (file convention in
kernel_probe.c). The reference is PyTorch on the same float32 values
promoted to float64: the reference's own rounding (~1e-16) is then out of
the picture and the measured error is the kernel's alone.

Error per tensor: max |ours - ref| / max |ref|, i.e. the worst element
judged against the tensor's scale (the floor 1e-30 only avoids a division
by zero). An element-wise relative error is not usable: gradients such as
layernorm's dinp or attention's dqkv are sums with cancellation, and their
near-zero entries carry an absolute float32 error set by the tensor's scale,
not by their own size. A relative L2 norm would average one bad element
away; the max does not. Tolerance 1e-5 everywhere (float32 epsilon is 6e-8,
so this leaves room for sums of a few hundred terms and nothing more: the
longest here, OC = 192 terms, err by about u sqrt(K) = 8e-7 of the scale in
the worst usual summation order, whatever the BLAS core or thread count
kernel_probe runs at (all cores, unpinned); measured at most 1.4e-6,
layernorm out, 7x under).

The bf16 matrix products (each units path forced) are held to the same
bound against the product of their bf16-rounded operands (bf16_products).

Run with Debian's /usr/bin/python3 (torch 1.13, numpy); BUILD names the
build folder (default build). Prints one line per check; exits 1 on any
failure.
"""
import os
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

import lib

TOL = 1e-5
PROBE = lib.tool("kernel_probe")

B, T, C, NH, V = 2, 16, 48, 4, 97
MAXT = T + 4  # wpe rows past T get no gradient
OC = 4 * C
N = B * T
HS = C // NH
DLOSS = 1.0 / N
ADAMW = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, wd=0.1, grad_scale=0.7, steps=5, n=1000)

failures = 0


def f32(x):
    """The float32 value the kernel sees, as a Python float (for scalars)."""
    return float(np.float32(x))


def check(name, ours, ref):
    global failures
    ref = ref.detach().to(torch.float64).reshape(-1)
    ours = torch.from_numpy(np.asarray(ours, dtype=np.float64)).reshape(-1)
    if ours.shape != ref.shape:
        print(f"FAIL {name}: shape {tuple(ours.shape)} vs {tuple(ref.shape)}")
        failures += 1
        return
    scale = max(ref.abs().max().item(), 1e-30)
    diff = (ours - ref).abs()
    err = diff.max().item() / scale if torch.isfinite(ours).all() else float("inf")
    ok = err <= TOL
    status = "ok  " if ok else "FAIL"
    print(f"{status} {name:34s} max err {err:.2e} (tol {TOL:.0e}, scale {scale:.3g})")
    if not ok:
        failures += 1
        worst = torch.argsort(diff.nan_to_num(float("inf")), descending=True)[:3]
        for i in worst.tolist():
            print(f"       [{i}] ours {ours[i].item():.9g} ref {ref[i].item():.9g}")


def bf16_products(g, d, out):
    """The matrix products of bf16 training, on each units path forced
    (LOOM_BF16_UNITS; a path above what the CPU has runs on the best it
    has), against float64 PyTorch on the operands rounded to bf16. A product
    of two bf16 values is exact in float32, so only the float32 sums remain
    and float32's 1e-5 holds. Against the unrounded float32 operands the
    error is bf16's (about 2^-9 of each operand), far above 1e-4: the check
    that the operands really were rounded. The f32 path computes on the
    float32 values as they are, and is held to those."""
    global failures

    def bf(name):
        return g[name].bfloat16().double()

    def f64(name):
        return g[name].double()

    for units in ("amx", "avx512_bf16", "avx512", "f32"):
        r = lib.run([PROBE, d, "cpu", "bf16"], env=dict(os.environ, LOOM_BF16_UNITS=units))
        if r.returncode != 0:
            print(f"FAIL kernel_probe bf16 {units} exited {r.returncode}: {r.stderr.strip()}")
            failures += 1
            continue
        print(f"     LOOM_BF16_UNITS={units}: {r.stdout.strip()}")
        ran = r.stdout.split("bf16 units ", 1)[-1].split(",", 1)[0]  # a CPU without AVX512 runs f32 for every one
        op = bf if ran != "f32" else f64
        x, w, b, dy = op("matmul.inp"), op("matmul.weight"), f64("matmul.bias"), op("matmul.dout")
        check(f"{units}: matmul out", out("matmul.out"), x @ w + b)
        check(f"{units}: matmul dinp", out("matmul.dinp"), dy @ w.T)
        check(f"{units}: matmul dweight", out("matmul.dweight"), x.T @ dy)
        check(f"{units}: matmul dbias", out("matmul.dbias"), f64("matmul.dout").sum(0))
        if ran != "f32":  # the operands handed over in bf16 (kept activations, stored parameters)
            check(f"{units}: matmul out, bf16 operands", out("matmul.out_b16"), x @ w + b)
            check(f"{units}: matmul dinp, bf16 operands", out("matmul.dinp_b16"), dy @ w.T)
            check(f"{units}: matmul dweight, bf16 operands", out("matmul.dweight_b16"), x.T @ dy)
            check(f"{units}: matmul dbias, bf16 operands", out("matmul.dbias_b16"), f64("matmul.dout").sum(0))
        x, wte, dl = op("lm_head.inp"), op("lm_head.wte"), op("lm_head.dlogits")
        check(f"{units}: lm_head logits", out("lm_head.logits"), x @ wte.T)
        check(f"{units}: lm_head dinp", out("lm_head.dinp"), dl @ wte)
        check(f"{units}: lm_head dwte", out("lm_head.dwte"), dl.T @ x)
        dlb = bf("lm_head.dlogits")  # held in bf16 by the caller, on every path
        ours = torch.from_numpy(out("lm_head.logits_lp").astype(np.float64))
        ref = (x @ wte.T).reshape(-1)
        err = (ours - ref).abs().max().item() / ref.abs().max().item()
        exact = bool((ours == ours.bfloat16().double()).all())
        # rounding to bf16 moves a value by at most half a bf16 step, 2^-8 of
        # it (so of the scale), from the float32 sum, itself within TOL of the
        # exact product: measured 2.0e-3
        ok = err <= 2 ** -8 + TOL and exact
        print(f"{'ok  ' if ok else 'FAIL'} {units}: lm_head logits kept in bf16: bf16 values within one bf16 step "
              f"(2^-8) of the float64 product (max err {err:.1e})")
        failures += 0 if ok else 1
        check(f"{units}: lm_head dinp, bf16 dlogits", out("lm_head.dinp_lp"), dlb @ wte)
        check(f"{units}: lm_head dwte, bf16 dlogits", out("lm_head.dwte_lp"), dlb.T @ x)
        if ran != "f32":
            ref = f64("matmul.inp") @ f64("matmul.weight") + f64("matmul.bias")
            ours = torch.from_numpy(out("matmul.out").astype(np.float64))
            err = (ours - ref.reshape(-1)).abs().max().item() / ref.abs().max().item()
            ok = err > 1e-4
            print(f"{'ok  ' if ok else 'FAIL'} {units}: operands rounded to bf16 (error {err:.1e} against the "
                  f"float32 operands' product, above 1e-4)")
            failures += 0 if ok else 1


def main():
    if not lib.built(PROBE):
        return 1
    torch.manual_seed(1234)
    g = {}  # every input, float32

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape) * scale).float()

    g["embedding.tokens"] = torch.randint(0, V, (B, T), dtype=torch.int32)
    g["embedding.tokens"][0, :4] = 7  # repeated token ids
    g["embedding.wte"] = rand(V, C)
    g["embedding.wpe"] = rand(MAXT, C)
    g["embedding.dout"] = rand(B, T, C)
    # rows from nearly constant (std 0.01, where eps = 1e-5 matters) to std 3
    row_scale = torch.logspace(-2.0, 0.5, N).float().unsqueeze(1)
    g["layernorm.inp"] = rand(N, C) * row_scale + 0.5
    g["layernorm.weight"] = rand(C)
    g["layernorm.bias"] = rand(C)
    g["layernorm.dout"] = rand(N, C)
    g["matmul.inp"] = rand(N, C)
    g["matmul.weight"] = rand(C, OC, scale=0.1)
    g["matmul.bias"] = rand(OC)
    g["matmul.dout"] = rand(N, OC)
    g["lm_head.inp"] = rand(N, C)
    g["lm_head.wte"] = rand(V, C)
    g["lm_head.dlogits"] = rand(N, V)
    g["attention.qkv"] = rand(B, T, 3 * C)
    g["attention.dout"] = rand(B, T, C)
    g["gelu.inp"] = rand(N, 4 * C, scale=2.0)
    g["gelu.dout"] = rand(N, 4 * C)
    g["residual.a"] = rand(N, C)
    g["residual.b"] = rand(N, C)
    g["residual.dout"] = rand(N, C)
    g["crossentropy.logits"] = rand(N, V, scale=3.0)
    g["crossentropy.targets"] = torch.randint(0, V, (N,), dtype=torch.int32)
    g["adamw.param"] = rand(ADAMW["n"], scale=0.05)
    grads = rand(ADAMW["steps"], ADAMW["n"])
    grads[:, :5] = 0.0  # v stays 0 there: the eps path
    g["adamw.grads"] = grads

    with tempfile.TemporaryDirectory(prefix="loom-kernels-") as d:
        with open(os.path.join(d, "dims.txt"), "w") as f:
            f.write(f"B {B}\nT {T}\nC {C}\nNH {NH}\nV {V}\nmaxT {MAXT}\nOC {OC}\n")
            f.write(f"dloss {DLOSS!r}\n")
            for k in ("lr", "beta1", "beta2", "eps", "wd", "grad_scale"):
                f.write(f"{k} {ADAMW[k]!r}\n")
            f.write(f"steps {ADAMW['steps']}\nn_adamw {ADAMW['n']}\n")
        for name, t in g.items():
            t.numpy().astype("<" + t.numpy().dtype.str[1:]).tofile(os.path.join(d, name + ".bin"))
        r = lib.run([PROBE, d])
        if r.returncode != 0:
            print(f"FAIL kernel_probe exited {r.returncode}: {r.stderr.strip()}")
            return 1

        def out(name, shape=None):
            a = np.fromfile(os.path.join(d, name + ".bin"), dtype="<f4")
            return a.reshape(shape) if shape else a

        def leaf(name):
            return g[name].double().requires_grad_()

        # embedding
        wte, wpe = leaf("embedding.wte"), leaf("embedding.wpe")
        tok = g["embedding.tokens"].long()
        y = F.embedding(tok, wte) + wpe[:T]
        (y * g["embedding.dout"].double()).sum().backward()
        check("embedding out", out("embedding.out"), y)
        check("embedding dwte", out("embedding.dwte"), wte.grad)
        check("embedding dwpe", out("embedding.dwpe"), wpe.grad)

        # layernorm
        x, w, b = leaf("layernorm.inp"), leaf("layernorm.weight"), leaf("layernorm.bias")
        y = F.layer_norm(x, (C,), w, b, eps=1e-5)
        (y * g["layernorm.dout"].double()).sum().backward()
        xd = x.detach()
        check("layernorm out", out("layernorm.out"), y)
        check("layernorm mean", out("layernorm.mean"), xd.mean(-1))
        rstd = 1.0 / torch.sqrt(xd.var(-1, unbiased=False) + 1e-5)
        check("layernorm rstd", out("layernorm.rstd"), rstd)
        check("layernorm dinp", out("layernorm.dinp"), x.grad)
        check("layernorm dweight", out("layernorm.dweight"), w.grad)
        check("layernorm dbias", out("layernorm.dbias"), b.grad)

        # matmul: weight stored [in, out]
        x, w, b = leaf("matmul.inp"), leaf("matmul.weight"), leaf("matmul.bias")
        y = x @ w + b
        (y * g["matmul.dout"].double()).sum().backward()
        check("matmul out", out("matmul.out"), y)
        check("matmul dinp", out("matmul.dinp"), x.grad)
        check("matmul dweight", out("matmul.dweight"), w.grad)
        check("matmul dbias", out("matmul.dbias"), b.grad)

        # LM head tied to wte
        x, wte = leaf("lm_head.inp"), leaf("lm_head.wte")
        y = F.linear(x, wte)
        (y * g["lm_head.dlogits"].double()).sum().backward()
        check("lm_head logits", out("lm_head.logits"), y)
        check("lm_head dinp", out("lm_head.dinp"), x.grad)
        check("lm_head dwte", out("lm_head.dwte"), wte.grad)

        # causal attention, written out plainly
        qkv = leaf("attention.qkv")
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-2, -1)) / np.sqrt(HS)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
        y = (p @ v).transpose(1, 2).reshape(B, T, C)
        (y * g["attention.dout"].double()).sum().backward()
        check("attention out", out("attention.out"), y)
        check("attention att", out("attention.att"), p)
        check("attention dqkv", out("attention.dqkv"), qkv.grad)

        # GELU, tanh form
        x = leaf("gelu.inp")
        y = F.gelu(x, approximate="tanh")
        (y * g["gelu.dout"].double()).sum().backward()
        check("gelu out", out("gelu.out"), y)
        check("gelu dinp", out("gelu.dinp"), x.grad)

        # residual
        a, b = leaf("residual.a"), leaf("residual.b")
        y = a + b
        (y * g["residual.dout"].double()).sum().backward()
        check("residual out", out("residual.out"), y)
        check("residual da", out("residual.da"), a.grad)
        check("residual db", out("residual.db"), b.grad)

        # cross-entropy: losses per row; the objective is mean, dloss = 1/N
        x = leaf("crossentropy.logits")
        tgt = g["crossentropy.targets"].long()
        losses = F.cross_entropy(x, tgt, reduction="none")
        (losses.sum() * f32(DLOSS)).backward()
        check("crossentropy losses", out("crossentropy.losses"), losses)
        check("crossentropy lse", out("crossentropy.lse"), torch.logsumexp(x.detach(), dim=-1))
        check("crossentropy dlogits", out("crossentropy.dlogits"), x.grad)

        # AdamW against torch.optim.AdamW (single-tensor path), float64, with
        # the hyperparameters the kernel receives (float32-rounded)
        n, S = ADAMW["n"], ADAMW["steps"]
        p0 = g["adamw.param"].double()
        p = p0.clone().requires_grad_()
        betas = (f32(ADAMW["beta1"]), f32(ADAMW["beta2"]))
        opt = torch.optim.AdamW([p], lr=f32(ADAMW["lr"]), betas=betas, eps=f32(ADAMW["eps"]),
                                weight_decay=f32(ADAMW["wd"]), foreach=False)
        p_out, m_out, v_out = (out(f"adamw.{k}_out", (S, n)) for k in ("param", "m", "v"))
        for t in range(S):
            p.grad = g["adamw.grads"][t].double() * f32(ADAMW["grad_scale"])
            opt.step()
            st = opt.state[p]
            tag = "1 step" if t == 0 else f"{t + 1} steps"
            check(f"adamw param, {tag}", p_out[t], p)
            # the update itself, so that a small error cannot hide in |p|
            check(f"adamw param - p0, {tag}", p_out[t] - p0.numpy(), p.detach() - p0)
            check(f"adamw exp_avg, {tag}", m_out[t], st["exp_avg"])
            check(f"adamw exp_avg_sq, {tag}", v_out[t], st["exp_avg_sq"])

        bf16_products(g, d, out)

    print(f"test_kernels_torch: {'FAILED' if failures else 'passed'} ({failures} failed)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
