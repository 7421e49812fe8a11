#!/bin/sh
# Installs what loom needs on a Debian (bookworm) machine, and nothing that is
# already there. `install-deps.sh` installs the build dependencies;
# `install-deps.sh --test` adds what the test suite compares against
# (PyTorch and NumPy from Debian, venv for the test-only transformers from
# PyPI, clang for the sanitizer and fuzzer builds, Chromium to open `loom
# report`'s page headless, Slurm and munge for the test that runs loom under
# srun and sbatch).
set -eu

want_test=0
for a in "$@"; do
  case "$a" in
    --test) want_test=1 ;;
    *) echo "install-deps.sh: unknown option $a (use --test)" >&2; exit 2 ;;
  esac
done

pkgs="build-essential pkg-config libopenblas-dev libopenblas-openmp-dev libopenmpi-dev openmpi-bin libcjson-dev libxxhash-dev libdnnl-dev libpcre2-dev liburing-dev libsentencepiece-dev"
[ "$want_test" = 1 ] && pkgs="$pkgs python3 python3-venv python3-torch python3-numpy clang libclang-rt-14-dev clang-format chromium slurmd slurmctld slurm-client munge"

missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

echo "install-deps.sh: installing:$missing"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
