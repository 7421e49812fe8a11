"""A plain PyTorch GPT-2, the reference the C model is compared with.

Token + learned position embeddings, pre-LayerNorm blocks (eps 1e-5 unless
Config.eps says), causal multi-head attention (one qkv projection ordered
[q|k|v], heads split as view(B,T,NH,HS)), GELU (tanh approximation, or the
exact form with Config.activation "gelu"), 4x MLP, residuals, final
LayerNorm, LM head tied to wte (or its own lm_head.weight (V,C) with
Config.untied), mean cross-entropy.

Parameter names are Hugging Face GPT-2's (without the "transformer." prefix)
and matmul weights are stored [in, out] like Hugging Face's Conv1D, so
model.state_dict() maps one to one onto loom's safetensors files.

set_act_dtype(model, torch.bfloat16 or torch.float16) emulates loom's
act_dtype: every activation a loom kernel writes is rounded to that dtype
(float32 first, as the kernel computed it, then the 16-bit dtype), and so is
the gradient that reaches it in the backward; see round_act for the points.
The attention probabilities stay unrounded (inside loom's attention kernel),
whose backward reads the kept (rounded) output: FusedAttention.
"""
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from . import dropout

LN_EPS = 1e-5


class RoundAct(torch.autograd.Function):
    """x rounded to `dtype` and back: x -> float32 -> dtype -> x's dtype, as
    loom rounds what a float32 kernel wrote. The backward rounds the gradient
    the same way, as loom rounds the activation gradient a kernel writes."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = dtype
        return x.float().to(dtype).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        return g.float().to(ctx.dtype).to(g.dtype), None


def round_act(x, dtype):
    """An activation as loom holds it: unchanged for dtype None (float32), else
    RoundAct. Applied to the embedding output, both LayerNorm outputs and the
    final one, qkv, the attention output (heads concatenated), both
    projections, both residual sums, c_fc, GELU and the logits."""
    return x if dtype is None else RoundAct.apply(x, dtype)


def set_act_dtype(model, dtype):
    """Holds every activation of the model in dtype (None: as computed)."""
    for mod in model.modules():
        if hasattr(mod, "act_dtype"):
            mod.act_dtype = dtype
    return model


def set_attention_operands(model, dtype):
    """The fused attention's products on `dtype` operands (torch.bfloat16:
    loom's bf16 table on bf16 units), or None: float32 ones."""
    for mod in model.modules():
        if hasattr(mod, "operand_dtype"):
            mod.operand_dtype = dtype
    return model


@dataclass
class Config:
    num_layers: int
    hidden: int
    heads: int
    vocab: int
    max_pos: int
    eps: float = LN_EPS
    activation: str = "gelu_new"  # or "gelu" (exact)
    untied: bool = False


class Conv1D(nn.Module):
    """y = x @ weight + bias with weight stored [in, out]."""

    def __init__(self, nin, nout):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nin, nout))
        self.bias = nn.Parameter(torch.zeros(nout))

    def forward(self, x):
        if getattr(self, "fp8", None) is not None:  # pyref/fp8.py's recipe (PyTorch 2.x)
            from . import fp8
            return fp8.Linear.apply(x, self.weight, self.bias, self.fp8)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class LayerNorm(nn.Module):
    def __init__(self, n, eps=LN_EPS):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n))
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


def _rounded(x, dtype):
    return x if dtype is None else x.float().to(dtype).to(x.dtype)


class FusedAttention(torch.autograd.Function):
    """Causal attention as loom's fused kernel computes it with 16-bit
    activations: the backward takes D = rowsum(dO * O) from the output as
    kept, rounded to `dtype` (the kernel reads the kept activation, as
    FlashAttention's backward reads its 16-bit output), and the
    probabilities from q and k again. With the unrounded output this is
    autograd's backward exactly.

    pdtype bf16: the kernel's products on bf16 operands (the bf16 table on
    bf16 units): the forward's unnormalised probabilities exp(s - max) are
    rounded for P V (their sum is not), the backward's P for P^T dO and dS
    for dS K and dS^T Q (q, k, v and dO are bf16 values already). Exact
    for T <= 64, one key tile; beyond, the tile's running maximum decides
    what is rounded."""

    @staticmethod
    def forward(ctx, q, k, v, mask, dtype, pdtype):
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        att = att.masked_fill(~mask, float("-inf"))
        e = (att - att.amax(dim=-1, keepdim=True)).exp()
        l = e.sum(dim=-1, keepdim=True)
        p = e / l
        o = (_rounded(e, pdtype) @ v) / l
        ctx.pdtype = pdtype
        ctx.save_for_backward(q, k, v, p, _rounded(o, dtype))
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, p, o_kept = ctx.saved_tensors
        scale = 1.0 / math.sqrt(q.shape[-1])
        dp = do @ v.transpose(-2, -1)
        d = (do * o_kept).sum(dim=-1, keepdim=True)
        ds = _rounded(p * (dp - d) * scale, ctx.pdtype)
        pr = _rounded(p, ctx.pdtype)
        return ds @ k, ds.transpose(-2, -1) @ q, pr.transpose(-2, -1) @ do, None, None, None


