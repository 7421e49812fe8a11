"""Dropout's masks as loom draws them (src/kernels/dropout_mask.h), in numpy:
element (row, col) of a site is kept where a counter hash of (the site's key,
row, col) is at least round(p 2^32), and scaled by 1 / (1 - p). A site's key
mixes the seed, the step (from 1), the layer (-1: the embedding) and the site;
rows are global ids: a token's (sequence of the step) T + position, an
attention row's ((sequence) heads + head) T + query position.

Masks(p_hidden, p_attention, p_embedding, seed) gives the GPT-2 reference
(pyref/gpt2.py) its masks for a micro-batch: set .step and .first_row, then
the model asks hidden(layer, site, B, T, C) and attention(layer, B, NH, T).
"""
import numpy as np
import torch

M64 = (1 << 64) - 1
EMBEDDING, ATTENTION, ATTN_OUT, MLP_OUT = 0, 1, 2, 3


def mix64_int(z):
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def mix64(z):
    """SplitMix64's finalizer on a uint64 array."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def mix32(h):
    """MurmurHash3's finalizer on a uint32 array."""
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint32(16))
        h = h * np.uint32(0x85EBCA6B)
        h = h ^ (h >> np.uint32(13))
        h = h * np.uint32(0xC2B2AE35)
        return h ^ (h >> np.uint32(16))


def site_key(seed, step, layer, site):
    where = ((layer + 1) << 2) | site
    return mix64_int(seed ^ mix64_int(step ^ mix64_int(where)))


def mask(p, seed, step, layer, site, rows, ncols):
    """(len(rows), ncols) float32: 0 or 1 / (1 - p)."""
    key = np.uint64(site_key(seed, step, layer, site))
    thr = min(int(p * 4294967296.0 + 0.5), 4294967295)
    rk = mix64(np.uint64(key) ^ mix64(np.asarray(rows, dtype=np.uint64)))
    lo = (rk & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    hi = (rk >> np.uint64(32)).astype(np.uint32)
    with np.errstate(over="ignore"):
        cols = np.arange(ncols, dtype=np.uint32) * np.uint32(0x9E3779B9)
        u = mix32(lo[:, None] + cols[None, :]) ^ hi[:, None]
    return np.where(u >= np.uint32(thr), np.float32(1.0 / (1.0 - p)), np.float32(0.0)).astype(np.float32)


class Masks:
    def __init__(self, p_hidden, p_attention, p_embedding, seed):
        self.p = {ATTN_OUT: p_hidden, MLP_OUT: p_hidden, EMBEDDING: p_embedding, ATTENTION: p_attention}
        self.seed = seed
        self.step = 1
        self.first_row = 0

    def hidden(self, layer, site, B, T, C):
        """(B, T, C) for a token site, or None where p is 0."""
        p = self.p[site]
        if p <= 0:
            return None
        rows = [(self.first_row + b) * T + t for b in range(B) for t in range(T)]
        return torch.from_numpy(mask(p, self.seed, self.step, layer, site, rows, C).reshape(B, T, C))

    def attention(self, layer, B, NH, T):
        """(B, NH, T, T) on the probabilities, or None."""
        p = self.p[ATTENTION]
        if p <= 0:
            return None
        rows = [((self.first_row + b) * NH + h) * T + i for b in range(B) for h in range(NH) for i in range(T)]
        return torch.from_numpy(mask(p, self.seed, self.step, layer, ATTENTION, rows, T).reshape(B, NH, T, T))
