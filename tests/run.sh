#!/bin/sh
# The test runner: every C unit test (normal and sanitizer builds), then every
# Python test (the comparisons with PyTorch and the CLI tests). Prints one
# line per test and closes with "N passed, N failed".
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
LOG=$BUILD/test-logs
mkdir -p "$LOG" "$LOG/asan"
pass=0
fail=0
failed=""

run() { # name, command...
    name=$1; shift
    start=$(date +%s)
    if "$@" >"$LOG/$name.log" 2>&1; then
        pass=$((pass + 1)); echo "PASS $name ($(($(date +%s) - start)) s)"
    else
        fail=$((fail + 1)); failed="$failed $name"
        echo "FAIL $name ($(($(date +%s) - start)) s)"; tail -n 30 "$LOG/$name.log" | sed 's/^/    /'
    fi
}

for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] && run "$(basename "$t")" "$t"
done
for t in "$BUILD"/asan/tests/test_*; do
    [ -x "$t" ] && run "asan/$(basename "$t")" env ASAN_OPTIONS=detect_leaks=1 OMP_NUM_THREADS=2 "$t"
done
for t in tests/test_*.py; do
    [ -f "$t" ] && run "$(basename "$t" .py)" env BUILD="$BUILD" "$PYTHON" "$t"
done

[ -n "$failed" ] && echo "failed:$failed"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
