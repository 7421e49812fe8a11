#!/usr/bin/env python3
"""Megatron-LM's own launch scripts through `loom train`, unchanged but for
the launcher (mpirun -np 2 for torchrun) and the sizes (shrunk to run here).

The flag sets are those of Megatron-LM's examples/gpt3/train_gpt3_175b_
distributed.sh, examples/mixtral/train_mixtral_8x7b_distributed.sh and
examples/llama/train_llama2.sh, with the data made in the test: GPT-2's
vocab.json + merges.txt and a SentencePiece tokenizer.model trained here,
Megatron's indexed dataset written by `loom data tokenize`. Each trains;
every flag is honoured, or taken with one line saying why it has no effect
here (never "unknown flag"); GPT-3's --rampup-batch-size ramps the batch
as Megatron does (tests/test_batch_rampup.py holds it in detail).

Honoured flags checked for their effect: the vocabulary taken from the
tokenizer padded by --make-vocab-size-divisible-by x TP (Megatron's), the
family taken from the flags when --model is not given, --save DIR --load
DIR starting afresh before the first checkpoint and resuming after it,
--init-method-std (the first loss of a 1.0 draw is far above 0.02's), the
samples-based schedule (--train-samples, --lr-warmup-samples,
--lr-decay-samples), --lr-warmup-fraction, --no-load-optim (a resume's
next loss as the run's, the one after it not: the optimizer restarted),
--tensorboard-log-interval (scalars every N steps between log lines),
--distributed-timeout-minutes (as --comm-timeout seconds),
--sequence-parallel on one tensor-parallel rank switched off as Megatron
does.
"""
import json
import os
import re
import sys
import tempfile

import lib
from lib import LOOM, check

lib.use_sentencepiece()  # its virtual environment holds sentencepiece, tokenizers, transformers
import sentencepiece as spm  # noqa: E402
from tokenizers import ByteLevelBPETokenizer  # noqa: E402

import test_tokenizer_hf as th  # noqa: E402


