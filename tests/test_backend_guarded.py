"""Every buffer of the model, the strategies and the optimizer goes through
the backend: `--backend guarded` runs the CPU's kernels on memory that host
code outside the backend cannot read or write (kernels/guarded/), so a
training run that touched a buffer directly would die. Each parity layout
(DDP, ZeRO-3, TP 2 + SP, PP 2), and ZeRO-3 with its optimizer state and
shards offloaded to NVMe (the shards are host file mappings: what the
guarded memory proves there is that no device buffer is touched on the
way), trains, saves and is compared with the same
run on `--backend cpu`: every loss and every bit of every final weight the
same (the kernels are the CPU's, so nothing may differ at all). And a
deliberate host read of the parameters (LOOM_TEST_HOST_READ, base/testpoint.h)
is caught: exit 1 with the guarded backend's line, where `--backend cpu`
runs on."""
import os
import sys
import tempfile

import lib
from lib import check

MB = ["--global-batch-size", "8", "--micro-batch-size", "2"]
LAYOUTS = [
    ("DDP", 2, MB),
    ("ZeRO-3", 2, MB + ["--zero-stage", "3"]),
    ("TP 2 + SP", 2, MB + ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    ("PP 2", 2, MB + ["--pipeline-model-parallel-size", "2"]),
]


def main():
    if not lib.built(lib.LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        lib.write_corpus(tmp)
        nvme = os.path.join(tmp, "nvme")
        os.makedirs(nvme)
        offload = ("ZeRO-3 NVMe offload", 2, MB + ["--zero-stage", "3", "--offload-optimizer", "nvme",
                                                    "--offload-param", "nvme", "--nvme-path", nvme])
        for name, n, flags in LAYOUTS + [offload]:
            slug = name.replace(" ", "").replace("+", "-")
            ref = lib.tiny_run(tmp, f"{slug}-cpu", n, flags + ["--backend", "cpu"])
            got = lib.tiny_run(tmp, f"{slug}-guarded", n, flags + ["--backend", "guarded"])
            lib.same_run(f"{name} on the guarded backend", ref, got)
        # a direct host read of a device buffer: caught, one line, exit 1
        base = ["train", "--data-path", os.path.join(tmp, "train.bin")] + lib.TINY_MODEL + [
            "--train-iters", "1", "--eval-iters", "0"]
        env = dict(lib.ENV, LOOM_TEST_HOST_READ="1")
        p = lib.loom(*base, "--backend", "guarded", env=env)
        check("a host read of the parameters on the guarded backend: exit 1", p.returncode == 1,
              f"exit {p.returncode}: {p.stderr[-600:]}")
        check("... with the guarded backend's line", "host code touched the guarded backend's memory" in p.stderr,
              p.stderr[-600:])
        p = lib.loom(*base, "--backend", "cpu", env=env)
        check("the same read on --backend cpu (host memory): the run goes on", p.returncode == 0,
              f"exit {p.returncode}: {p.stderr[-600:]}")
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
