"""The comm layer under mpirun: every collective (all-reduce sum and max,
reduce-scatter, all-gather, broadcast, send/recv) on every group (world, dp,
tp, pp) at world sizes 1, 2 and 4 with several tp x pp layouts, and the
error agreement (tests/tools/comm_check.c does the checking)."""
import sys

import lib
from lib import check

TOOL = lib.tool("comm_check")

for n, tp, pp in [(1, 1, 1), (2, 1, 1), (2, 2, 1), (2, 1, 2), (4, 1, 1), (4, 2, 1), (4, 1, 2), (4, 2, 2)]:
    p = lib.run_ranks(n, [TOOL, tp, pp], expect=None, timeout=120)
    if not check(f"world {n}, tp {tp}, pp {pp}: {p.stdout.strip()}", p.returncode == 0 and "0 failure(s)" in p.stdout):
        print(p.stderr[-1500:])
# a layout that does not divide is an input error
p = lib.run_ranks(2, [TOOL, 3, 1], expect=None, timeout=60)
check(f"world 2, tp 3: exit {p.returncode}", p.returncode == 2 and "not divisible" in p.stderr)
sys.exit(lib.verdict())