def make_data(tmp):
    """GPT-2's two files, a Llama-2-style tokenizer.model and its HF
    directory, and a Megatron dataset of the documents."""
    docs = th.corpus(1, 300)
    gpt2 = os.path.join(tmp, "gpt2")
    os.makedirs(gpt2)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(docs, vocab_size=500, special_tokens=["<|endoftext|>"])
    bpe.save_model(gpt2)
    corpus = os.path.join(tmp, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n".join(line for d in docs for line in d.splitlines() if line.strip()))
    spm.SentencePieceTrainer.train(input=corpus, model_prefix=os.path.join(tmp, "tokenizer"), vocab_size=600,
                                   model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2, num_threads=1)
    from transformers import LlamaTokenizerFast
    hf = os.path.join(tmp, "llama-tokenizer")
    LlamaTokenizerFast(vocab_file=os.path.join(tmp, "tokenizer.model"), legacy=True).save_pretrained(hf)
    jl = os.path.join(tmp, "docs.jsonl")
    with open(jl, "w", encoding="utf-8") as f:  # enough documents that --split 949,50,1 gives a test split
        for d in th.corpus(3, 1500):
            f.write(json.dumps({"text": d}) + "\n")
    p = lib.loom("data", "tokenize", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file",
                 os.path.join(gpt2, "vocab.json"), "--merge-file", os.path.join(gpt2, "merges.txt"), "--input", jl,
                 "--output-prefix", os.path.join(tmp, "web"), "--output-format", "megatron", "--append-eod",
                 "--no-progress")
    if p.returncode:
        raise SystemExit(f"FAIL: preparing the data: {p.stderr[-400:]}")
    return gpt2, os.path.join(tmp, "tokenizer.model"), hf, os.path.join(tmp, "web_text_document")


def explained(stderr, flags):
    """The flags of `flags` that loom has no setting for must each have a line."""
    said = set(re.findall(r"warning: (--[a-z0-9-]+)[^:]*: no effect here", stderr))
    return said


def run_script(tag, args, no_effect, ranks=2, expect_steps=None):
    p = lib.run_ranks(ranks, [LOOM, "train", *args], expect=None, timeout=600)
    steps = [l for l in p.stdout.splitlines() if l.startswith("step ")]
    said = explained(p.stderr, args)
    missing = sorted(set(no_effect) - said)
    check(f"{tag}: trains on {ranks} ranks ({len(steps)} step lines), every flag loom has no setting for explained "
          f"in one line ({len(said)})", p.returncode == 0 and "unknown flag" not in p.stderr and not missing
          and (expect_steps is None or len(steps) == expect_steps),
          "\n".join(l for l in p.stderr.splitlines() if "error" in l)[-600:] or str(missing))
    return p


def table(stdout):
    rows = {}
    for line in stdout.splitlines():
        m = re.match(r"^  (\S+) +(.*?) +\((\w[^)]*)\)$", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def gpt3(tmp, gpt2, prefix):
    ck, tb = os.path.join(tmp, "gpt3-ck"), os.path.join(tmp, "gpt3-tb")
    args = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--max-position-embeddings", "32", "--attention-backend", "auto",
            "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "6", "--weight-decay", "0.1",
            "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--init-method-std", "0.006", "--clip-grad", "1.0",
            "--fp16", "--lr", "6.0e-5", "--lr-decay-style", "cosine", "--min-lr", "6.0e-6",
            "--lr-warmup-fraction", ".001", "--lr-decay-iters", "10",
            "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1",
            "--data-path", prefix, "--vocab-file", os.path.join(gpt2, "vocab.json"), "--merge-file",
            os.path.join(gpt2, "merges.txt"), "--split", "949,50,1",
            "--log-interval", "1", "--save-interval", "3", "--eval-interval", "3", "--save", ck, "--load", ck,
            "--eval-iters", "2", "--tensorboard-dir", tb]
    p = run_script("GPT-3 175B's script (examples/gpt3)", args, [], expect_steps=6)
    rows = table(p.stdout)
    check(f"GPT-3: the vocabulary is the tokenizer's 500 ids padded to 128 x TP 2 ({rows.get('vocab-size')}), the "
          f"warmup 0.001 of 10 steps ({rows.get('lr-warmup-iters')}), init std {rows.get('init-method-std')}; it "
          "started afresh with --load = --save empty, saved, and wrote TensorBoard's file",
          rows.get("vocab-size") == ("512", "derived") and rows.get("lr-warmup-iters") == ("0", "derived")
          and rows.get("init-method-std", ("",))[0] == "0.006" and "holds no checkpoint yet" in p.stderr
          and os.path.isdir(os.path.join(ck, "iter_0000006")) and os.listdir(tb), p.stderr[-300:])
    q = lib.run_ranks(2, [LOOM, "train", *args, "--train-iters", "7", "--lr-decay-iters", "10"], expect=None,
                      timeout=600)
    check("GPT-3: the same command again resumes from --save (step 7 of 7)",
          q.returncode == 0 and "resumed at step 7" in q.stdout and "step 7/7" in q.stdout, q.stderr[-300:])
    # the script's batch rampup (16 16 5859375 of 1536, shrunk): samples-based, as its --train-samples run is
    drop = {"--train-iters", "--lr-decay-iters", "--save", "--load", "--save-interval", "--eval-interval",
            "--tensorboard-dir"}
    ramp = [a for i, a in enumerate(args) if a not in drop and (i == 0 or args[i - 1] not in drop)]
    ramp += ["--rampup-batch-size", "2", "2", "8", "--train-samples", "24", "--lr-decay-samples", "20"]
    r = lib.run_ranks(2, [LOOM, "train", *ramp], expect=None, timeout=600)
    batches = re.findall(r"global batch (\d+)", r.stdout)
    check(f"GPT-3: --rampup-batch-size 2 2 8 of 4 over --train-samples 24: Megatron's 8 steps of batches "
          f"{batches}", r.returncode == 0 and batches == ["2"] * 4 + ["4"] * 4, r.stderr[-300:])


def mixtral(tmp, model):
    args = ["--use-mcore-models", "--disable-bias-linear", "--seq-length", "32", "--max-position-embeddings", "64",
            "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "96", "--num-attention-heads", "2",
            "--init-method-std", "0.01", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
            "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--swiglu",
            "--untie-embeddings-and-output-weights", "--group-query-attention", "--num-query-groups", "2",
            "--no-masked-softmax-fusion", "--no-position-embedding", "--rotary-base", "1000000",
            "--num-experts", "2", "--moe-router-topk", "2", "--moe-router-load-balancing-type", "aux_loss",
            "--moe-aux-loss-coeff", "1e-2", "--moe-token-dispatcher-type", "alltoall", "--overlap-param-gather",
            "--overlap-grad-reduce", "--moe-shared-expert-overlap",
            "--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", model, "--mock-data", "--split", "99990,8,2",
            "--micro-batch-size", "1", "--global-batch-size", "4", "--lr", "1e-4", "--train-iters", "7",
            "--min-lr", "1.0e-5", "--weight-decay", "0.1", "--clip-grad", "1.0",
            "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
            "--expert-model-parallel-size", "2", "--use-distributed-optimizer", "--sequence-parallel",
            "--eval-iters", "10", "--no-load-optim", "--no-load-rng"]
    no_effect = ["--use-mcore-models", "--no-masked-softmax-fusion",
                 "--no-position-embedding", "--overlap-param-gather", "--overlap-grad-reduce", "--no-load-rng"]
    p = run_script("Mixtral 8x7B's script (examples/mixtral)", args, no_effect, expect_steps=None)
    rows = table(p.stdout)
    check(f"Mixtral: mixtral's family from the flags ({rows.get('model')}), EP 2, the vocabulary the tokenizer's 600 "
          f"padded to 128 ({rows.get('vocab-size')}), --sequence-parallel on one TP rank off as Megatron turns it off",
          rows.get("model") == ("mixtral-tiny", "derived") and rows.get("expert-model-parallel-size", ("",))[0] == "2"
          and rows.get("vocab-size") == ("640", "derived") and "--sequence-parallel has no tensor-parallel" in p.stderr
          and "step 7/7" in p.stdout, p.stderr[-300:])


def llama2(tmp, hf):
    log = os.path.join(tmp, "llama-log")
    args = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1", "--context-parallel-size", "1",
            "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
            "--seq-length", "32", "--max-position-embeddings", "64", "--untie-embeddings-and-output-weights",
            "--position-embedding-type", "rope", "--no-position-embedding", "--swiglu", "--disable-bias-linear",
            "--init-method-std", "0.02", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
            "--normalization", "RMSNorm", "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "4",
            "--no-async-tensor-model-parallel-allreduce", "--bf16", "--no-masked-softmax-fusion",
            "--lr", "1e-4", "--min-lr", "1e-5", "--lr-decay-iters", "320000", "--lr-decay-style", "cosine",
            "--weight-decay", "1.0e-1", "--clip-grad", "1.0", "--optimizer", "adam", "--adam-beta1", "0.9",
            "--adam-beta2", "0.95",
            "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", hf, "--split", "99990,8,2",
            "--dataloader-type", "cyclic", "--save-interval", "200000", "--tensorboard-dir", log, "--log-interval", "1",
            "--eval-interval", "320000", "--eval-iters", "10", "--num-workers", "8", "--mock-data",
            "--log-interval", "1", "--log-throughput", "--no-save-optim", "--no-save-rng", "--eval-iters", "2",
            "--group-query-attention", "--num-query-groups", "4", "--no-gradient-accumulation-fusion",
            "--distributed-backend", "nccl", "--distributed-timeout-minutes", "120", "--overlap-grad-reduce",
            "--use-distributed-optimizer", "--overlap-param-gather", "--use-flash-attn", "--sequence-parallel",
            "--use-mcore-models"]
    no_effect = ["--no-position-embedding",
                 "--no-async-tensor-model-parallel-allreduce", "--no-masked-softmax-fusion", "--dataloader-type",
                 "--num-workers", "--log-throughput", "--no-save-optim", "--no-save-rng",
                 "--no-gradient-accumulation-fusion", "--distributed-backend", "--overlap-grad-reduce",
                 "--overlap-param-gather", "--use-mcore-models"]
    p = run_script("Llama 2's script (examples/llama/train_llama2.sh)", args, no_effect, expect_steps=4)
    rows = table(p.stdout)
    check(f"Llama 2: llama's family from the flags, TP 2 + SP in bf16, --distributed-timeout-minutes 120 as "
          f"--comm-timeout {rows.get('comm-timeout', ('?',))[0]} s",
          rows.get("model") == ("llama-tiny", "derived") and rows.get("sequence-parallel") == ("true", "flag")
          and rows.get("comm-timeout") == ("7200", "flag"), p.stderr[-300:])


