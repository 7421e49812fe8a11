"""bf16 training throughput of GPT-2 124M: loom --bf16 against PyTorch 2.x with bf16 autocast.

    make && /usr/bin/python3 bench/bf16.py [--rounds N] [--steps N] [--only B,T]

The peer is what a PyTorch user runs today: PyTorch 2.x from PyPI,
installed by this script into its own virtual environment
(build/bench-torch2, about 5 GB and a minute, once; never a dependency of
loom), GPT-2 124M written plainly with F.scaled_dot_product_attention
(causal), GPT-2's initialisation (normal 0.02, the residual projections
0.02/sqrt(2L), a tied head), torch.optim.AdamW with decay on 2-D tensors,
clip_grad_norm_(1.0), torch.autocast("cpu", torch.bfloat16), 2 threads.
loom: `loom train --model gpt2 --bf16 --threads 2`, its tokens/s and MFU
read from its metrics (MFU against the bf16 peak it calibrates at
start-up), with the units it names on its start-up line.

Shapes B=4,T=64 and B=8,T=256. Runs alternate loom, PyTorch, loom, ...
(fresh processes); the first step of each run is dropped and the rest of
all rounds pooled into one median per column; loom/PyTorch is the ratio of
the medians, and the median of the per-round ratios is printed beside it.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))
LOOM = os.path.join(BUILD, "loom")
VENV = os.path.join(BUILD, "bench-torch2")
PY = os.path.join(VENV, "bin", "python")
L, C, NH, V, MAXT = 12, 768, 12, 50257, 1024
THREADS = 2


def ensure_torch2():
    if not os.path.exists(PY):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    p = subprocess.run([PY, "-c", "import torch, numpy; print(torch.__version__)"], capture_output=True, text=True)
    if p.returncode != 0:
        print("bf16: installing PyTorch 2.x from PyPI into", VENV, flush=True)
        subprocess.run([PY, "-m", "pip", "install", "-q", "torch", "numpy"], check=True)
        p = subprocess.run([PY, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True,
                           check=True)
    version = p.stdout.strip()
    if not version.startswith("2."):
        sys.exit(f"bf16: PyTorch {version} in {VENV}, expected 2.x")
    return version


# ---- the PyTorch side (runs under the venv's python) ----

def torch_worker(B, T, steps, precision="bf16"):
    """GPT-2 124M trained `steps` steps at B, T in PyTorch 2.x, bf16 autocast
    (precision bf16) or float32; prints the tokens/s of each step."""
    import math

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (z.view(b, t, NH, C // NH).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(max(MAXT, T), C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)
            self.lm_head = nn.Linear(C, V, bias=False)
            self.lm_head.weight = self.wte.weight
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * L) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for blk in self.h:
                x = blk(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.float().view(-1, V), targets.reshape(-1))

    model = GPT()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(1)
    times = []
    for _ in range(steps):
        x = torch.randint(0, V, (B, T + 1), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"tokens_per_s": [B * T / t for t in times]}))


def run_torch(B, T, steps, precision="bf16"):
    # -P: bench/ stays off the import path (its tokenize.py would hide the standard library's)
    p = subprocess.run([PY, "-P", os.path.abspath(__file__), "--torch-worker", f"{B},{T},{steps},{precision}"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"bf16: PyTorch run failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])["tokens_per_s"][1:]


# ---- the loom side ----

def run_loom(B, T, steps, shard_path, tmp):
    metrics = os.path.join(tmp, f"m_{B}_{T}_{time.monotonic_ns()}.jsonl")
    args = [LOOM, "train", "--model", "gpt2", "--bf16", "--seq-length", T, "--micro-batch-size", B,
            "--global-batch-size", B, "--train-iters", steps, "--data-path", shard_path, "--threads", THREADS,
            "--log-interval", 1, "--eval-iters", 0, "--metrics", metrics]
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"bf16: loom failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    units = next((ln for ln in p.stdout.splitlines() if ln.startswith("bf16:")), "bf16: ?")
    peak = next((ln.split("peak", 1)[1].strip() for ln in p.stdout.splitlines() if ln.startswith("ranks:")), "")
    with open(metrics) as f:
        rows = [json.loads(x) for x in f if x.strip()]
    rows = [r for r in rows if "tokens_per_s" in r and r["step"] > 1]
    return [r["tokens_per_s"] for r in rows], [r["mfu"] for r in rows], units, peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--only", help="one shape, B,T")
    ap.add_argument("--torch-worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        b, t, n, prec = a.torch_worker.split(",")
        torch_worker(int(b), int(t), int(n), prec)
        return 0
    version = ensure_torch2()
    shapes = [tuple(map(int, a.only.split(",")))] if a.only else [(4, 64), (8, 256)]
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import numpy as np
    from pyref import shard
    with tempfile.TemporaryDirectory(prefix="loom-bench-bf16-") as tmp:
        shard_path = os.path.join(tmp, "train.bin")
        shard.write(shard_path, np.random.default_rng(0).integers(0, V, size=2_000_000))
        table = []
        for B, T in shapes:
            lt, lm, pt, ratios = [], [], [], []
            units = peak = ""
            for r in range(a.rounds):
                tps, mfu, units, peak = run_loom(B, T, a.steps, shard_path, tmp)
                ptps = run_torch(B, T, a.steps)
                lt += tps
                lm += mfu
                pt += ptps
                ratios.append(statistics.median(tps) / statistics.median(ptps))
                print(f"B={B} T={T} round {r + 1}: loom {statistics.median(tps):.0f} tok/s "
                      f"(mfu {100 * statistics.median(mfu):.1f}%), PyTorch {version} {statistics.median(ptps):.0f} "
                      f"tok/s", flush=True)
            table.append((B, T, statistics.median(lt), statistics.median(pt), statistics.median(lt) /
                          statistics.median(pt), statistics.median(ratios), statistics.median(lm)))
        print(f"\nloom --bf16 ({units}; peak {peak}) against PyTorch {version} bf16 autocast, "
              f"{THREADS} threads, medians over {a.rounds} round(s)\n")
        print("| B | T | loom tok/s | PyTorch tok/s | loom/PyTorch | median of round ratios | loom MFU |")
        print("|---|---|---|---|---|---|---|")
        for B, T, l, p, ratio, rr, m in table:
            print(f"| {B} | {T} | {l:.0f} | {p:.0f} | {ratio:.2f} | {rr:.2f} | {100 * m:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
