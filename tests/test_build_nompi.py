"""A build without MPI still trains in one process: build loom with the MPI
probe switched off (into its own build directory) and run a few steps."""
import os
import subprocess
import sys
import tempfile

BUILD = os.environ.get("BUILD", "build")
OUT = os.path.join(BUILD, "nompi")
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
p = subprocess.run(["make", "-C", root, f"BUILD={os.path.abspath(OUT)}", "MPI_LIBS=", "MPI_CFLAGS=",
                    "-j2", os.path.abspath(os.path.join(OUT, "loom"))], capture_output=True, text=True)
failures = 0
ok = p.returncode == 0 and "-DLOOM_HAVE_MPI" not in p.stdout
print(f"{'ok  ' if ok else 'FAIL'} build without MPI")
if not ok:
    failures += 1
    print(p.stdout[-1500:], p.stderr[-1500:])
else:
    with tempfile.TemporaryDirectory() as tmp:
        q = subprocess.run([os.path.join(OUT, "loom"), "train", "--data-cache", tmp, "--train-iters", "3",
                            "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
                            "--log-interval", "1"], capture_output=True, text=True, timeout=120)
        ok = q.returncode == 0 and "ranks: 1" in q.stdout and "step 3/3" in q.stdout
        print(f"{'ok  ' if ok else 'FAIL'} it trains in one process")
        failures += 0 if ok else 1
        if not ok:
            print(q.stdout[-800:], q.stderr[-800:])
        nm = subprocess.run(["ldd", os.path.join(OUT, "loom")], capture_output=True, text=True).stdout
        ok = "libmpi" not in nm
        print(f"{'ok  ' if ok else 'FAIL'} it does not link MPI")
        failures += 0 if ok else 1
print(f"{'PASS' if failures == 0 else 'FAIL'}: {failures} failure(s)")
sys.exit(1 if failures else 0)
