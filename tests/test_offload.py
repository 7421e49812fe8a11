"""Optimizer offload to files (--offload-optimizer nvme): the run equals the
in-memory run bit for bit (every logged number and every saved weight), the
resident optimizer bytes stay within --offload-buffer-size, nothing is left
in --nvme-path, and a bad path is a one-line error. Also under ZeRO-1 at 2
ranks, where each rank streams its own shard."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import test_ddp  # noqa: E402
from test_ddp import LOOM, ENV, STEPS, check, run, write_corpus  # noqa: E402

def main():
    with tempfile.TemporaryDirectory() as tmp:
        write_corpus(tmp)
        nvme = os.path.join(tmp, "nvme")
        os.mkdir(nvme)
        buffer_mb = 0.004  # 4 KB: hundreds of chunks per step
        for n, extra in ((1, []), (2, ["--zero-stage", "1"])):
            base = ["--global-batch-size", "8", "--micro-batch-size", "2"] + extra
            a = run(tmp, f"mem-np{n}", n, base)
            b = run(tmp, f"nvme-np{n}", n, base + ["--offload-optimizer", "nvme", "--nvme-path", nvme,
                                                   "--offload-buffer-size", str(buffer_mb)])
            rows_a = [l for l in open(os.path.join(tmp, f"mem-np{n}.jsonl")) if '"loss"' in l]
            rows_b = [l for l in open(os.path.join(tmp, f"nvme-np{n}.jsonl")) if '"loss"' in l]
            strip = lambda r: {k: v for k, v in json.loads(r).items() if k in ("step", "loss", "lr", "grad_norm")}
            check(f"np{n}: every step's loss, lr and grad norm identical to the in-memory run",
                  [strip(r) for r in rows_a] == [strip(r) for r in rows_b] and len(rows_a) == STEPS)
            same = all((a[1][k] == b[1][k]).all() for k in a[1])
            check(f"np{n}: final weights identical bit for bit", same)
            mem = json.loads(rows_b[-1])
            per_rank = [r["optimizer"] for r in mem.get("mem_by_rank", [mem["mem"]])]
            check(f"np{n}: resident optimizer bytes {per_rank} <= buffer {buffer_mb * 1e6:.0f}",
                  all(x <= buffer_mb * 1e6 for x in per_rank))
            check(f"np{n}: nothing left in --nvme-path", os.listdir(nvme) == [], str(os.listdir(nvme)))
        p = subprocess.run([LOOM, "train", "--data-path", os.path.join(tmp, "train.bin"), "--train-iters", "1",
                            "--offload-optimizer", "nvme", "--nvme-path", os.path.join(tmp, "nope")],
                           capture_output=True, text=True, env=ENV)
        check("a missing --nvme-path is exit 2 naming it",
              p.returncode == 2 and "--nvme-path" in p.stderr and "nope" in p.stderr, p.stderr)
        p = subprocess.run([LOOM, "train", "--train-iters", "1", "--offload-optimizer", "nvme"],
                           capture_output=True, text=True, env=ENV)
        check("nvme without --nvme-path is exit 2", p.returncode == 2 and "--nvme-path" in p.stderr, p.stderr)
    print(f"{'PASS' if test_ddp.failures == 0 else 'FAIL'}: {test_ddp.failures} failure(s)")
    return 1 if test_ddp.failures else 0


if __name__ == "__main__":
    sys.exit(main())
