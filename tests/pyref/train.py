"""The 20-step training run that test_train_torch and test_bf16_torch replay
in PyTorch: its settings, learning-rate schedule (linear warmup, then cosine
decay), token data, llm.c's sequential loader, the float32 reference
(torch.optim.AdamW with two groups, clip_grad_norm_, accumulation), and the
same run as `loom train` flags, so that the two sides cannot drift apart.
"""
import math

import numpy as np
import torch

from . import gpt2

L, C, NH, T, V = 2, 64, 4, 32, 128
B = 4
ITERS = 20
MAX_LR, MIN_LR, WARMUP = 1e-3, 1e-4, 5
WD, BETA1, BETA2, EPS = 0.1, 0.9, 0.95, 1e-8
SEED = 1234


def config():
    return gpt2.Config(L, C, NH, V, T)


def initial_weights():
    """The run's initial weights: GPT-2's initialisation, seeded SEED; float32."""
    return gpt2.to_numpy(gpt2.init_weights(gpt2.GPT2(config()), SEED), np.float32)


def lr_at(k):
    """Learning rate of step k (1-based): linear warmup, then cosine decay to
    MIN_LR at step ITERS."""
    if WARMUP > 0 and k <= WARMUP:
        return MAX_LR * k / WARMUP
    if k >= ITERS:
        return MIN_LR
    ratio = (k - WARMUP) / (ITERS - WARMUP)
    coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    return MIN_LR + coeff * (MAX_LR - MIN_LR)


def make_tokens(n, seed):
    """n tokens from a random sparse Markov chain (each token has a few likely
    successors), so the model has something to learn and the loss moves."""
    rng = np.random.default_rng(seed)
    succ = rng.integers(0, V, size=(V, 4))
    toks = np.empty(n, dtype=np.int64)
    toks[0] = rng.integers(0, V)
    choice = rng.integers(0, 4, size=n)
    noise = rng.random(n) < 0.2
    rand = rng.integers(0, V, size=n)
    for i in range(1, n):
        toks[i] = rand[i] if noise[i] else succ[toks[i - 1], choice[i]]
    return toks


def batch(tokens, step, G):
    """llm.c's sequential loader: step s (0-based) reads G*T+1 tokens from
    (s mod nblocks)*G*T; row b is inputs block[b*T:b*T+T], targets one on."""
    nblocks = (len(tokens) - 1) // (G * T)
    start = (step % nblocks) * G * T
    block = tokens[start:start + G * T + 1]
    x = np.stack([block[b * T:b * T + T] for b in range(G)])
    y = np.stack([block[b * T + 1:b * T + T + 1] for b in range(G)])
    return torch.from_numpy(x), torch.from_numpy(y)


def reference(init, tokens, G, clip, dtype=torch.float32, docs=None, drop=None):
    """Per step: (loss, lr, grad_norm) of PyTorch's run. docs: optional
    (eod, reset_position_ids, reset_attention_mask, eod_mask_loss), packed
    documents as Megatron masks them (gpt2.ltor_masks_and_position_ids).
    drop: optional dropout masks (pyref/dropout.py's Masks), keyed by step
    and each micro-batch's first row as loom keys them."""
    torch.manual_seed(0)
    model = gpt2.load_numpy(gpt2.GPT2(config()).to(dtype), init)
    opt = torch.optim.AdamW(gpt2.decay_groups(model, WD), lr=MAX_LR, betas=(BETA1, BETA2), eps=EPS)
    A = G // B
    out = []
    for s in range(ITERS):
        lr = lr_at(s + 1)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        x, y = batch(tokens, s, G)
        loss_sum = 0.0
        for m in range(A):
            xm = x[m * B:(m + 1) * B]
            masks = None if docs is None else gpt2.ltor_masks_and_position_ids(xm, *docs)
            if drop:
                drop.step, drop.first_row = s + 1, m * B
            _, loss = model(xm, y[m * B:(m + 1) * B], docs=masks, drop=drop)
            (loss / A).backward()
            loss_sum += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item()
        opt.step()
        out.append((loss_sum / A, lr, norm))
    return out


def loom_args(init_path, data_path, G, clip, metrics, extra=()):
    """`loom train` flags for the same run, from init_path's weights, logging
    every step to metrics."""
    args = ["--load", init_path, "--data-path", data_path, "--data-order", "sequential",
            "--num-layers", L, "--hidden-size", C, "--num-attention-heads", NH, "--seq-length", T,
            "--max-position-embeddings", T, "--vocab-size", V, "--micro-batch-size", B,
            "--global-batch-size", G, "--train-iters", ITERS, "--lr", MAX_LR, "--min-lr", MIN_LR,
            "--lr-warmup-iters", WARMUP, "--lr-decay-style", "cosine", "--weight-decay", WD,
            "--adam-beta1", BETA1, "--adam-beta2", BETA2, "--adam-eps", EPS, "--clip-grad", clip,
            "--log-interval", 1, "--eval-iters", 0, "--metrics", metrics, "--threads", 2] + list(extra)
    return [str(a) for a in args]
