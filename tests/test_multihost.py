"""Several hosts, made of network namespaces by this test (a bridge in a hub
namespace, one namespace per "host" joined to it by a veth pair, a subnet
that exists only inside them, mpirun in a namespace of its own), with Open
MPI over TCP between them:

- 3 hosts, DDP and ZeRO-3: the same losses, step by step, as 3 ranks on one
  host;
- a link cut (veth down) mid-run: the hang report names the rank that does
  not answer, and the job ends within --comm-timeout + 30 s;
- kill -9 of a whole host: the job ends within 10 s naming the lost host;
- loom launch --max-restarts 1, a host killed and back: the job finishes and
  its final weights and moments equal an uninterrupted run's bit for bit;
- SIGTERM to loom launch, on a host that holds no rank: mpirun carries the
  stop to every host, each rank saves and exits, the launcher exits 0.

Skipped, saying why, where namespaces cannot be made (not root, no ip).
Everything made is removed at the end, whatever happens.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import lib
from lib import ENV, LOOM, check
from pyref import ckpt

TAG = f"lm{os.getpid() % 100000}"
HUB = TAG + "hub"
LAUNCHER = f"{TAG}h0"  # where mpirun runs: a namespace of its own, holding no rank
HOSTS = [f"{TAG}h{i}" for i in (1, 2, 3)]
SUBNET = "10.213.0.0/24"


def sh(*cmd, check_rc=True):
    p = subprocess.run(list(cmd), capture_output=True, text=True)
    if check_rc and p.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip()}")
    return p


def setup():
    sh("ip", "netns", "add", HUB)
    sh("ip", "-n", HUB, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", HUB, "link", "set", "br0", "up")
    for i, h in enumerate([LAUNCHER] + HOSTS):
        sh("ip", "netns", "add", h)
        sh("ip", "link", "add", f"{TAG}v{i}", "netns", h, "type", "veth", "peer", "name", f"{TAG}v{i}b", "netns", HUB)
        sh("ip", "-n", HUB, "link", "set", f"{TAG}v{i}b", "master", "br0")
        sh("ip", "-n", HUB, "link", "set", f"{TAG}v{i}b", "up")
        sh("ip", "-n", h, "addr", "add", f"10.213.0.{i + 10}/24", "dev", f"{TAG}v{i}")
        sh("ip", "-n", h, "link", "set", f"{TAG}v{i}", "up")
        sh("ip", "-n", h, "link", "set", "lo", "up")
        # a cut link gives up in seconds, not TCP's default quarter of an hour
        sh("ip", "netns", "exec", h, "sysctl", "-qw", "net.ipv4.tcp_retries2=5")


def teardown():
    for n in [LAUNCHER] + HOSTS + [HUB]:
        pids = sh("ip", "netns", "pids", n, check_rc=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        sh("ip", "netns", "del", n, check_rc=False)


def mpi_env(tmp):
    """Open MPI's settings for the namespaces, as environment (mpirun and loom launch read them)."""
    agent = os.path.join(tmp, "agent.sh")
    with open(agent, "w") as f:
        # Each host its own temporary directory, as real hosts have: Open MPI's daemons of hosts
        # sharing one /tmp (and one host name) write their topology to the same shared-memory file,
        # and one of them sometimes crashed at start-up. The daemon runs detached, as a remote one
        # is: mpirun learns of a host's death by the lost connection (and names the host), not by
        # the death of a local child.
        f.write('#!/bin/sh\nhost="$1"; shift; mkdir -p "%s/tmp-$host"\n'
                'OMPI_MCA_orte_tmpdir_base="%s/tmp-$host" ip netns exec "$host" setsid sh -c "$*" &\n' % (tmp, tmp))
    os.chmod(agent, 0o755)
    return dict(ENV, OMPI_MCA_plm_rsh_agent=agent, OMPI_MCA_btl="tcp,self", OMPI_MCA_btl_tcp_if_include=SUBNET,
                OMPI_MCA_oob_tcp_if_include=SUBNET, OMPI_MCA_routed="direct")


def hostfile(tmp):
    path = os.path.join(tmp, "hosts")
    with open(path, "w") as f:
        f.write("".join(f"{h} slots=1\n" for h in HOSTS))
    return path


def train_args(tmp, metrics, iters=20, extra=()):
    return ["train", "--data-path", os.path.join(tmp, "train.bin"), *lib.TINY_MODEL, "--train-iters", str(iters),
            "--eval-iters", "0", "--threads", "1", "--log-interval", "1", "--seed", "7", "--metrics", metrics,
            "--comm-timeout", "5", *extra]


def on_hosts(tmp, env, args, n=3):
    """mpirun (started in the first host) of loom ARGS on n hosts."""
    return ["ip", "netns", "exec", LAUNCHER, "mpirun", "-np", str(n), "--hostfile", hostfile(tmp), "--bind-to",
            "none", LOOM, *args]


def losses(path):
    return [(r["step"], r["loss"]) for r in lib.metrics_rows(path)]


