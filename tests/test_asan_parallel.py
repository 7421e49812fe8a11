"""The parallel code under AddressSanitizer and UndefinedBehaviorSanitizer:
build loom itself with both (the unit tests' sanitizer build covers only the
modules they link) and train a tiny model at 2 ranks under DDP, ZeRO 1-3
(with several-block gather units), nvme offload, bf16/fp16 with
activation recomputation, and tensor parallelism (with sequence
parallelism, an untied head, bf16 and full recomputation), and pipeline
parallelism (1f1b, gpipe with bf16 and recomputation, interleaved with fp16
and an untied head), and the Llama family (DDP; bf16 with ZeRO-3 and full recomputation; selective; pipelined, interleaved; tensor-parallel in bf16) (each run saves iteration 3 into the same directory,
so all but the first replace the one before), then at 1 rank with
evaluation, sampling and saving. Any sanitizer report fails the test. Leak
detection is off: OpenMPI and OpenBLAS keep allocations until exit."""
import os
import sys
import tempfile

import lib

ENV = dict(lib.ENV, ASAN_OPTIONS="detect_leaks=0:abort_on_error=1", UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")


def check(name, p):
    """Exit 0 and no sanitizer report."""
    bad = p.returncode != 0 or "AddressSanitizer" in p.stderr or "runtime error" in p.stderr
    if not lib.check(name, not bad):
        print(p.stderr[-3000:])


b = lib.make_asan_loom()
if b.returncode != 0:
    print("FAIL sanitizer build of loom\n" + b.stderr[-2000:])
    sys.exit(1)
loom = lib.ASAN_LOOM
with tempfile.TemporaryDirectory() as tmp:
    lib.synth(tmp, 60000, exe=loom, env=ENV)
    model = ["--data-path", os.path.join(tmp, "train.bin"), "--valid-data-path", os.path.join(tmp, "val.bin"),
             "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
             "--global-batch-size", "8", "--micro-batch-size", "2", "--train-iters", "3", "--eval-iters", "1",
             "--threads", "1"]
    cases = {"ddp": [], "ddp naive": ["--ddp-impl", "naive"], "zero 1": ["--zero-stage", "1"],
             "zero 2": ["--zero-stage", "2"], "zero 3": ["--zero-stage", "3", "--zero3-min-params", "5000"],
             "zero 1 + nvme offload": ["--zero-stage", "1", "--offload-optimizer", "nvme", "--nvme-path", tmp,
                                       "--offload-buffer-size", "0.002"],
             "bf16 ddp, accumulating": ["--bf16"],
             "bf16 ddp naive, one micro-batch": ["--bf16", "--ddp-impl", "naive", "--micro-batch-size", "4"],
             "bf16 zero 2": ["--bf16", "--zero-stage", "2"],
             "bf16 zero 3 + full recompute": ["--bf16", "--zero-stage", "3", "--recompute-granularity", "full",
                                             "--recompute-method", "uniform", "--recompute-num-layers", "1"],
             "fp16 zero 1 + selective recompute": ["--fp16", "--zero-stage", "1", "--recompute-activations"],
             "fp16 zero 2, gradients reduced in fp16": ["--fp16", "--zero-stage", "2", "--grad-reduce-dtype", "fp16"],
             "bf16 ddp, gradients reduced in bf16": ["--bf16", "--grad-reduce-dtype", "bf16"],
             "bf16 zero 1 + nvme offload of master weights": ["--bf16", "--zero-stage", "1", "--offload-optimizer", "nvme",
                                                               "--nvme-path", tmp, "--offload-buffer-size", "0.002"],
             "tp 2": ["--tensor-model-parallel-size", "2"],
             "tp 2 + sp, untied head, exact gelu": ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                                                    "--untie-embeddings-and-output-weights",
                                                    "--activation-function", "gelu"],
             "tp 2 + sp, bf16, full recompute": ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--bf16",
                                                 "--recompute-granularity", "full", "--recompute-method", "uniform",
                                                 "--recompute-num-layers", "1"],
             "pp 2, 1f1b": ["--pipeline-model-parallel-size", "2"],
             "pp 2, gpipe, bf16, full recompute": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule",
                                                   "gpipe", "--bf16", "--recompute-granularity", "full",
                                                   "--recompute-method", "uniform", "--recompute-num-layers", "1"],
             "pp 2, interleaved, fp16, untied head": ["--pipeline-model-parallel-size", "2", "--num-layers", "4",
                                                      "--num-layers-per-virtual-pipeline-stage", "1", "--fp16",
                                                      "--untie-embeddings-and-output-weights"],
             "llama, ddp": ["--model", "llama-tiny"],
             "llama, bf16 zero 3, full recompute": ["--model", "llama-tiny", "--bf16", "--zero-stage", "3",
                                                    "--recompute-granularity", "full", "--recompute-method",
                                                    "uniform", "--recompute-num-layers", "1"],
             "llama, selective recompute": ["--model", "llama-tiny", "--recompute-activations"],
             "llama, tp 2 + sp, bf16": ["--model", "llama-tiny", "--tensor-model-parallel-size", "2",
                                        "--sequence-parallel", "--bf16"],
             "llama, pp 2 interleaved": ["--model", "llama-tiny", "--num-layers", "4", "--pipeline-model-parallel-size",
                                         "2", "--num-layers-per-virtual-pipeline-stage", "1"],
             "bf16 zero 2, traced, tensorboard, metrics": ["--bf16", "--zero-stage", "2", "--log-interval", "1",
                                                           "--trace", os.path.join(tmp, "trace.json"),
                                                           "--tensorboard-dir", os.path.join(tmp, "tb"),
                                                           "--metrics", os.path.join(tmp, "metrics.jsonl")],
             "fp8 hybrid, tp 2 + sp, selective recompute": ["--bf16", "--fp8-format", "hybrid",
                                                            "--tensor-model-parallel-size", "2", "--sequence-parallel",
                                                            "--recompute-activations"],
             "llama, fp8 hybrid, tp 2": ["--model", "llama-tiny", "--bf16", "--fp8-format", "hybrid",
                                         "--tensor-model-parallel-size", "2"],
             "fp8 e4m3, zero 3, history 4": ["--bf16", "--fp8-format", "e4m3", "--zero-stage", "3",
                                             "--fp8-amax-history-len", "4", "--fp8-amax-compute-algo", "max"],
             "window attention, tp 2, bf16": ["--attention-window", "6", "--sparse-block", "4",
                                              "--tensor-model-parallel-size", "2", "--bf16"],
             "bigbird per head, zero 2, selective recompute": ["--sparse-attention-mode", "bigbird", "--sparse-block",
                                                               "4", "--sparse-different-layout-per-head",
                                                               "--sparse-num-sliding-window-blocks", "1",
                                                               "--zero-stage", "2", "--recompute-activations"],
             "layout-invariant, tp 2 + sp, bf16, selective recompute": ["--layout-invariant", "2",
                                                                        "--tensor-model-parallel-size", "2",
                                                                        "--sequence-parallel", "--bf16",
                                                                        "--recompute-activations"],
             "layout-invariant, pp 2, zero 1": ["--layout-invariant", "1", "--pipeline-model-parallel-size", "2",
                                                "--use-distributed-optimizer"],
             "llama, layout-invariant, tp 2, fp16": ["--model", "llama-tiny", "--layout-invariant", "2",
                                                     "--tensor-model-parallel-size", "2", "--fp16"],
             "pp 2, recompute, traced": ["--pipeline-model-parallel-size", "2", "--recompute-granularity", "full",
                                         "--recompute-method", "uniform", "--recompute-num-layers", "1",
                                         "--trace", os.path.join(tmp, "trace-pp.json")]}
    for name, flags in cases.items():
        p = lib.run_ranks(2, [loom, "train"] + model + flags + ["--save", os.path.join(tmp, "s")], expect=None,
                          env=ENV, mpi_args=["-x", "ASAN_OPTIONS", "-x", "UBSAN_OPTIONS"])
        check(f"2 ranks, {name}", p)
    p = lib.loom("report", tmp, exe=loom, env=ENV)
    check("loom report of the traced run", p)
    p = lib.loom("train", *model, "--save", os.path.join(tmp, "one"), exe=loom, env=ENV, timeout=300)
    check("1 rank: train, evaluate, save", p)
    p = lib.loom("sample", "--load", os.path.join(tmp, "one"), "--prompt", " ab=", "--max-new-tokens", "8",
                 "--top-k", "3", exe=loom, env=ENV)
    check("1 rank: sample", p)
sys.exit(lib.verdict())
