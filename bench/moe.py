"""A mixture of experts' cost: loom's MoE model against the dense model of
the same active FLOPs, and against PyTorch 2.x running Hugging Face's
MixtralForCausalLM.

    make && /usr/bin/python3 bench/moe.py [--rounds N] [--precision f32|bf16]

Shape (Mixtral's layers, small): 4 layers of 512 channels, 8 heads (4
key/value), T=256, micro-batch 4, vocabulary 32000; 2 threads. Columns:
  moe      `loom train --model mixtral-tiny` at that shape: top 2 of 8
           SwiGLU experts of 1024 in every layer (router, dispatch, the
           experts' products, combine);
  dense    the same model with a dense SwiGLU MLP of 2048 (`--model
           llama-tiny`): the MLP FLOPs a token meets are the same (two
           experts of 1024), so moe/dense is what routing, dispatch and
           the experts' separate products cost on top;
  PyTorch  PyTorch 2.x from PyPI (bench/bf16.py's environment, with
           transformers<4.40 added) training MixtralForCausalLM at the
           same shape and the same routing, bf16 under torch.autocast as
           its users train (float32 without), AdamW, clip_grad_norm_.
Runs alternate moe, dense, PyTorch, moe, ... (fresh processes); the first
step of each run is dropped and the rest of all rounds pooled into one
median tokens/s per column. Printed: the table, dense/moe (the MoE's cost,
whole model: the layer's own share is larger), moe/PyTorch.
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
WORKER = sys.argv[1:2] == ["--torch-worker"]
if not WORKER:  # the PyTorch worker keeps bench/ off its path (bench/tokenize.py would hide the standard library's)
    sys.path.insert(0, HERE)
    import bf16 as torch2  # noqa: E402  (its PyTorch 2.x environment)

THREADS = 2
L, C, NH, G, T, B, V, E, K, F = 4, 512, 8, 4, 256, 4, 32000, 8, 2, 1024
SHAPE = ["--num-layers", L, "--hidden-size", C, "--num-attention-heads", NH, "--num-query-groups", G,
         "--seq-length", T, "--max-position-embeddings", T, "--vocab-size", V, "--micro-batch-size", B,
         "--global-batch-size", B]


def ensure_transformers():
    p = subprocess.run([torch2.PY, "-c", "import transformers; print(transformers.__version__)"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        print("moe: installing transformers<4.40 into", torch2.VENV, flush=True)
        subprocess.run([torch2.PY, "-m", "pip", "install", "-q", "transformers<4.40"], check=True)


def run_loom(kind, precision, steps, shard_path, tmp):
    metrics = os.path.join(tmp, f"m_{kind}_{precision}_{time.monotonic_ns()}.jsonl")
    model = (["--model", "mixtral-tiny", "--ffn-hidden-size", F, "--num-experts", E, "--moe-router-topk", K]
             if kind == "moe" else ["--model", "llama-tiny", "--ffn-hidden-size", K * F, "--rotary-base", 1000000,
                                    "--untie-embeddings-and-output-weights"])
    args = [torch2.LOOM, "train"] + model + SHAPE + [
        "--train-iters", steps, "--data-path", shard_path, "--threads", THREADS, "--log-interval", 1,
        "--eval-iters", 0, "--metrics", metrics] + (["--bf16"] if precision == "bf16" else [])
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"moe: loom failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    with open(metrics) as f:
        rows = [json.loads(x) for x in f if x.strip()]
    return [r["tokens_per_s"] for r in rows if "tokens_per_s" in r and r["step"] > 1]


def torch_worker(steps, precision):
    """MixtralForCausalLM at the shape, trained `steps` steps; prints each step's tokens/s."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L,
                        num_attention_heads=NH, num_key_value_heads=G, max_position_embeddings=T,
                        num_local_experts=E, num_experts_per_tok=K, attn_implementation="sdpa")
    model = MixtralForCausalLM(cfg)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(1)
    times = []
    for _ in range(steps):
        x = torch.randint(0, V, (B, T + 1), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V), x[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"tokens_per_s": [B * T / t for t in times]}))


def run_torch(steps, precision):
    p = subprocess.run([torch2.PY, "-P", os.path.abspath(__file__), "--torch-worker", f"{steps},{precision}"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"moe: PyTorch run failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])["tokens_per_s"][1:]


def main():
    if WORKER:
        steps, precision = sys.argv[2].split(",")
        torch_worker(int(steps), precision)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--precision", choices=["f32", "bf16"], help="one precision")
    a = ap.parse_args()
    version = torch2.ensure_torch2()
    ensure_transformers()
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    import numpy as np
    from pyref import shard
    precisions = [a.precision] if a.precision else ["f32", "bf16"]
    table = []
    with tempfile.TemporaryDirectory(prefix="loom-bench-moe-") as tmp:
        shard_path = os.path.join(tmp, "train.bin")
        shard.write(shard_path, np.random.default_rng(0).integers(0, V, size=1_000_000))
        for prec in precisions:
            cols = {"moe": [], "dense": [], "torch": []}
            for r in range(a.rounds):
                cols["moe"] += run_loom("moe", prec, a.steps, shard_path, tmp)
                cols["dense"] += run_loom("dense", prec, a.steps, shard_path, tmp)
                cols["torch"] += run_torch(a.steps, prec)
                print(f"{prec} round {r + 1}: " + ", ".join(f"{k} {statistics.median(v):.1f}"
                                                          for k, v in cols.items()) + " tok/s", flush=True)
            table.append((prec, {k: statistics.median(v) for k, v in cols.items()}))
    print(f"\n{L} layers x {C}, top {K} of {E} experts of {F} (dense: {K * F}), T={T}, B={B}, V={V}, "
          f"{THREADS} threads; PyTorch {version}; medians over {a.rounds} round(s), tokens/s\n")
    print("| precision | loom MoE | loom dense | PyTorch Mixtral | dense/MoE (cost) | MoE/PyTorch |")
    print("|---|---|---|---|---|---|")
    for prec, med in table:
        print(f"| {prec} | {med['moe']:.1f} | {med['dense']:.1f} | {med['torch']:.1f} | "
              f"{med['dense'] / med['moe']:.2f} | {med['moe'] / med['torch']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
