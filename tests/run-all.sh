#!/usr/bin/env bash
# Runs every test on a fresh machine: installs what it needs (apt packages and the
# VM kernel cache), builds with warnings as errors, runs the unit tests on the host
# and the integration tests inside the RDMA VM (rxe0 + siw0), then the same
# integration suite again under AddressSanitizer + UBSan, and the threaded cases under
# ThreadSanitizer.
# Fails when any test fails, is skipped, or did not run; nothing is retried (a flaky
# test is a bug), and a suite that runs zero cases fails.
#
#   tests/run-all.sh            everything
#   ERDMA_SKIP_ASAN=1 ...       skip the ASan pass (local iteration only)
#   ERDMA_SKIP_TSAN=1 ...       skip the ThreadSanitizer pass (local iteration only)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${ERDMA_BUILD_DIR:-$ROOT/build-ci}
ASAN_BUILD=${ERDMA_ASAN_BUILD_DIR:-$ROOT/build-asan}
TSAN_BUILD=${ERDMA_TSAN_BUILD_DIR:-$ROOT/build-tsan}
LOGDIR=$BUILD/test-logs

step() { printf '\n=== %s\n' "$*"; }

step "install build and test dependencies"
tests/install-deps.sh

build() { # dir, extra cmake args...
  local dir=$1; shift
  cmake -S "$ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DERDMA_WERROR=ON "$@" >/dev/null
  cmake --build "$dir" -j"$(nproc)"
}

step "format check (clang-format)"
tests/check-format.sh

step "build (-Werror)"
build "$BUILD"

mkdir -p "$LOGDIR"
fail=0
check_log() { # a skipped or not-run test is a failure here
  if grep -Eq '\[  SKIPPED \]|Not Run|\*\*\*Skipped|No tests were found|\] 0 test\(s\) run' "$1"; then
    echo "FAIL: tests were skipped or not run (see $1)"; fail=1
  fi
}

step "unit tests (host)"
if ! ctest --no-tests=error --test-dir "$BUILD" -L unit --output-on-failure 2>&1 | tee "$LOGDIR/unit.log"; then fail=1; fi
check_log "$LOGDIR/unit.log"

step "integration tests (RDMA VM: rxe0 + siw0)"
if ! tests/vm/run-in-rdma-vm.sh ctest --no-tests=error --test-dir "$BUILD" -L vm --output-on-failure 2>&1 | tee "$LOGDIR/vm.log"; then fail=1; fi
check_log "$LOGDIR/vm.log"

if [ "${ERDMA_SKIP_ASAN:-0}" != 1 ]; then
  step "integration tests under ASan + UBSan (RDMA VM)"
  build "$ASAN_BUILD" -DERDMA_SANITIZE=ON
  # The full 1,000 connect/close cycles (the siw0 accept stall once seen at ~700 under ASan
  # is found and fixed: docs/failures.md).
  # Leaks are not judged here: the tests dlclose() the plugin and rdma-core, so LeakSanitizer
  # sees only unsymbolised frames of unloaded libraries. Leak checks are valgrind's job
  # (tests/vm/valgrind-datapath.sh) and the resource-hygiene test's.
  if ! tests/vm/run-in-rdma-vm.sh env ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 ITEST_NO_RSS=1 \
      UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      ctest --no-tests=error --test-dir "$ASAN_BUILD" -L vm -E 'deb|doctor|valgrind|loss' --output-on-failure 2>&1 | tee "$LOGDIR/vm-asan.log"; then fail=1; fi
  check_log "$LOGDIR/vm-asan.log"
else
  echo "WARNING: ASan pass skipped (ERDMA_SKIP_ASAN=1)"
fi

if [ "${ERDMA_SKIP_TSAN:-0}" != 1 ]; then
  step "threaded cases under ThreadSanitizer (RDMA VM)"
  # regMr/deregMr while another thread sends, v11 init/finalize of several communicators
  # at once (vm_threads), and the async-event thread through a port flap (vm_async).
  build "$TSAN_BUILD" -DERDMA_TSAN=ON -DERDMA_FUZZ=OFF
  # the async thread over fake verbs on the host (two ports of one context, a link flap)
  if ! TSAN_OPTIONS=halt_on_error=1 ctest --no-tests=error --test-dir "$TSAN_BUILD" -R '^unit_(device|reap)$' --output-on-failure 2>&1 | tee "$LOGDIR/unit-tsan.log"; then fail=1; fi
  check_log "$LOGDIR/unit-tsan.log"
  if ! tests/vm/run-in-rdma-vm.sh env TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
      ctest --no-tests=error --test-dir "$TSAN_BUILD" -R '^vm_(threads|async)$' --output-on-failure 2>&1 | tee "$LOGDIR/vm-tsan.log"; then fail=1; fi
  check_log "$LOGDIR/vm-tsan.log"
  if ! grep -q '2/2 Test' "$LOGDIR/vm-tsan.log"; then echo "FAIL: the TSan pass did not run both tests"; fail=1; fi
else
  echo "WARNING: TSan pass skipped (ERDMA_SKIP_TSAN=1)"
fi

if [ $fail != 0 ]; then
  # CI keeps only the head and the tail of this output: repeat what failed, and where, last.
  echo; echo "=== what failed (from $LOGDIR)"
  for log in "$LOGDIR"/*.log; do
    grep -HnE '\[  FAILED  \] [^0-9 ]|\[  ERROR   \]|\[   LINE   \]|CHECK failed|at the deadline|ERROR: [A-Za-z]*Sanitizer|runtime error:|\*\*\*(Failed|Timeout|Exception)' \
      "$log" | sed "s|^$LOGDIR/||" | head -40 || true
  done
  echo; echo "run-all: FAILED"; exit 1
fi
echo; echo "run-all: all tests passed"
