"""The 20-step bf16 run of tests/test_bf16_torch.py with the fp8 recipe
(pyref/fp8.py) in every block's linear layers: run as
`python -m pyref.fp8_train INIT.safetensors TOKENS.npy FORMAT LEN ALGO MARGIN OUT.json`
under PyTorch 2.x, it writes [[loss, lr, grad_norm], ...] per step (FORMAT
none: the bf16 run alone).
The bf16 part is test_bf16_torch's reference: bf16 parameter values,
activations and their gradients rounded where loom rounds them, float32
master weights updated by AdamW from the bf16-rounded gradients."""
import json
import sys

import numpy as np
import torch

from . import fp8, gpt2, st, train


def bf16(t):
    return t.to(torch.bfloat16).to(torch.float32)


def reference(init, tokens, clip, recipe):
    model = gpt2.set_act_dtype(gpt2.load_numpy(gpt2.GPT2(train.config()), init), torch.bfloat16)
    metas = fp8.enable(model, recipe) if recipe[0] != "none" else []
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
    init_path, tokens_path, fmt, length, algo, margin, out_path = argv
    torch.set_num_threads(2)
    init = st.load(init_path)
    tokens = np.load(tokens_path)
    out = reference(init, tokens, 1.0, (fmt, int(length), algo, int(margin)))
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1:])
