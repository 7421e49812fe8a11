"""A build without MPI still trains in one process: build loom with the MPI
probe switched off (into its own build directory) and run a few steps."""
import os
import sys
import tempfile

import lib
from lib import check

OUT = os.path.join(lib.BUILD, "nompi")
loom = os.path.join(OUT, "loom")
p = lib.make(OUT, loom, "MPI_LIBS=", "MPI_CFLAGS=")
if not check("build without MPI", p.returncode == 0 and "-DLOOM_HAVE_MPI" not in p.stdout):
    print(p.stdout[-1500:], p.stderr[-1500:])
else:
    with tempfile.TemporaryDirectory() as tmp:
        q = lib.loom("train", "--data-cache", tmp, "--train-iters", "3", "--num-layers", "1", "--hidden-size", "32",
                     "--num-attention-heads", "2", "--log-interval", "1", exe=loom)
        trains = q.returncode == 0 and "ranks: 1" in q.stdout and "step 3/3" in q.stdout
        if not check("it trains in one process", trains):
            print(q.stdout[-800:], q.stderr[-800:])
        nm = lib.run(["ldd", loom]).stdout
        check("it does not link MPI", "libmpi" not in nm)
sys.exit(lib.verdict())