def honoured(tmp):
    one = ["--model", "gpt2-tiny", "--num-layers", "1", "--seq-length", "16", "--micro-batch-size", "2",
           "--global-batch-size", "2", "--threads", "1", "--eval-iters", "0", "--log-interval", "1"]
    first = []
    for std in ("0.02", "1.0"):
        p = lib.loom("train", *one, "--train-iters", "1", "--init-method-std", std)
        m = re.search(r"step 1/1 \| loss ([\d.]+)", p.stdout)
        first.append(float(m.group(1)) if m else 0)
    check(f"--init-method-std: the first loss {first[1]:.2f} with 1.0 against {first[0]:.2f} with 0.02",
          first[0] > 0 and first[1] > first[0] + 1)
    p = lib.loom("train", *one[:-6], "--global-batch-size", "4", "--micro-batch-size", "4", "--train-samples", "24",
                 "--lr-warmup-samples", "8", "--lr-decay-samples", "18", "--dry-run")  # rounded down, as Megatron
    rows = table(p.stdout)
    got = tuple(rows.get(k, ("?",))[0] for k in ("train-iters", "lr-warmup-iters", "lr-decay-iters"))
    check(f"samples onto steps of 4: --train-samples 24, --lr-warmup-samples 8, --lr-decay-samples 18 -> {got}",
          got == ("6", "2", "4"), p.stderr[-300:])
    ck = os.path.join(tmp, "nlo")
    base = one + ["--train-iters", "4", "--save", ck, "--save-interval", "2"]
    full = lib.loom("train", *base)
    losses = re.findall(r"step (\d)/4 \| loss ([\d.]+)", full.stdout)
    again = lib.loom("train", *base, "--load", os.path.join(ck, "iter_0000002"), "--no-load-optim",
                     "--save", os.path.join(tmp, "nlo2"))
    resumed = re.findall(r"step (\d)/4 \| loss ([\d.]+)", again.stdout)
    check(f"--no-load-optim: resumed at step 3 with the run's loss ({resumed[:1]} vs {losses[2:3]}), step 4's not "
          f"({resumed[1:2]} vs {losses[3:4]}: the optimizer started afresh)",
          len(losses) == 4 and len(resumed) == 2 and resumed[0] == losses[2] and resumed[1] != losses[3],
          again.stderr[-300:])
    counts = []
    for extra in ([], ["--tensorboard-log-interval", "2"]):
        d = os.path.join(tmp, f"tb{len(extra)}")
        p = lib.loom("train", *one[:-2], "--log-interval", "100", "--train-iters", "6", "--tensorboard-dir", d,
                     *extra)
        events = [os.path.join(d, n) for n in os.listdir(d)] if os.path.isdir(d) else []
        counts.append(records(events[0]) if events else 0)
    check(f"--tensorboard-log-interval 2: scalars at steps 2, 4, 6 between log lines ({counts[1]} records against "
          f"{counts[0]} with the log lines only)", counts[0] > 1 and counts[1] - 1 == 3 * (counts[0] - 1))


def records(path):
    """TFRecord records in an event file (the first is the file's version)."""
    data, n, at = open(path, "rb").read(), 0, 0
    while at + 12 <= len(data):
        length = int.from_bytes(data[at:at + 8], "little")
        at += 12 + length + 4
        n += 1
    return n


def main():
    if not lib.built(LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        gpt2, model, hf, prefix = make_data(tmp)
        gpt3(tmp, gpt2, prefix)
        mixtral(tmp, model)
        llama2(tmp, hf)
        honoured(tmp)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
