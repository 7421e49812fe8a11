"""Fine-tuning a downloaded model under pipeline parallelism.

`loom train --load SOURCE --finetune` with --pipeline-model-parallel-size
2 builds a stage-local model on each stage; the weights source holds every
stage's tensors, and each stage takes its own and skips the others'. The
sources are made without network: a tiny 4-layer loom checkpoint exported
with `loom convert` as a Hugging Face directory and as a safetensors file,
for GPT-2 and for Llama.

Equivalence with one process fine-tuning from the same source on the same
global batch of 8 (lib.compare_runs: every step's loss within 1e-5 relative
and the final weights, assembled from the ranks' pieces, within 1e-5: the
float32 tolerance tests/test_pipeline_parallel.py holds these layouts to):
GPT-2 from the directory under P 2, P 2 x T 2 and P 2 x DP 2 with ZeRO-3;
GPT-2 from the safetensors file under P 2; Llama from its directory under P
2 and P 2 x T 2.

What a stage still refuses (exit 2, one line): a tensor that belongs to no
layer of the whole model (h.4 of a 4-layer model), a missing tensor of its
own stage (h.3 gone: the last stage's), and an lm_head.weight beside a
tied table that differs from it (checked by the embedding's stage; an
equal one loads).
"""
import os
import sys
import tempfile

import lib
from lib import check
from pyref import ckpt, st

GPT2 = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--vocab-size", "256"]
LLAMA = ["--model", "llama-tiny", "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
         "--num-query-groups", "2", "--ffn-hidden-size", "64"]
SHAPE = ["--seq-length", "16", "--max-position-embeddings", "16"]
PP2, TP2 = ["--pipeline-model-parallel-size", "2"], ["--tensor-model-parallel-size", "2"]


def common(tmp):
    return ["--data-path", os.path.join(tmp, "train.bin"), "--data-order", "shuffled", "--global-batch-size", "8",
            "--micro-batch-size", "1", "--seq-length", "16", "--lr", "3e-3", "--lr-warmup-iters", "3",
            "--clip-grad", "0.5", "--weight-decay", "0.1", "--log-interval", "1", "--eval-iters", "0",
            "--threads", "1", "--seed", "7", "--comm-timeout", "60"]


def source(tmp, tag, model):
    """A loom checkpoint of `model` after 2 steps, exported: (directory, safetensors file)."""
    ck = os.path.join(tmp, tag + "-ck")
    p = lib.loom("train", *common(tmp), *model, *SHAPE, "--train-iters", "2", "--lr-warmup-iters", "0", "--save", ck)
    hf, file = os.path.join(tmp, tag + "-hf"), os.path.join(tmp, tag + ".safetensors")
    ps = [p, lib.loom("convert", ck, hf, "--to", "hf"), lib.loom("convert", ck, file)]
    if any(q.returncode for q in ps):
        raise SystemExit(f"{tag}: making the sources failed\n" + "".join(q.stderr[-800:] for q in ps))
    return hf, file


def finetune(tmp, tag, n, src, extra):
    """lib.STEPS steps fine-tuned from src on n ranks: lib.tiny_run's (losses, final weights, stdout)."""
    metrics, save = os.path.join(tmp, tag + ".jsonl"), os.path.join(tmp, tag)
    p = lib.run_ranks(n, [lib.LOOM, "train", *common(tmp), "--load", src, "--finetune", "--train-iters",
                          str(lib.STEPS), "--metrics", metrics, "--save", save] + extra, tag=tag, expect=None)
    if p.returncode != 0:
        check(f"{tag}: fine-tunes", False, p.stderr[-1200:])
        return None
    return lib.Run(([r["loss"] for r in lib.metrics_rows(metrics)], ckpt.weights(save), p.stdout))


def compare(tag, ref, got):
    if ref is not None and got is not None:
        lib.compare_runs(tag, ref, got)


def one_step(tmp, name, tensors):
    """One step under P 2 from a safetensors file of `tensors` (with the exported file's loom metadata)."""
    path = os.path.join(tmp, name + ".safetensors")
    st.save(path, tensors, metadata=META)
    return lib.run_ranks(2, [lib.LOOM, "train", *common(tmp), "--load", path, "--finetune", "--train-iters",
                             "1", "--lr-warmup-iters", "0"] + PP2, expect=None, timeout=120)


def refused(tmp, name, tag, tensors, want):
    """one_step: exit 2, one line holding want."""
    p = one_step(tmp, name, tensors)
    errs = lib.error_lines(p.stderr)
    check(f"P 2, {tag}: exit 2, one line naming it", p.returncode == 2 and len(errs) == 1 and want in errs[0],
          f"exit {p.returncode}: {errs or p.stderr[-600:]}")


META = None


def main():
    global META
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        hf, file = source(tmp, "gpt2", GPT2)
        ref = finetune(tmp, "gpt2-1", 1, hf, [])
        for tag, n, src, extra in (("gpt2-hf-pp2", 2, hf, PP2), ("gpt2-file-pp2", 2, file, PP2),
                                   ("gpt2-hf-pp2-tp2", 4, hf, PP2 + TP2),
                                   ("gpt2-hf-pp2-dp2-zero3", 4, hf, PP2 + ["--zero-stage", "3"])):
            compare(tag, ref, finetune(tmp, tag, n, src, extra))

        lhf, _ = source(tmp, "llama", LLAMA)
        lref = finetune(tmp, "llama-1", 1, lhf, [])
        for tag, n, extra in (("llama-hf-pp2", 2, PP2), ("llama-hf-pp2-tp2", 4, PP2 + TP2)):
            compare(tag, lref, finetune(tmp, tag, n, lhf, extra))

        # what a stage still refuses
        tensors, META = st.load(file, with_metadata=True)
        extra = dict(tensors)
        extra["h.4.attn.c_attn.bias"] = tensors["h.3.attn.c_attn.bias"]
        refused(tmp, "h4", "a tensor of no layer of the model (h.4 of 4 layers)", extra, "unexpected tensor h.4.")
        missing = {k: v for k, v in tensors.items() if not k.startswith("h.3.")}
        refused(tmp, "no-h3", "the last stage's layer h.3 missing", missing, "missing tensor h.3.")
        # an LM head beside the tied table: the embedding's stage checks it, the others skip it
        head = dict(tensors, **{"lm_head.weight": tensors["wte.weight"]})
        p = one_step(tmp, "head", head)
        check("P 2, lm_head.weight equal to wte.weight beside it: fine-tunes", p.returncode == 0, p.stderr[-600:])
        head["lm_head.weight"] = tensors["wte.weight"] * 2
        refused(tmp, "head2", "lm_head.weight not wte.weight (an untied file)", head, "lm_head.weight differs")
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
