"""Runs every libFuzzer target: BUILD/fuzz/fuzz_NAME, built by `make fuzz`
from tests/fuzz/fuzz_NAME.c, for FUZZ_SECONDS each (default 30, the
suite's budget: a regression check from the seed corpus; a longer hunt
sets more), on a copy
of its seed corpus tests/fuzz/corpus/NAME/ in a temporary directory (new
inputs never land in the repository), with tests/fuzz/fuzz_NAME.dict when
there is one, as many targets at once as there are cores. Prints for each
target its executions and what it found, and fails when any fuzzer reports
a crash, a sanitizer error, a leak, a timeout or running out of memory; the
input that did it is kept in BUILD/fuzz/findings/NAME/ with the command that
replays it. Passes saying SKIP only where clang's libFuzzer is missing.

Usage: test_fuzz.py [NAME ...]   (only those targets)
Environment: FUZZ_SECONDS, BUILD."""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from lib import BUILD, ROOT

SECONDS = int(os.environ.get("FUZZ_SECONDS", "30"))
FUZZ_CC = os.environ.get("FUZZ_CC", "clang")


def have_libfuzzer():
    probe = "int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }"
    try:
        p = subprocess.run([FUZZ_CC, "-fsanitize=fuzzer", "-x", "c", "-", "-o", os.devnull], input=probe,
                           capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0


def start(name, tmp):
    """Starts one fuzzer in its own directory under tmp; returns its state."""
    work = os.path.join(tmp, name)
    corpus, artifacts = os.path.join(work, "corpus"), os.path.join(work, "artifacts")
    seeds = os.path.join(ROOT, "tests", "fuzz", "corpus", name)
    if os.path.isdir(seeds):
        shutil.copytree(seeds, corpus)
    else:
        print(f"note: {name}: no seed corpus at {os.path.relpath(seeds, ROOT)}, starting from nothing")
        os.makedirs(corpus)
    os.makedirs(artifacts)
    shutil.rmtree(os.path.join(BUILD, "fuzz", "findings", name), ignore_errors=True)  # from an earlier run
    cmd = [os.path.join(BUILD, "fuzz", "fuzz_" + name), f"-max_total_time={SECONDS}", "-timeout=10",
           "-rss_limit_mb=2048", "-print_final_stats=1", "-artifact_prefix=" + artifacts + "/"]
    dict_path = os.path.join(ROOT, "tests", "fuzz", f"fuzz_{name}.dict")
    if os.path.isfile(dict_path):
        cmd.append("-dict=" + dict_path)
    cmd.append(corpus)
    log = open(os.path.join(work, "log"), "w+")
    env = dict(os.environ, UBSAN_OPTIONS="print_stacktrace=1")
    proc = subprocess.Popen(cmd, cwd=work, stdout=log, stderr=subprocess.STDOUT, env=env)
    return {"name": name, "proc": proc, "log": log, "work": work, "artifacts": artifacts,
            "seeds": len(os.listdir(corpus)), "start": time.monotonic()}


def finish(run, hung):
    """Prints the line of a fuzzer that has ended; returns whether it found nothing."""
    name, proc = run["name"], run["proc"]
    secs = time.monotonic() - run["start"]
    run["log"].seek(0)
    text = run["log"].read()
    run["log"].close()
    m = re.search(r"stat::number_of_executed_units: (\d+)", text) or re.search(r"Done (\d+) runs", text)
    execs = int(m.group(1)) if m else 0
    inputs = len(os.listdir(os.path.join(run["work"], "corpus")))
    found = sorted(os.listdir(run["artifacts"]))
    reported = re.search(r"ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer)|runtime error:|broken promise",
                         text)
    ok = proc.returncode == 0 and not hung and not found and not reported
    rate = execs / secs if secs > 0 else 0
    line = (f"fuzz_{name}: {execs} executions in {secs:.0f} s ({rate:.0f}/s), "
            f"corpus {run['seeds']} -> {inputs} inputs")
    if ok:
        print(f"{line}: nothing found")
        return True
    why = "did not stop" if hung else f"exit status {proc.returncode}"
    print(f"{line}: FOUND something ({why})")
    keep = os.path.join(BUILD, "fuzz", "findings", name)
    os.makedirs(keep, exist_ok=True)
    shutil.copy(os.path.join(run["work"], "log"), os.path.join(keep, "log"))
    for a in found:
        shutil.copy(os.path.join(run["artifacts"], a), keep)
        print(f"  replay: {os.path.relpath(os.path.join(BUILD, 'fuzz', 'fuzz_' + name), ROOT)} "
              f"{os.path.relpath(os.path.join(keep, a), ROOT)}")
    tail = [ln for ln in text.splitlines() if not ln.startswith("#")][-40:]
    print("\n".join("  " + ln for ln in tail))
    return False


def main():
    sources = sorted(glob.glob(os.path.join(ROOT, "tests", "fuzz", "fuzz_*.c")))
    names = [os.path.basename(s)[len("fuzz_"):-len(".c")] for s in sources]
    wanted = sys.argv[1:] or names
    unknown = [w for w in wanted if w not in names]
    if unknown:
        print(f"FAIL: no tests/fuzz/fuzz_NAME.c for {', '.join(unknown)} (have {', '.join(names)})")
        return 1
    missing = [n for n in wanted if not os.access(os.path.join(BUILD, "fuzz", "fuzz_" + n), os.X_OK)]
    if missing:
        if not have_libfuzzer():
            print(f"SKIP: {FUZZ_CC} with libFuzzer not found, so the fuzzers were not built "
                  "(scripts/install-deps.sh --test installs clang and libclang-rt-14-dev)")
            return 0
        print(f"FAIL: {', '.join('fuzz_' + n for n in missing)} not built: run `make fuzz`")
        return 1
    jobs = max(1, os.cpu_count() or 1)
    print(f"{len(wanted)} fuzz target(s), {SECONDS} s each, {min(jobs, len(wanted))} at a time")
    clean = True
    with tempfile.TemporaryDirectory(prefix="loom_fuzz_") as tmp:
        pending, running = list(wanted), []
        while pending or running:
            while pending and len(running) < jobs:
                running.append(start(pending.pop(0), tmp))
            time.sleep(0.2)
            for run in list(running):
                hung = time.monotonic() - run["start"] > SECONDS + 300
                if hung:
                    run["proc"].kill()
                    run["proc"].wait()
                if run["proc"].poll() is not None:
                    running.remove(run)
                    clean = finish(run, hung) and clean
    findings = os.path.relpath(os.path.join(BUILD, "fuzz", "findings"), ROOT)
    print("PASS" if clean else f"FAIL: a fuzzer found something (inputs in {findings}/)")
    return 0 if clean else 1


sys.exit(main())
