#!/usr/bin/env python3
"""Help and launchers as users of torchrun and DeepSpeed expect them.

- Help: every command and subcommand answers --help (and -h) with its own
  usage, exit 0: `loom --help` lists the commands (not every flag), `loom
  train --help` the common flags and a pointer to `--help all` (every flag),
  `loom eval --help` and `loom sample --help` their own flags first.
- `loom launch` takes torchrun's and DeepSpeed's spellings (--nproc_per_node=2,
  --num_gpus 2, --master_addr/--master_port/--standalone accepted, --nnodes 1),
  and runs a program of the user's (examples/mlp_regression, built on the
  engine API) as well as loom's train: 2 ranks each, the same losses as
  mpirun -np 2 gives them.
- Refused in one line, exit 2: --nnodes 2 without a hostfile, --node_rank 1,
  a program that is not there; and a process started as torchrun starts one
  (RANK and WORLD_SIZE=2, no MPI) says so instead of training alone, for
  loom train and for an engine-API program.
"""
import os
import sys
import tempfile

import lib
from lib import ENV, LOOM, check

EXAMPLE = os.path.join(lib.BUILD, "examples", "mlp_regression")


def check_help():
    cases = [(("--help",), "usage: loom COMMAND", 60), (("train", "--help"), "usage: loom train", 130),
             (("train", "-h"), "usage: loom train", 130), (("eval", "--help"), "usage: loom eval", 60),
             (("sample", "--help"), "usage: loom sample", 60), (("data", "--help"), "usage: loom data", 60),
             (("data", "tokenize", "--help"), "usage: loom data tokenize", 30),
             (("data", "train-tokenizer", "--help"), "usage: loom data train-tokenizer", 30),
             (("data", "synth", "--help"), "usage: loom data synth", 30),
             (("convert", "--help"), "usage: loom convert", 60), (("launch", "--help"), "usage: loom launch", 40),
             (("plan", "--help"), "usage: loom plan", 60), (("report", "--help"), "usage: loom report", 30),
             (("report", "run", "-h"), "usage: loom report", 30)]
    for args, first, most in cases:
        p = lib.loom(*args)
        lines = p.stdout.splitlines()
        check(f"loom {' '.join(args)}: exit 0, its own usage first, {len(lines)} lines (at most {most})",
              p.returncode == 0 and any(first in l for l in lines[:3]) and len(lines) <= most and not p.stderr,
              (p.stderr or p.stdout)[-300:])
    p = lib.loom("train", "--help", "all")
    q = lib.loom("train", "--help")
    check(f"train --help all lists every flag ({p.stdout.count('[default: ')}), --help the common ones "
          f"({q.stdout.count('[default: ')}) and says how to see the rest",
          p.returncode == 0 and p.stdout.count("[default: ") > 150 and 20 <= q.stdout.count("[default: ") <= 50
          and "--help all" in q.stdout)
    for cmd, own in (("eval", "--valid-data-path"), ("sample", "--prompt")):
        lines = lib.loom(cmd, "--help").stdout.splitlines()
        flags = [l.split()[0] for l in lines if l.startswith("  --")]
        check(f"{cmd} --help shows its own flags first ({', '.join(flags[:3])}, ...)",
              flags[:1] == ["--load"] and own in flags[:3], "\n".join(lines[:8]))


def losses(out):
    return [l.split("loss")[1].split()[0] for l in out.splitlines() if l.startswith("step ") and "loss" in l]


def check_launch(tmp):
    lib.synth(os.path.join(tmp, "data"), 20000)
    model = ["--model", "gpt2-tiny", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2",
             "--seq-length", "16", "--vocab-size", "256", "--data-path", os.path.join(tmp, "data", "train.bin"),
             "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "3", "--eval-iters", "0",
             "--log-interval", "1", "--threads", "1"]
    ref = lib.run_ranks(2, [LOOM, "train", *model], tag="mpirun")
    for tag, spelling in (("torchrun's", ["--nproc_per_node=2", "--nnodes=1", "--node_rank=0", "--master_addr",
                                          "127.0.0.1", "--master_port=29500", "--standalone"]),
                          ("DeepSpeed's", ["--num_gpus", "2", "--num_nodes", "1", "--"])):
        p = lib.loom("launch", *spelling, "train", *model, timeout=300)
        got = losses(p.stdout)
        check(f"loom launch with {tag} spelling: 2 ranks train, mpirun -np 2's losses {got}",
              p.returncode == 0 and "ranks: 2" in p.stdout and got == losses(ref.stdout) and len(got) == 3,
              p.stderr[-400:])
    prog = [EXAMPLE, "--train-iters", "4", "--seed", "5", "--global-batch-size", "8", "--micro-batch-size", "2",
            "--threads", "1"]
    p = lib.loom("launch", "--nproc_per_node=2", *prog, timeout=300)
    q = lib.run_ranks(2, prog, tag="example")
    got = [l for l in p.stdout.splitlines() if l.startswith("step ")]
    check(f"loom launch runs a program built on the engine API on 2 ranks: {len(got)} steps, mpirun's",
          p.returncode == 0 and len(got) == 4 and got == [l for l in q.stdout.splitlines() if l.startswith("step ")],
          p.stderr[-400:])
    for tag, args, needle in (("--nnodes 2 without a hostfile", ["--nnodes", "2", "--nproc_per_node", "1"],
                               "--hostfile"),
                              ("--node_rank 1", ["--node_rank=1", "--nproc_per_node", "1"], "--node-rank 1"),
                              ("a program that is not there", ["--nproc_per_node", "1", "no-such-program"],
                               "no-such-program")):
        extra = [] if "program" in tag else ["train"]
        p = lib.loom("launch", *args, *extra)
        lib.check_refused(f"loom launch {tag}", p, [needle])


def check_torchrun_env(tmp):
    env = dict(ENV, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    for k in [k for k in env if k.startswith(("OMPI_", "PMIX_", "PMI_"))]:
        del env[k]
    for tag, cmd in (("loom train", [LOOM, "train", "--train-iters", "1"]),
                     ("an engine-API program", [EXAMPLE, "--train-iters", "1"])):
        p = lib.run(cmd, timeout=60, env=env)
        errs = [l for l in p.stderr.splitlines() if "error" in l]
        check(f"{tag} started as torchrun starts it (RANK, WORLD_SIZE=2, no MPI): exit 2, one line",
              p.returncode == 2 and len(errs) == 1 and "WORLD_SIZE=2" in errs[0] and "loom launch" in errs[0],
              p.stderr[-300:])


def main():
    if not (lib.built(LOOM) and lib.built(EXAMPLE)):
        return 1
    check_help()
    with tempfile.TemporaryDirectory() as tmp:
        check_launch(tmp)
        check_torchrun_env(tmp)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
