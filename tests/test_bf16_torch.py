#!/usr/bin/env python3
"""20 bf16 training steps through `loom train --bf16` against a PyTorch
reference written without autocast.

The reference, precisely:
- parameters: the model's parameters hold bf16 values (the float32 initial
  weights rounded to bf16) in float32 tensors, so the forward computes in
  float32 on bf16 weights, as loom's kernels do;
- activations: every activation (embedding output, LayerNorm outputs, qkv,
  attention output, projections, residual sums, c_fc, GELU, logits) is
  rounded to bf16 where loom rounds it, and so is the gradient flowing back
  through it (tests/pyref/gpt2.py's set_act_dtype);
- gradients: each parameter's float32 gradient is rounded to bf16 once (one
  micro-batch per step);
- master weights: float32 copies created from the bf16 parameters (as
  DeepSpeed creates them), updated by torch.optim.AdamW (decay on tensors of
  two or more dimensions) from the bf16 gradients, with
  clip_grad_norm_ over them; after each step the parameters are the master
  weights rounded to bf16.
The same data, schedule and initial weights as tests/test_train_torch.py
(sequential llm.c loader, warmup + cosine). Checked: the loss of every step
within 1e-3 relative (loom and PyTorch sum in different orders inside
every kernel, and a float32 difference that crosses a bf16 rounding boundary
moves a weight or activation by one bf16 step, 2^-8 relative; measured
below 1e-4). Also checked, so that the test can fail for the right reason:
at step 1, before rounding flips accumulate, loom is more than 10x closer to
the bf16 reference than the bf16 reference is to the float32 one.
"""
import os
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_train_torch as base  # noqa: E402
from pyref import gpt2, shard, st  # noqa: E402

TOL = 1e-3


def bf16(t):
    return t.to(torch.bfloat16).to(torch.float32)


def reference(init, tokens, clip):
    cfg = gpt2.Config(base.L, base.C, base.NH, base.V, base.T)
    model = gpt2.set_act_dtype(gpt2.load_numpy(gpt2.GPT2(cfg), init), torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(bf16(p))
    master = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    groups = [{"params": [m for m, p in zip(master, model.parameters()) if p.dim() >= 2], "weight_decay": base.WD},
              {"params": [m for m, p in zip(master, model.parameters()) if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=base.MAX_LR, betas=(base.BETA1, base.BETA2), eps=base.EPS)
    out = []
    for s in range(base.ITERS):
        lr = base.lr_at(s + 1)
        for g in opt.param_groups:
            g["lr"] = lr
        model.zero_grad(set_to_none=True)
        x, y = base.batch(tokens, s, base.B)
        _, loss = model(x, y)
        loss.backward()
        for m, p in zip(master, model.parameters()):
            m.grad = bf16(p.grad)
        norm = torch.nn.utils.clip_grad_norm_(master, clip).item()
        opt.step()
        with torch.no_grad():
            for m, p in zip(master, model.parameters()):
                p.copy_(bf16(m))
        out.append((loss.item(), lr, norm))
    return out


def main():
    torch.set_num_threads(2)
    fails = 0
    with tempfile.TemporaryDirectory() as tmp:
        cfg = gpt2.Config(base.L, base.C, base.NH, base.V, base.T)
        init = gpt2.to_numpy(gpt2.init_weights(gpt2.GPT2(cfg), base.SEED), np.float32)
        init_path = os.path.join(tmp, "init.safetensors")
        st.save(init_path, init, {"format": "pt"})
        tokens = base.make_tokens(20000, 7)
        data = os.path.join(tmp, "train.bin")
        shard.write(data, tokens)
        clip = 1.0
        ref = reference(init, tokens, clip)
        ref32 = base.reference(init, tokens, base.B, clip)
        steps, err = base.run_loom(init_path, data, base.B, clip, tmp, "bf16", ["--bf16"])
        if err:
            print(f"FAIL {err}")
            return 1
        worst = 0.0
        for s in range(1, base.ITERS + 1):
            e = base.rel(steps[s]["loss"], ref[s - 1][0])
            worst = max(worst, e)
            print(f"  step {s:2d}: loom {steps[s]['loss']:.7f} torch bf16 {ref[s - 1][0]:.7f} rel {e:.1e}"
                  f" | torch fp32 {ref32[s - 1][0]:.7f}")
        ok = worst <= TOL and len(steps) == base.ITERS
        print(f"{'ok  ' if ok else 'FAIL'} every step's loss within {TOL:g} of the bf16 reference (worst {worst:.2e})")
        fails += not ok
        # the test can tell bf16 from fp32: at step 1 (same data, no history) loom sits on
        # the bf16 reference while the fp32 reference is far off
        near, apart = base.rel(steps[1]["loss"], ref[0][0]), base.rel(ref[0][0], ref32[0][0])
        ok = 10 * near < apart
        print(f"{'ok  ' if ok else 'FAIL'} step 1: loom within {near:.1e} of the bf16 reference, which is {apart:.1e}"
              f" from fp32 (the test sees bf16)")
        fails += not ok
    print(f"{'PASS' if fails == 0 else 'FAIL'}: {fails} failure(s)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
