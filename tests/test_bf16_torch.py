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
- attention: the fused kernel's (gpt2.FusedAttention): its backward reads
  the kept bf16 output; on every units path but f32 its products take bf16
  operands, so the probabilities are rounded for P V and P^T dO and dS for
  dS K and dS^T Q, as FlashAttention rounds them (the f32 path's products
  are float32: the reference without those roundings);
- gradients: each parameter's float32 gradient is rounded to bf16 once (one
  micro-batch per step);
- master weights: float32 copies created from the bf16 parameters (as
  DeepSpeed creates them), updated by torch.optim.AdamW (decay on tensors of
  two or more dimensions) from the bf16 gradients, with
  clip_grad_norm_ over them; after each step the parameters are the master
  weights rounded to bf16.
The same data, schedule and initial weights as tests/test_train_torch.py
(tests/pyref/train.py: sequential llm.c loader, warmup + cosine). Checked:
the loss of every step within 1e-3 relative (loom and PyTorch sum in
different orders inside every kernel, and a float32 difference that crosses
a bf16 rounding boundary moves a weight or activation by one bf16 step,
2^-8 relative; measured at most 3.0e-5 on every units path, 33x under). Every units path of the bf16 products (LOOM_BF16_UNITS auto, amx,
avx512_bf16, avx512, f32) is held to it. Also checked, so that the test can fail for the right reason:
at step 1, before rounding flips accumulate, loom is more than 10x closer to
the bf16 reference than the bf16 reference is to the float32 one.
"""
import os
import sys
import tempfile

import torch

import lib
from lib import check, rel
from pyref import bf16_train, shard, st, train

TOL = 1e-3


def main():
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        init = train.initial_weights()
        init_path = os.path.join(tmp, "init.safetensors")
        st.save(init_path, init, {"format": "pt"})
        tokens = train.make_tokens(20000, 7)
        data = os.path.join(tmp, "train.bin")
        shard.write(data, tokens)
        clip = 1.0
        # the fused attention's products: float32 on the f32 units, bf16 operands on every other
        refs = {None: bf16_train.reference(init, tokens, clip),
                torch.bfloat16: bf16_train.reference(init, tokens, clip, attention_operands=torch.bfloat16)}
        ref32 = train.reference(init, tokens, train.B, clip)
        # each units path for the bf16 products, forced (a path above what the CPU has runs on the
        # best it has): the same reference holds for all
        for units in ("auto", "amx", "avx512_bf16", "avx512", "f32"):
            metrics = os.path.join(tmp, f"m_bf16_{units}.jsonl")
            steps, err = lib.train_steps(train.loom_args(init_path, data, train.B, clip, metrics, ["--bf16"]),
                                         metrics, env=dict(os.environ, LOOM_BF16_UNITS=units))
            if err:
                check(f"LOOM_BF16_UNITS={units}: loom trains", False, err)
                continue
            ref = refs[None if lib.bf16_units(units) == "f32" else torch.bfloat16]  # a CPU without bf16: f32
            worst = 0.0
            for s in range(1, train.ITERS + 1):
                e = rel(steps[s]["loss"], ref[s - 1][0])
                worst = max(worst, e)
                if units == "auto":
                    print(f"  step {s:2d}: loom {steps[s]['loss']:.7f} torch bf16 {ref[s - 1][0]:.7f} rel {e:.1e}"
                          f" | torch fp32 {ref32[s - 1][0]:.7f}")
            check(f"LOOM_BF16_UNITS={units}: every step's loss within {TOL:g} of the bf16 reference "
                  f"(worst {worst:.2e})", worst <= TOL and len(steps) == train.ITERS)
            # the test can tell bf16 from fp32: at step 1 (same data, no history) loom sits on
            # the bf16 reference while the fp32 reference is far off
            near, apart = rel(steps[1]["loss"], ref[0][0]), rel(ref[0][0], ref32[0][0])
            check(f"LOOM_BF16_UNITS={units}, step 1: loom within {near:.1e} of the bf16 reference, which is "
                  f"{apart:.1e} from fp32 (the test sees bf16)", 10 * near < apart)
        # a units name that is none of them: one line, exit 2
        p = lib.run([lib.LOOM, "train", *train.loom_args(init_path, data, train.B, clip,
                                                         os.path.join(tmp, "bad.jsonl"), ["--bf16"])],
                    env=dict(os.environ, LOOM_BF16_UNITS="tensor-cores"))
        lines = lib.error_lines(p.stderr)
        check("LOOM_BF16_UNITS=tensor-cores: exit 2, one line naming it",
              p.returncode == 2 and len(lines) == 1 and "LOOM_BF16_UNITS=tensor-cores" in lines[0], p.stderr[-300:])
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