def same_losses(tmp, env):
    for name, extra in (("DDP", []), ("ZeRO-3", ["--zero-stage", "3"])):
        one, many = os.path.join(tmp, f"one-{name}.jsonl"), os.path.join(tmp, f"many-{name}.jsonl")
        lib.run_ranks(3, [LOOM] + train_args(tmp, one, extra=extra), tag=f"{name} on one host")
        p = subprocess.run(on_hosts(tmp, env, train_args(tmp, many, extra=extra)), capture_output=True, text=True,
                           env=env, timeout=300)
        a, b = losses(one), losses(many)
        check(f"3 hosts, {name}: the losses of 3 ranks on one host, every step ({len(b)} steps)",
              p.returncode == 0 and len(a) == 20 and a == b, p.stderr[-500:])


def start_long(tmp, env, tag, extra=()):
    metrics = os.path.join(tmp, tag + ".jsonl")
    p = subprocess.Popen(on_hosts(tmp, env, train_args(tmp, metrics, iters=100000, extra=extra)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None and len(lib.metrics_rows(metrics)) < 5:
        time.sleep(0.05)
    return p



def kill_host(h):
    for pid in sh("ip", "netns", "pids", h, check_rc=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def link_cut(tmp, env):
    p = start_long(tmp, env, "cut")
    sh("ip", "-n", HOSTS[2], "link", "set", f"{TAG}v3", "down")
    _, err, took = lib.finish(p, 120)
    report = [l for l in err.splitlines() if l.startswith("loom: hang report:")]
    check(f"a link cut: the job ends in {took:.1f} s (<= --comm-timeout 5 + 30)", p.returncode != 0 and took <= 35,
          err[-600:])
    check("a link cut: the hang report names rank 2 as not answering",
          any("no answer from 2" in l or ": 2 (" in l for l in report), "\n".join(report) or err[-600:])
    sh("ip", "-n", HOSTS[2], "link", "set", f"{TAG}v3", "up")


def host_killed(tmp, env):
    p = start_long(tmp, env, "killed")
    t0 = time.time()
    kill_host(HOSTS[2])
    _, err, _ = lib.finish(p, 60)
    took = time.time() - t0
    check(f"kill -9 of a host: the job ends in {took:.1f} s (<= 10), exit {p.returncode}",
          p.returncode != 0 and took <= 10, err[-400:])
    check("kill -9 of a host: the output names the lost host", HOSTS[2] in err, err[-600:])


def restarts(tmp, env):
    def launch(tag, fault):
        save, metrics = os.path.join(tmp, tag), os.path.join(tmp, tag + ".jsonl")
        cmd = ["ip", "netns", "exec", LAUNCHER, LOOM, "launch", "--nproc-per-node", "1", "--hostfile",
               hostfile(tmp), "--max-restarts", "1", "--"] + train_args(tmp, metrics, iters=200,
                                                                         extra=["--save", save, "--save-interval",
                                                                                "25"])
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        if fault:
            deadline = time.time() + 120
            while time.time() < deadline and p.poll() is None and len(lib.metrics_rows(metrics)) < 40:
                time.sleep(0.05)
            kill_host(HOSTS[2])
        out, err, _ = lib.finish(p, 300)
        return p, out, err, save

    p, _, err, full = launch("restart-full", False)
    check("loom launch on 3 hosts, uninterrupted: exit 0", p.returncode == 0, err[-400:])
    p, out, err, save = launch("restart-killed", True)
    lines = [l for l in err.splitlines() if l.startswith("loom launch: restart")]
    check("a host killed under --max-restarts 1: one restart, the job finishes (exit 0)",
          p.returncode == 0 and len(lines) == 1, err[-600:])
    a, b = ckpt.assemble(full), ckpt.assemble(save)
    check("the restarted job's final weights and moments equal the uninterrupted run's, bit for bit",
          a.keys() == b.keys() and all(lib.same_bits(a[k], b[k]) for k in a), str(lib.differing(a, b))[:300])


def launcher_stop(tmp, env):
    save, metrics = os.path.join(tmp, "stop"), os.path.join(tmp, "stop.jsonl")
    cmd = ["ip", "netns", "exec", LAUNCHER, LOOM, "launch", "--nproc-per-node", "1", "--hostfile", hostfile(tmp),
           "--max-restarts", "1", "--"] + train_args(tmp, metrics, iters=5000, extra=["--save", save])
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None and len(lib.metrics_rows(metrics)) < 5:
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)  # ip netns exec runs loom in its own process
    out, err, took = lib.finish(p, 60)
    step = len(lib.metrics_rows(metrics))
    check(f"SIGTERM to loom launch: every host's rank stops after step {step} and saves, exit {p.returncode} "
          f"in {took:.1f} s, no restart", p.returncode == 0 and f"stopped after step {step} of 5000" in out and
          os.path.isdir(os.path.join(save, f"iter_{step:07d}")) and "restart 1" not in err, (out + err)[-600:])


def main():
    if not lib.built(LOOM):
        return 1
    if os.geteuid() != 0 or not shutil.which("ip"):
        print("SKIP: network namespaces need root and iproute2's ip")
        return lib.verdict()
    try:
        teardown()
        setup()
    except RuntimeError as e:
        teardown()
        print(f"SKIP: cannot make network namespaces here: {e}")
        return lib.verdict()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            lib.write_corpus(tmp)
            env = mpi_env(tmp)
            same_losses(tmp, env)
            link_cut(tmp, env)
            host_killed(tmp, env)
            restarts(tmp, env)
            launcher_stop(tmp, env)
    finally:
        teardown()
    return lib.verdict()


if __name__ == "__main__":
    sys.exit(main())