def _dropped(x, drop, layer, site):
    """x (B, T, C) times dropout's mask of a token site (drop None: x)."""
    m = drop.hidden(layer, site, *x.shape) if drop else None
    return x if m is None else x * m


def causal_attention(q, k, v, dtype, mask=None, pdtype=None, pdrop=None):
    """softmax(q k^T / sqrt(HS), masked) v over (B, NH, T, HS); mask (T, T) or
    (B, 1, T, T) booleans, True where a query sees a key (None: causal).
    dtype: the activations' 16-bit dtype (FusedAttention), or None. pdrop:
    dropout's mask on the probabilities (B, NH, T, T), 0 or 1/(1-p), or None."""
    T = q.shape[-2]
    if mask is None:
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    if dtype is not None:
        assert pdrop is None
        return FusedAttention.apply(q, k, v, mask, dtype, pdtype)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    p = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return (p if pdrop is None else p * pdrop) @ v


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.heads = cfg.heads
        self.c_attn = Conv1D(cfg.hidden, 3 * cfg.hidden)
        self.c_proj = Conv1D(cfg.hidden, cfg.hidden)
        self.act_dtype = None
        self.operand_dtype = None  # set_attention_operands

    def forward(self, x, mask=None, drop=None, layer=0):
        B, T, C = x.shape
        NH = self.heads
        HS = C // NH
        q, k, v = round_act(self.c_attn(x), self.act_dtype).split(C, dim=2)
        q = q.view(B, T, NH, HS).transpose(1, 2)
        k = k.view(B, T, NH, HS).transpose(1, 2)
        v = v.view(B, T, NH, HS).transpose(1, 2)
        pdrop = drop.attention(layer, B, NH, T) if drop else None
        y = causal_attention(q, k, v, self.act_dtype, mask, self.operand_dtype, pdrop)
        y = round_act(y.transpose(1, 2).reshape(B, T, C), self.act_dtype)
        return _dropped(round_act(self.c_proj(y), self.act_dtype), drop, layer, dropout.ATTN_OUT)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = Conv1D(cfg.hidden, 4 * cfg.hidden)
        self.c_proj = Conv1D(4 * cfg.hidden, cfg.hidden)
        self.approximate = "tanh" if cfg.activation == "gelu_new" else "none"
        self.act_dtype = None

    def forward(self, x, drop=None, layer=0):
        a = self.act_dtype
        h = round_act(self.c_fc(x), a)
        y = round_act(self.c_proj(round_act(F.gelu(h, approximate=self.approximate), a)), a)
        return _dropped(y, drop, layer, dropout.MLP_OUT)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = LayerNorm(cfg.hidden, cfg.eps)
        self.attn = Attention(cfg)
        self.ln_2 = LayerNorm(cfg.hidden, cfg.eps)
        self.mlp = MLP(cfg)
        self.act_dtype = None

    def forward(self, x, mask=None, drop=None, layer=0):
        a = self.act_dtype
        x = round_act(x + self.attn(round_act(self.ln_1(x), a), mask, drop, layer), a)
        return round_act(x + self.mlp(round_act(self.ln_2(x), a), drop, layer), a)


