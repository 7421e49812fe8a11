#!/usr/bin/env python3
"""Sharded Hugging Face checkpoints (model.safetensors.index.json), as
transformers' save_pretrained(max_shard_size=...) writes them:

1. Llama (untied head) and GPT-2 (tied, `transformer.` names) saved both
   whole and in shards of 60 KB: `loom eval --load` of the sharded directory
   gives the whole one's validation loss exactly, and 3 steps of `loom train
   --load --finetune` the same losses (the same weights, read shard by
   shard); `loom convert` of the sharded directory writes a single-file
   directory that evaluates the same.
2. Memory: a 57M-parameter Llama (228 MB in float32) in shards of 20 MB is
   read one shard mapped at a time: the peak resident set of `loom eval`
   loading it is at least 80% of (model - one shard) below the same model
   loaded from one file (which maps the whole file), and the peak is
   printed beside the model's bytes. The issue's bound, the loading's own
   memory below the model plus one shard: the peak less the process's own
   (a 1-layer model's peak less its bytes: the libraries, MPI, the
   evaluation's buffers) is below the model's bytes plus the largest shard.
3. Bad input, each one line and exit 2 naming the file: an index that is not
   JSON, one without a weight_map, one naming a shard that is not there, a
   tensor no shard holds; a --max-shard-size that is not a size.
4. Writing: `loom convert --to hf --max-shard-size 60KB` writes shards and
   model.safetensors.index.json (and no single file); transformers loads
   the directory with no missing or unexpected keys and gives the source's
   logits exactly; loom evaluates it as the source.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import lib
from lib import check

lib.use_transformers()
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402


def models():
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                         tie_word_embeddings=False))
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=32))
    return {"llama": llama, "gpt2": gpt2}


def val_loss(d, tmp):
    p = lib.loom("eval", "--load", d, "--valid-data-path", os.path.join(tmp, "train.bin"), "--eval-iters", "2",
                 "--seq-length", "32", "--threads", "1")
    return p.stdout.split("val loss")[1].split()[0] if p.returncode == 0 and "val loss" in p.stdout else p.stderr


def finetune(d, tmp, tag):
    m = os.path.join(tmp, f"ft-{tag}.jsonl")
    p = lib.loom("train", "--load", d, "--finetune", "--data-path", os.path.join(tmp, "train.bin"), "--seq-length",
                 "32", "--train-iters", "3", "--micro-batch-size", "2", "--global-batch-size", "2", "--eval-iters",
                 "0", "--threads", "1", "--metrics", m, "--log-interval", "1")
    return [r["loss"] for r in lib.metrics_rows(m)] if p.returncode == 0 else p.stderr


def same_weights(tmp):
    for tag, model in models().items():
        whole, sharded = os.path.join(tmp, f"{tag}-whole"), os.path.join(tmp, f"{tag}-sharded")
        model.save_pretrained(whole, safe_serialization=True)
        model.save_pretrained(sharded, safe_serialization=True, max_shard_size="60KB")
        shards = [n for n in os.listdir(sharded) if n.endswith(".safetensors")]
        a, b = val_loss(whole, tmp), val_loss(sharded, tmp)
        check(f"{tag}: {len(shards)} shards evaluate as the whole file (val loss {b} vs {a})",
              len(shards) > 2 and a == b and isinstance(a, str) and a[0].isdigit(), f"{a} vs {b}")
        a, b = finetune(whole, tmp, f"{tag}-whole"), finetune(sharded, tmp, f"{tag}-sharded")
        check(f"{tag}: 3 fine-tuning steps from the shards are the whole file's, bit for bit ({b})",
              isinstance(a, list) and len(a) == 3 and a == b, f"{a} vs {b}")
        out = os.path.join(tmp, f"{tag}-converted")
        p = lib.loom("convert", sharded, out)
        check(f"{tag}: loom convert of the shards writes one file that evaluates the same",
              p.returncode == 0 and os.path.exists(os.path.join(out, "model.safetensors")) and
              val_loss(out, tmp) == val_loss(whole, tmp), p.stderr[-300:])


def export(tmp):
    """loom convert --max-shard-size writes shards and their index; the
    directory loads in transformers with every tensor (no missing or
    unexpected keys) and its logits are the model's, and loom evaluates it
    as the source."""
    src = os.path.join(tmp, "llama-whole")
    out = os.path.join(tmp, "llama-export")
    p = lib.loom("convert", src, out, "--to", "hf", "--max-shard-size", "60KB")
    names = sorted(os.listdir(out)) if os.path.isdir(out) else []
    shards = [n for n in names if n.endswith(".safetensors")]
    ok = p.returncode == 0 and len(shards) > 2 and "model.safetensors.index.json" in names and \
        "model.safetensors" not in names
    check(f"loom convert --max-shard-size 60KB: {len(shards)} shards and the index, no single file", ok,
          p.stderr[-300:])
    if not ok:
        return
    ref = LlamaForCausalLM.from_pretrained(src).eval()
    got, info = LlamaForCausalLM.from_pretrained(out, output_loading_info=True)
    ids = torch.arange(32).reshape(1, 32) % 256
    with torch.no_grad():
        same = torch.equal(ref(ids).logits, got.eval()(ids).logits)
    check(f"transformers loads the shards with every tensor (missing {info['missing_keys']}, unexpected "
          f"{info['unexpected_keys']}) and gives the source's logits exactly",
          not info["missing_keys"] and not info["unexpected_keys"] and same)
    check("loom evaluates its own shards as the source", val_loss(out, tmp) == val_loss(src, tmp))
    p = lib.loom("convert", src, os.path.join(tmp, "x"), "--to", "hf", "--max-shard-size", "5 parsecs")
    errs = lib.error_lines(p.stderr)
    check("--max-shard-size 5 parsecs: exit 2, one line naming it", p.returncode == 2 and len(errs) == 1 and
          "--max-shard-size" in errs[0], p.stderr[-300:])


def peak_rss(cmd):
    """Peak resident set (bytes) of the finished command, and its exit status:
    the largest VmHWM of its own address space read while it runs (the
    rusage of a child of this process would count this process's own pages,
    which a fork copies before the exec)."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=lib.ENV)
    hwm = 0
    while p.poll() is None:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        hwm = max(hwm, int(line.split()[1]) * 1024)
        except OSError:
            pass
        time.sleep(0.002)
    return hwm, p.returncode


