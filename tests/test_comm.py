"""The comm layer under mpirun: every collective (all-reduce sum and max,
reduce-scatter, all-gather, broadcast, send/recv) on every group (world, dp,
tp, pp) at world sizes 1, 2 and 4 with several tp x pp layouts, and the
error agreement (tests/tools/comm_check.c does the checking)."""
import os
import subprocess
import sys

BUILD = os.environ.get("BUILD", "build")
TOOL = os.path.join(BUILD, "tests", "tools", "comm_check")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

failures = 0
for n, tp, pp in [(1, 1, 1), (2, 1, 1), (2, 2, 1), (2, 1, 2), (4, 1, 1), (4, 2, 1), (4, 1, 2), (4, 2, 2)]:
    cmd = [TOOL, str(tp), str(pp)] if n == 1 else \
        ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none", TOOL, str(tp), str(pp)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120)
    ok = p.returncode == 0 and "0 failure(s)" in p.stdout
    print(f"{'ok  ' if ok else 'FAIL'} world {n}, tp {tp}, pp {pp}: {p.stdout.strip()}")
    if not ok:
        failures += 1
        print(p.stderr[-1500:])
# a layout that does not divide is an input error
p = subprocess.run(["mpirun", "-np", "2", "--bind-to", "none", TOOL, "3", "1"], capture_output=True, text=True,
                   env=ENV, timeout=60)
ok = p.returncode == 2 and "not divisible" in p.stderr
print(f"{'ok  ' if ok else 'FAIL'} world 2, tp 3: exit {p.returncode}")
failures += 0 if ok else 1
print(f"{'PASS' if failures == 0 else 'FAIL'}: {failures} failure(s)")
sys.exit(1 if failures else 0)
