"""A build without oneDNN: bf16 trains with its products in float32, and a
forced bf16-units path is refused. Builds loom with the oneDNN probe
switched off (into its own build directory), then:
  1. it does not link oneDNN, and `--bf16` trains, its start-up line naming
     the float32 path;
  2. LOOM_BF16_UNITS=f32 and auto train too; avx512_bf16 (or any other
     path) is exit 2 with one line naming LOOM_BF16_UNITS and saying that
     this build has no oneDNN, before any step."""
import os
import sys
import tempfile

import lib
from lib import check

OUT = os.path.join(lib.BUILD, "nodnnl")
loom = os.path.join(OUT, "loom")
p = lib.make(OUT, loom, "HAVE_DNNL=")
if not check("build without oneDNN", p.returncode == 0 and "-DLOOM_HAVE_DNNL" not in p.stdout):
    print(p.stdout[-1500:], p.stderr[-1500:])
else:
    check("it does not link oneDNN", "libdnnl" not in lib.run(["ldd", loom]).stdout)
    with tempfile.TemporaryDirectory() as tmp:
        args = ["train", "--data-cache", tmp, "--train-iters", "3", "--num-layers", "1", "--hidden-size", "32",
                "--num-attention-heads", "2", "--log-interval", "1", "--bf16"]
        for units in (None, "auto", "f32"):
            env = dict(os.environ, **({"LOOM_BF16_UNITS": units} if units else {}))
            q = lib.loom(*args, exe=loom, env=env)
            ok = q.returncode == 0 and "step 3/3" in q.stdout and "bf16: f32" in q.stdout
            if not check(f"--bf16 trains with LOOM_BF16_UNITS={units or '(unset)'}, the products in float32", ok):
                print(q.stdout[-800:], q.stderr[-800:])
        q = lib.loom(*args, exe=loom, env=dict(os.environ, LOOM_BF16_UNITS="avx512_bf16"))
        lines = lib.error_lines(q.stderr)
        check("LOOM_BF16_UNITS=avx512_bf16: exit 2, one line naming it and the missing oneDNN, no step",
              q.returncode == 2 and len(lines) == 1 and "LOOM_BF16_UNITS" in lines[0] and "oneDNN" in lines[0]
              and "step 1" not in q.stdout, q.stderr[-400:])
sys.exit(lib.verdict())