def memory(tmp):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=64,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    nbytes = 4 * sum(p.numel() for p in model.parameters())
    whole, sharded = os.path.join(tmp, "big-whole"), os.path.join(tmp, "big-sharded")
    model.save_pretrained(whole, safe_serialization=True)
    model.save_pretrained(sharded, safe_serialization=True, max_shard_size="20MB")
    del model
    shard = max(os.path.getsize(os.path.join(sharded, n)) for n in os.listdir(sharded) if n.endswith(".safetensors"))
    eval_args = ["eval", "--valid-data-path", os.path.join(tmp, "train.bin"), "--eval-iters", "1", "--seq-length",
                 "16", "--micro-batch-size", "1", "--global-batch-size", "1", "--threads", "1"]
    a, ra = peak_rss([lib.LOOM, *eval_args, "--load", whole])
    b, rb = peak_rss([lib.LOOM, *eval_args, "--load", sharded])
    check(f"a {nbytes / 1e6:.0f} MB model: peak RSS {b / 1e6:.0f} MB from 20 MB shards (largest {shard / 1e6:.1f} MB) "
          f"against {a / 1e6:.0f} MB from one file: at least 80% of (model - one shard) less",
          ra == 0 and rb == 0 and a - b >= 0.8 * (nbytes - shard), f"exit {ra}, {rb}")
    small = LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                         tie_word_embeddings=False))
    small_bytes = 4 * sum(p.numel() for p in small.parameters())
    small.save_pretrained(os.path.join(tmp, "small"), safe_serialization=True, max_shard_size="20MB")
    c, rc = peak_rss([lib.LOOM, *eval_args, "--load", os.path.join(tmp, "small")])
    own = c - small_bytes
    check(f"the loading's own memory: {(b - own) / 1e6:.0f} MB above the process's own {own / 1e6:.0f} MB, below the "
          f"model plus one shard ({(nbytes + shard) / 1e6:.0f} MB)", rc == 0 and b - own < nbytes + shard,
          f"exit {rc}")


def bad_input(tmp):
    src = os.path.join(tmp, "llama-sharded")
    index = "model.safetensors.index.json"
    cases = []

    def variant(name, edit):
        d = os.path.join(tmp, f"bad-{name}")
        shutil.copytree(src, d)
        edit(d)
        return d

    def write(d, text):
        open(os.path.join(d, index), "w").write(text)

    doc = json.load(open(os.path.join(src, index)))
    cases.append(("an index that is not JSON", variant("json", lambda d: write(d, "{ not json")), [index,
                                                                                                   "not valid JSON"]))
    cases.append(("an index without a weight_map", variant("map", lambda d: write(d, json.dumps({"metadata": {}}))),
                  [index, "weight_map"]))
    missing = dict(doc, weight_map=dict(doc["weight_map"]))
    first = next(iter(missing["weight_map"]))
    missing["weight_map"][first] = "model-99999-of-99999.safetensors"
    cases.append(("an index naming a shard that is not there",
                  variant("shard", lambda d: write(d, json.dumps(missing))), [index, "model-99999-of-99999"]))
    gone = sorted(doc["weight_map"])[-1]

    def drop(d):  # a shard rewritten without one tensor, and the index without it
        from safetensors.torch import load_file, save_file
        f = os.path.join(d, doc["weight_map"][gone])
        t = load_file(f)
        del t[gone]
        save_file(t, f, metadata={"format": "pt"})
        w = dict(doc, weight_map={k: v for k, v in doc["weight_map"].items() if k != gone})
        write(d, json.dumps(w))
    cases.append(("a tensor no shard holds", variant("tensor", drop), [gone]))
    for what, d, needles in cases:
        p = lib.loom("eval", "--load", d, "--valid-data-path", os.path.join(tmp, "train.bin"), "--eval-iters", "1",
                     "--seq-length", "32")
        errs = lib.error_lines(p.stderr)
        check(f"{what}: exit 2, one line naming it", p.returncode == 2 and len(errs) == 1 and
              all(n in errs[0] for n in needles), p.stderr[-400:])
        if errs:
            print(f"     {errs[0]}")


def main():
    if not lib.built(lib.LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        same_weights(tmp)
        bad_input(tmp)
        export(tmp)
        memory(tmp)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
