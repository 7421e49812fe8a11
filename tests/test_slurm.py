#!/usr/bin/env python3
"""loom under a real Slurm (Debian's slurm-wlm), started by this test on this
machine: munged, slurmctld and slurmd with a configuration of its own (free
ports, state in a temporary directory).

- `srun -n 2 --mpi=pmix loom train ...` trains 2 data-parallel ranks, the
  same losses bit for bit as `mpirun -np 2` (one MPI job either way: srun
  starts the ranks through PMIx, no launcher of loom's).
- examples/slurm/loom.sbatch, submitted with `sbatch --wait`, trains and
  saves; submitted again, its --save/--load resumes from the checkpoint.

scripts/install-deps.sh --test installs slurmd, slurmctld, slurm-client and
munge; without them the test fails naming what is missing.
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import lib
from lib import ENV, LOOM, check

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def munge_up():
    p = subprocess.run("munge -n | unmunge", shell=True, capture_output=True, text=True)
    return p.returncode == 0


def start_munge():
    if munge_up():
        return True
    os.makedirs("/run/munge", exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], capture_output=True)
    for _ in range(50):
        if munge_up():
            return True
        time.sleep(0.1)
    return False


def write_conf(d):
    host = socket.gethostname().split(".")[0]
    conf = os.path.join(d, "slurm.conf")
    for sub in ("state", "spool", "log"):
        os.makedirs(os.path.join(d, sub))
    with open(conf, "w") as f:
        f.write(f"""ClusterName=loomtest
SlurmctldHost={host}
AuthType=auth/munge
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
SlurmUser=root
SlurmdUser=root
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/linear
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={host} CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")
    return conf


def stop(d):
    """The daemons this test started: SIGTERM, then SIGKILL after 10 s."""
    pids = []
    for name in ("slurmd.pid", "slurmctld.pid"):
        try:
            pids.append(int(open(os.path.join(d, name)).read()))
            os.kill(pids[-1], 15)
        except (OSError, ValueError):
            pass
    for pid in pids:
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except OSError:
                break
            time.sleep(0.1)
        else:
            try:
                os.kill(pid, 9)
            except OSError:
                pass


def losses(out):
    return re.findall(r"step (\d+)/\d+ \| loss ([\d.]+) \| lr \S+ \| grad norm ([\d.]+)", out)


def main():
    missing = [t for t in ("slurmctld", "slurmd", "srun", "sbatch", "munged") if not shutil.which(t)
               and not os.path.exists(f"/usr/sbin/{t}")]
    if missing:
        print(f"FAIL: no {', '.join(missing)} (scripts/install-deps.sh --test installs slurmd, slurmctld, "
              "slurm-client and munge)")
        return 1
    if os.geteuid() != 0:
        print("FAIL: the test starts Slurm's daemons as root (SlurmUser=root); run it as root")
        return 1
    if not lib.built(LOOM):
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "slurm")
        os.makedirs(d)
        conf = write_conf(d)
        env = dict(ENV, SLURM_CONF=conf)
        env.pop("PMIX_MCA_psec", None)  # srun's PMIx as a user's: munge is up here
        if not check("munge authenticates (munged started if none was running)", start_munge()):
            return lib.verdict()
        try:
            for daemon in ("slurmctld", "slurmd"):
                subprocess.run([f"/usr/sbin/{daemon}", "-f", conf], env=env, capture_output=True, timeout=60)
            up = False
            for _ in range(100):
                p = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
                up = p.returncode == 0 and p.stdout.strip() in ("idle", "mixed", "allocated")
                if up:
                    break
                time.sleep(0.2)
            if not check("slurmctld and slurmd up, the node idle", up,
                         open(os.path.join(d, "log", "slurmctld.log")).read()[-400:] if os.path.exists(
                             os.path.join(d, "log", "slurmctld.log")) else ""):
                return lib.verdict()
            lib.synth(os.path.join(tmp, "data"), 20000)
            args = ["train", "--model", "gpt2-tiny", "--num-layers", "2", "--seq-length", "32", "--data-path",
                    os.path.join(tmp, "data", "train.bin"), "--global-batch-size", "8", "--micro-batch-size", "2",
                    "--train-iters", "4", "--log-interval", "1", "--eval-iters", "0", "--threads", "1"]
            s = subprocess.run(["srun", "-n", "2", "--mpi=pmix", LOOM, *args], env=env, capture_output=True,
                               text=True, timeout=300)
            m = lib.run_ranks(2, [LOOM, *args], tag="mpirun")
            got, want = losses(s.stdout), losses(m.stdout)
            check(f"srun -n 2 --mpi=pmix: 2 ranks, mpirun -np 2's losses and gradient norms bit for bit "
                  f"({len(got)} steps)", s.returncode == 0 and "ranks: 2" in s.stdout and got == want
                  and len(got) == 4, s.stderr[-400:])
            work = os.path.join(tmp, "job")
            os.makedirs(work)
            os.symlink(os.path.abspath(lib.BUILD), os.path.join(work, "build"))
            script = os.path.join(ROOT, "examples", "slurm", "loom.sbatch")
            outs = []
            for _ in range(2):
                b = subprocess.run(["sbatch", "--wait", script, "--train-iters", str(4 + 2 * len(outs))],
                                   env=env, capture_output=True, text=True, timeout=600, cwd=work)
                job = re.search(r"Submitted batch job (\d+)", b.stdout)
                out = os.path.join(work, f"loom-{job.group(1)}.out") if job else ""
                outs.append(open(out).read() if out and os.path.exists(out) else b.stderr)
            check("examples/slurm/loom.sbatch under sbatch --wait: trains on 2 ranks and saves; again, it resumes "
                  "from its checkpoint", "ranks: 2" in outs[0] and "saved checkpoint" in outs[0]
                  and "resumed at step 5" in outs[1] and "step 6/6" in outs[1], (outs[0] + outs[1])[-600:])
        finally:
            stop(d)
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
