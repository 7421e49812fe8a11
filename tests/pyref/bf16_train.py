"""The 20-step bf16 reference run of tests/test_bf16_torch.py, optionally
with the fp8 recipe (pyref/fp8.py) in every block's linear layers: bf16
parameter values, activations and their gradients rounded where loom rounds
them, float32 master weights created from the bf16 parameters and updated by
AdamW (decay on tensors of two or more dimensions) from the bf16-rounded
gradients with clip_grad_norm_, the parameters rounded from them after each
step. test_bf16_torch imports it (Debian's torch); test_fp8_torch runs it
as `python -m pyref.bf16_train INIT.safetensors TOKENS.npy FORMAT LEN ALGO
MARGIN OPS OUT.json` under PyTorch 2.x (float8 types), which writes [[loss,
lr, grad_norm], ...] per step (FORMAT none: no fp8; OPS bf16 or f32: the
fused attention's operands)."""
import json
import sys

import numpy as np
import torch

from . import gpt2, st, train


def bf16(t):
    return t.to(torch.bfloat16).to(torch.float32)


def reference(init, tokens, clip, recipe=None, attention_operands=None):
    """Per step (loss, lr, grad_norm); recipe (format, history length, algo,
    margin) turns fp8 on (PyTorch 2.x); attention_operands torch.bfloat16:
    the fused attention's products on bf16 operands (gpt2.FusedAttention),
    as loom's bf16 table runs them on bf16 units."""
    model = gpt2.set_act_dtype(gpt2.load_numpy(gpt2.GPT2(train.config()), init), torch.bfloat16)
    gpt2.set_attention_operands(model, attention_operands)
    metas = []
    if recipe and recipe[0] != "none":
        from . import fp8
        metas = fp8.enable(model, recipe)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(bf16(p))
    master = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    groups = [{"params": [m for m, p in zip(master, model.parameters()) if p.dim() >= 2], "weight_decay": train.WD},
              {"params": [m for m, p in zip(master, model.parameters()) if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=train.MAX_LR, betas=(train.BETA1, train.BETA2), eps=train.EPS)
    out = []
    for s in range(train.ITERS):
        lr = train.lr_at(s + 1)
        for g in opt.param_groups:
            g["lr"] = lr
        model.zero_grad(set_to_none=True)
        x, y = train.batch(tokens, s, train.B)
        _, loss = model(x, y)
        loss.backward()
        for m, p in zip(master, model.parameters()):
            m.grad = bf16(p.grad)
        norm = torch.nn.utils.clip_grad_norm_(master, clip).item()
        opt.step()
        with torch.no_grad():
            for m, p in zip(master, model.parameters()):
                p.copy_(bf16(m))
        for meta in metas:
            meta.step_end()
        out.append((loss.item(), lr, norm))
    return out


def main(argv):
    init_path, tokens_path, fmt, length, algo, margin, ops, out_path = argv
    torch.set_num_threads(2)
    init = st.load(init_path)
    tokens = np.load(tokens_path)
    out = reference(init, tokens, 1.0, (fmt, int(length), algo, int(margin)),
                    torch.bfloat16 if ops == "bf16" else None)
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1:])