class GPT2(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.hidden)
        self.wpe = nn.Embedding(cfg.max_pos, cfg.hidden)
        self.h = nn.ModuleList([Block(cfg) for _ in range(cfg.num_layers)])
        self.ln_f = LayerNorm(cfg.hidden, cfg.eps)
        if cfg.untied:  # the head's own weight, (V,C) as nn.Linear and Hugging Face store it
            self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.act_dtype = None

    def forward(self, idx, targets=None, keep=None, docs=None, drop=None):
        """idx (B,T) int64. Returns (logits (B,T,V), mean loss or None).
        keep: optional dict that receives each layer's output (for locating
        the first diverging layer). docs: optional (position_ids (B,T),
        attention_mask (B,1,T,T) booleans, loss_mask (B,T)) of packed
        documents (ltor_masks_and_position_ids); the loss is then the mean
        over the tokens the loss mask keeps. drop: optional dropout masks
        (pyref/dropout.py's Masks) for this micro-batch, as loom draws them."""
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)[None] if docs is None else docs[0]
        mask = None if docs is None else docs[1]
        x = _dropped(round_act(self.wte(idx) + self.wpe(pos), self.act_dtype), drop, -1, dropout.EMBEDDING)
        if keep is not None:
            keep["encoded"] = x
        for l, block in enumerate(self.h):
            x = block(x, mask, drop, l)
            if keep is not None:
                keep[f"h.{l}"] = x
        x = round_act(self.ln_f(x), self.act_dtype)
        head = self.lm_head.weight if self.cfg.untied else self.wte.weight
        logits = round_act(x @ head.t(), self.act_dtype)
        loss = None
        if targets is not None and docs is not None:
            each = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
            keep_loss = docs[2].reshape(-1).to(each.dtype)
            loss = (each * keep_loss).sum() / keep_loss.sum()
        elif targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


def ltor_masks_and_position_ids(data, eod, reset_position_ids, reset_attention_mask, eod_mask_loss):
    """Megatron's get_ltor_masks_and_position_ids, written out: for each end-
    of-document token at i of a row, later tokens do not attend to [0, i]
    (reset_attention_mask) and their positions drop by i + 1 - the previous
    document's start (reset_position_ids); eod_mask_loss zeroes the loss mask
    where the input token is eod. Returns (position_ids (B,T) int64,
    attention_mask (B,1,T,T) booleans True where a query sees a key,
    loss_mask (B,T) float)."""
    B, T = data.shape
    allowed = torch.ones(B, 1, T, T, dtype=torch.bool).tril()
    loss_mask = torch.ones(B, T)
    if eod_mask_loss:
        loss_mask[data == eod] = 0.0
    position_ids = torch.arange(T).repeat(B, 1)
    for b in range(B):
        prev = 0
        for i in (data[b] == eod).nonzero().flatten().tolist():
            if reset_attention_mask:
                allowed[b, 0, i + 1:, :i + 1] = False
            if reset_position_ids:
                position_ids[b, i + 1:] -= i + 1 - prev
                prev = i + 1
    return position_ids, allowed, loss_mask


def param_names(cfg):
    """Every parameter name, in the model's order."""
    return [n for n, _ in GPT2(Config(cfg.num_layers, 1, 1, 1, 1, untied=cfg.untied)).named_parameters()]


def init_weights(model, seed):
    """GPT-2 initialisation: normal(0, 0.02) for matrices and embeddings,
    normal(0, 0.02/sqrt(2L)) for the residual projections (attn.c_proj,
    mlp.c_proj), biases 0, LayerNorm gains 1. Draws in named_parameters()
    order from torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    L = model.cfg.num_layers
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02
                p.normal_(0.0, std)
            elif ".ln_" in name or name.startswith("ln_f"):
                p.fill_(1.0 if name.endswith(".weight") else 0.0)
            else:
                p.zero_()
    return model


def perturbed_weights(cfg, seed, matrix_scale=1.0):
    """GPT-2's initialisation (init_weights), then every LayerNorm gain and
    bias moved off 1 and 0 (normal noise of std 0.2 and 0.05, drawn in
    named_parameters() order from a generator seeded seed + 1) and every
    matrix multiplied by matrix_scale; as float32 arrays."""
    model = init_weights(GPT2(cfg), seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.ndim == 2:
                p.mul_(matrix_scale)
            elif p.ndim == 1 and name.endswith(".weight"):  # LayerNorm gains
                p.add_(0.2 * noise)
            elif p.ndim == 1:  # biases
                p.add_(0.05 * noise)
    return to_numpy(model, np.float32)


def to_numpy(model, dtype=np.float32):
    return {n: p.detach().cpu().numpy().astype(dtype) for n, p in model.named_parameters()}


def load_numpy(model, tensors):
    """Copies {name: array} into the model (every parameter must be there)."""
    params = dict(model.named_parameters())
    missing = set(params) - set(tensors)
    if missing:
        raise KeyError(f"missing tensors: {sorted(missing)}")
    with torch.no_grad():
        for n, p in params.items():
            a = torch.from_numpy(np.asarray(tensors[n]))
            if tuple(a.shape) != tuple(p.shape):
                raise ValueError(f"{n}: shape {tuple(a.shape)}, expected {tuple(p.shape)}")
            p.copy_(a.to(p.dtype))
    return model


def decay_groups(model, weight_decay):
    """AdamW groups: decay for tensors of two or more dimensions (matmul
    weights, wte, wpe), none for biases and LayerNorm parameters."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
