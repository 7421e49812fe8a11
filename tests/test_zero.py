"""ZeRO stage 1 keeps the math and shards the optimizer state.

Equivalence: `--zero-stage 1` at 2 and 4 ranks, with accumulation and
clipping, gives the single-process per-step loss and final weights (same
tolerances and the same comparison as test_ddp.py, whose helpers this uses).
Memory: every rank's optimizer bytes are 8 Psi / N within 5% (fp32 Adam:
two moments of 4 bytes for its shard of the Psi parameters), while params
and grads stay 4 Psi each. An unavailable stage is a one-line error."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import test_ddp  # noqa: E402
from test_ddp import LOOM, run, compare, ENV  # noqa: E402

failures = 0


def check(name, cond, detail=""):
    global failures
    print(f"{'ok  ' if cond else 'FAIL'} {name}" + (f": {detail}" if detail and not cond else ""))
    failures += 0 if cond else 1


def main():
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([LOOM, "data", "synth", os.path.join(tmp, "corpus"), "--tokens", "200000"], check=True,
                       capture_output=True)
        os.rename(os.path.join(tmp, "corpus", "train.bin"), os.path.join(tmp, "train.bin"))
        ref = run(tmp, "single", 1, ["--global-batch-size", "8", "--micro-batch-size", "1"])
        for n in (2, 4):
            tag = f"zero1-np{n}-accum2"
            got = run(tmp, tag, n, ["--global-batch-size", "8", "--micro-batch-size", str(8 // n // 2),
                                    "--zero-stage", "1"])
            compare(tag, ref, got)
            rows = [json.loads(l) for l in open(os.path.join(tmp, f"{tag}.jsonl")) if '"loss"' in l]
            psi = sum(t.size for t in ref[1].values())
            per_rank = rows[-1]["mem_by_rank"]
            worst = max(abs(r["optimizer"] - 8 * psi / n) / (8 * psi / n) for r in per_rank)
            check(f"{tag}: optimizer bytes per rank within 5% of 8 Psi/N = {8 * psi / n:.0f} "
                  f"(worst {worst:.2%}: {[r['optimizer'] for r in per_rank]})", worst <= 0.05)
            worst_p = max(abs(r["params"] - 4 * psi) / (4 * psi) for r in per_rank)
            worst_g = max(abs(r["grads"] - 4 * psi) / (4 * psi) for r in per_rank)
            check(f"{tag}: params and grads 4 Psi per rank within 5% (worst {worst_p:.2%}, {worst_g:.2%})",
                  worst_p <= 0.05 and worst_g <= 0.05)
        # uneven shards: 3 ranks and a parameter count not divisible by 3 (V=255)
        ref255 = run(tmp, "single-v255", 1, ["--global-batch-size", "6", "--micro-batch-size", "1",
                                             "--vocab-size", "255"])
        psi = sum(t.size for t in ref255[1].values())
        check(f"uneven case: {psi} parameters do not split evenly in 3", psi % 3 != 0)
        compare("zero1-np3-uneven", ref255, run(tmp, "zero1-np3-uneven", 3, ["--global-batch-size", "6",
                "--micro-batch-size", "1", "--vocab-size", "255", "--zero-stage", "1"]))
        p = subprocess.run(["mpirun", "-np", "2", "--bind-to", "none", LOOM, "train", "--zero-stage", "3",
                            "--data-path", os.path.join(tmp, "train.bin"), "--train-iters", "1"],
                           capture_output=True, text=True, env=ENV, timeout=60)
        lines = [l for l in p.stderr.splitlines() if l.startswith("loom: error:")]
        check("--zero-stage 3 is one error line, exit 2",
              p.returncode == 2 and len(lines) == 1 and "--zero-stage 3" in lines[0], p.stderr[-400:])
    total = failures + test_ddp.failures
    print(f"{'PASS' if total == 0 else 'FAIL'}: {total} failure(s)")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
