"""Transformer Engine's fp8 recipe (delayed scaling) on the reference GPT-2's
Conv1D layers, written from the recipe's description, for the comparison
with `loom train --fp8-format`: needs PyTorch 2.x (torch.float8_e4m3fn and
torch.float8_e5m2).

Each linear layer of the blocks has three operands (x, W, dy), each with a
scale, the step's amax and an amax history (newest first):
- forward:  y = (q(x) @ q(W)) * (1/s_x * 1/s_W) + b, q(v) the float32 value
  of (v * s).clamp(-max, max).to(fp8) (E4M3);
- backward: dx = (q(dy) @ q(W)^T) * (1/s_dy * 1/s_W), dW = (q(x)^T @ q(dy)) *
  (1/s_dy * 1/s_x), db = dy summed (the unquantised gradient); dy in E5M2
  under "hybrid", E4M3 under "e4m3";
- after each optimizer step: the amax pushed into its history and the scale
  set to (max / amax) / 2^margin from the history's max ("max") or newest
  entry ("most_recent"), the old scale kept where amax is 0 or not finite
  (or the new scale overflows). Scales start at 1.
"""
import torch

MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


class Meta:
    def __init__(self, recipe):
        fmt, self.len, self.algo, self.margin = recipe
        self.types = [torch.float8_e4m3fn, torch.float8_e4m3fn,
                      torch.float8_e5m2 if fmt == "hybrid" else torch.float8_e4m3fn]
        self.scale = [torch.tensor(1.0) for _ in range(3)]
        self.amax = [torch.tensor(0.0) for _ in range(3)]
        self.history = [torch.zeros(self.len) for _ in range(3)]

    def quantize(self, v, o):
        """v's quantised values (float32) with operand o's scale; its amax noted."""
        self.amax[o] = torch.maximum(self.amax[o], v.detach().abs().max())
        dt = self.types[o]
        return (v.detach().float() * self.scale[o]).clamp(-MAX[dt], MAX[dt]).to(dt).float()

    def step_end(self):
        for o in range(3):
            h = torch.cat([self.amax[o].reshape(1), self.history[o][:-1]])
            self.history[o] = h
            amax = h.max() if self.algo == "max" else h[0]
            sf = (MAX[self.types[o]] / amax) / (2 ** self.margin)
            sf = torch.where(amax > 0.0, sf, self.scale[o])
            sf = torch.where(torch.isfinite(amax), sf, self.scale[o])
            self.scale[o] = torch.where(torch.isfinite(sf), sf, self.scale[o])
            self.amax[o] = torch.tensor(0.0)


class Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, meta):
        xq, wq = meta.quantize(x, 0), meta.quantize(w, 1)
        ctx.save_for_backward(xq, wq)
        ctx.meta = meta
        shape = x.shape
        y = (xq.reshape(-1, shape[-1]) @ wq) * ((1.0 / meta.scale[0]) * (1.0 / meta.scale[1])) + b
        return y.view(*shape[:-1], -1)

    @staticmethod
    def backward(ctx, g):
        xq, wq = ctx.saved_tensors
        m = ctx.meta
        g2 = g.reshape(-1, g.shape[-1]).float()
        gq = m.quantize(g2, 2)
        dx = (gq @ wq.t()) * ((1.0 / m.scale[2]) * (1.0 / m.scale[1]))
        dw = (xq.reshape(-1, xq.shape[-1]).t() @ gq) * ((1.0 / m.scale[2]) * (1.0 / m.scale[0]))
        return dx.view(*xq.shape), dw, g2.sum(0), None


def enable(model, recipe):
    """fp8 in every Conv1D of the model's blocks; returns the metas, in order."""
    metas = []
    for blk in model.h:
        for lin in (blk.attn.c_attn, blk.attn.c_proj, blk.mlp.c_fc, blk.mlp.c_proj):
            lin.fp8 = Meta(recipe)
            metas.append(lin.fp8)
    return metas
