"""What the benchmarks share: the binary they time, the environment mpirun
needs here (root, oversubscribed ranks that yield when idle), and the tests'
helpers (pyref) on the import path."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
LOOM = os.path.join(HERE, "..", os.environ.get("BUILD", "build"), "loom")
# PMIX_MCA_psec: see tests/lib.py (a stale munge socket: 2.3 s a launch)
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_mpi_yield_when_idle="1", PMIX_MCA_psec=os.environ.get("PMIX_MCA_psec", "native"))
MB = 2**20
