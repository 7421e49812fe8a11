"""A user's own model under the engine: examples/mlp_regression (an MLP
regressor on generated data, written against loom's public headers only)
trains with one process, and on 2 ranks with DDP and ZeRO stages 1, 2 and 3,
with only the DeepSpeed config changing. Every step's loss matches the
single process within 1e-5 relative (the ranks sum gradients in another
order than one process accumulating micro-batches: float32 rounding, not
bit for bit), and the loss falls. Checkpoints work for it too: ZeRO-2 on 2
ranks saves at step 10 and one process resumes to step 20 with the same
losses as the uninterrupted run (within the same tolerance), and a
one-process resume is exact bit for bit.
Under --pipeline-model-parallel-size 2 (the model has no boundary_numel)
and --tensor-model-parallel-size 2 (its tensors are whole) the engine
refuses it at set-up: exit 2 and one line on the two ranks naming the flag
and what the model lacks, not a crash or a silently replicated model.
"""
import json
import os
import sys
import tempfile

import lib
from lib import check

EXAMPLE = os.path.join(lib.BUILD, "examples", "mlp_regression")
TOL = 1e-5


def run(np_ranks, args):
    p = lib.run_ranks(np_ranks, [EXAMPLE, "--threads", "1", "--comm-timeout", "60"] + args)
    return [(int(l.split()[1]), float(l.split()[3])) for l in p.stdout.splitlines() if l.startswith("step ")]


def ds_config(tmp, name, stage, micro):
    """A DeepSpeed config as a user would write it; only the ZeRO stage and micro batch differ."""
    cfg = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": micro, "gradient_clipping": 1.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-8,
                                                      "weight_decay": 0.01}},
           "zero_optimization": {"stage": stage}}
    path = os.path.join(tmp, name + ".json")
    json.dump(cfg, open(path, "w"))
    return path


def worst(a, b):
    return max(abs(x[1] - y[1]) / abs(y[1]) for x, y in zip(a, b))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        common = ["--train-iters", "20", "--lr-warmup-iters", "2", "--lr-decay-iters", "20", "--seed", "5"]
        ref = run(1, common + ["--deepspeed-config", ds_config(tmp, "single", 0, 4)])
        check("1 process: 20 steps, the loss falls",
              len(ref) == 20 and ref[-1][1] < 0.5 * ref[0][1], str(ref[:2] + ref[-2:]))
        for stage, name in ((0, "DDP"), (1, "ZeRO-1"), (2, "ZeRO-2"), (3, "ZeRO-3")):
            got = run(2, common + ["--deepspeed-config", ds_config(tmp, f"zero{stage}", stage, 2)])
            w = worst(got, ref) if len(got) == len(ref) else 1.0
            check(f"2 ranks, {name}: every step's loss within {TOL} of 1 process (worst {w:.2e})",
                  [s for s, _ in got] == list(range(1, 21)) and w <= TOL)

        # the same program under each plugin, one word changed
        for plugin in (["torch_ddp"], ["torch_fsdp"], ["low_level_zero", "--plugin-stage", "2"],
                       ["hybrid_parallel", "--zero-stage", "1"], ["megatron", "--use-distributed-optimizer"],
                       ["deepspeed", "--deepspeed-config", ds_config(tmp, "ds2", 2, 2)]):
            extra = ["--global-batch-size", "16", "--micro-batch-size", "2", "--lr", "0.01", "--adam-beta2", "0.95",
                     "--weight-decay", "0.01", "--clip-grad", "1.0"] if plugin[0] != "deepspeed" else []
            got = run(2, common + ["--plugin"] + plugin + extra)
            w = worst(got, ref) if len(got) == len(ref) else 1.0
            check(f"2 ranks, --plugin {' '.join(plugin[:1])}: every step's loss within {TOL} of 1 process "
                  f"(worst {w:.2e})", [s for s, _ in got] == list(range(1, 21)) and w <= TOL)
        for why, flags in (("--plugin gemini", ["--plugin", "gemini", "--nvme-path", tmp]),
                           ("--layout auto", ["--layout", "auto", "--global-batch-size", "16"])):
            p = lib.run_ranks(1, [EXAMPLE, *flags, "--train-iters", "2"], expect=2)
            errs = lib.error_lines(p.stderr.replace("mlp_regression: error:", "loom: error:"))
            check(f"{why} under the engine API: exit 2, one line saying loom train decides it",
                  len(errs) == 1 and "loom train" in errs[0], p.stderr[-300:])
        # a layout the model does not provide for: one line on 2 ranks naming the flag and what is missing
        for flag, missing in (("--pipeline-model-parallel-size", "boundary_numel"),
                              ("--tensor-model-parallel-size", "loom_block_add_tensor_split")):
            p = lib.run_ranks(2, [EXAMPLE, flag, "2", "--global-batch-size", "4", "--train-iters", "2",
                                  "--comm-timeout", "20"], expect=None, timeout=90)
            errs = lib.error_lines(p.stderr.replace("mlp_regression: error:", "loom: error:"))
            check(f"{flag} 2 for a model without {missing}: exit 2, one line naming both",
                  p.returncode == 2 and len(errs) == 1 and flag in errs[0] and missing in errs[0],
                  f"exit {p.returncode}\n{p.stderr[-600:]}")

        # checkpoints of a user model: layout-free and exact
        cfg2 = ds_config(tmp, "z2", 2, 2)
        save = os.path.join(tmp, "ckpt")
        full = run(2, common + ["--deepspeed-config", cfg2])
        run(2, common + ["--deepspeed-config", cfg2, "--train-iters", "10", "--save", save])
        rest = run(1, common + ["--deepspeed-config", ds_config(tmp, "one", 0, 4), "--load", save])
        w = worst(rest, full[10:]) if len(rest) == 10 else 1.0
        check(f"saved by ZeRO-2 on 2 ranks at step 10, resumed in 1 process: steps 11-20 within {TOL} (worst {w:.2e})",
              [s for s, _ in rest] == list(range(11, 21)) and w <= TOL)
        save1 = os.path.join(tmp, "ckpt1")
        one = ds_config(tmp, "one", 0, 4)
        first = run(1, common + ["--deepspeed-config", one, "--train-iters", "10", "--save", save1])
        second = run(1, common + ["--deepspeed-config", one, "--load", save1])
        check("1 process: 10 steps + resume + 10 steps is the 20-step run bit for bit", first + second == ref)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
