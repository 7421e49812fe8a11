"""Optimizer offload to files (--offload-optimizer nvme): the run equals the
in-memory run bit for bit (every logged number and every saved weight), the
resident optimizer bytes stay within --offload-buffer-size, nothing is left
in --nvme-path, and a bad path is a one-line error. Also under ZeRO-1 at 2
ranks, where each rank streams its own shard."""
import os
import sys
import tempfile

import lib
from lib import check


def main():
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        nvme = os.path.join(tmp, "nvme")
        os.mkdir(nvme)
        buffer_mb = 0.004  # 4 KB: hundreds of chunks per step
        for n, extra in ((1, []), (2, ["--zero-stage", "1"])):
            base = ["--global-batch-size", "8", "--micro-batch-size", "2"] + extra
            a = lib.tiny_run(tmp, f"mem-np{n}", n, base)
            b = lib.tiny_run(tmp, f"nvme-np{n}", n, base + ["--offload-optimizer", "nvme", "--nvme-path", nvme,
                                                            "--offload-buffer-size", str(buffer_mb)])
            rows_a = lib.metrics_rows(os.path.join(tmp, f"mem-np{n}.jsonl"))
            rows_b = lib.metrics_rows(os.path.join(tmp, f"nvme-np{n}.jsonl"))
            strip = lambda r: {k: v for k, v in r.items() if k in ("step", "loss", "lr", "grad_norm")}
            check(f"np{n}: every step's loss, lr and grad norm identical to the in-memory run",
                  [strip(r) for r in rows_a] == [strip(r) for r in rows_b] and len(rows_a) == lib.STEPS)
            same = all((a[1][k] == b[1][k]).all() for k in a[1])
            check(f"np{n}: final weights identical bit for bit", same)
            mem = rows_b[-1]
            per_rank = [r["optimizer"] for r in mem.get("mem_by_rank", [mem["mem"]])]
            check(f"np{n}: resident optimizer bytes {per_rank} <= buffer {buffer_mb * 1e6:.0f}",
                  all(x <= buffer_mb * 1e6 for x in per_rank))
            check(f"np{n}: nothing left in --nvme-path", os.listdir(nvme) == [], str(os.listdir(nvme)))
        p = lib.loom("train", "--data-path", os.path.join(tmp, "train.bin"), "--train-iters", "1",
                     "--offload-optimizer", "nvme", "--nvme-path", os.path.join(tmp, "nope"), env=lib.ENV)
        check("a missing --nvme-path is exit 2 naming it",
              p.returncode == 2 and "--nvme-path" in p.stderr and "nope" in p.stderr, p.stderr)
        p = lib.loom("train", "--train-iters", "1", "--offload-optimizer", "nvme", env=lib.ENV)
        check("nvme without --nvme-path is exit 2", p.returncode == 2 and "--nvme-path" in p.stderr, p.stderr)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
