"""The strategies' unit test (tests/test_strategies.c) on 1, 2, 3 and 4 ranks:
each rank compares its shard of the parameters, gradients and optimizer
state with an unsharded run in the same process (bit for bit after the first
step), checks the DDP buckets, ZeRO partitions and gather units, and the
order of the strategy hooks. A rank count it fails at fails the test; its
stderr's tail is printed."""
import os
import sys
import time

import lib
from lib import check

TEST = os.path.join(lib.BUILD, "tests", "test_strategies")

if not lib.built(TEST):
    sys.exit(1)
for n in (1, 2, 3, 4):
    start = time.time()
    p = lib.run_ranks(n, [TEST], expect=None, timeout=120)
    summary = [line for line in p.stdout.splitlines() if line.startswith("test_strategies")]
    ok = p.returncode == 0 and len(summary) == n and all(line.endswith(" 0 failed") for line in summary)
    if not check(f"{n} rank{'s' if n > 1 else ''}: exit {p.returncode}, {len(summary)} summaries "
                 f"({time.time() - start:.1f} s)", ok):
        print(p.stdout[-3000:])
        print(p.stderr[-3000:])
sys.exit(lib.verdict())
