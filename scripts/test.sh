#!/usr/bin/env bash
# The README's test command: installs the dependencies (Debian 12), then
#   1. a Release build (with the CUDA backend when nvcc is found) and every test (GPU tests skip, saying
#      why, on a machine without a GPU), and the CUDA kernels' registers and shared memory against
#      bench/kernel-footprint.txt (scripts/kernel_footprint.sh);
#   2. a Debug build with AddressSanitizer + UndefinedBehaviorSanitizer and every CPU test under it;
#   3. a short bounded pass of each libFuzzer target, as many at once as there are cores.
# Usage: scripts/test.sh [FUZZ_SECONDS_PER_TARGET=15]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
fuzz_seconds="${1:-15}"
jobs="$(nproc)"

bash scripts/install-deps.sh
# Each phase says when it starts, so a log shows where the time goes (docs/TESTING.md).
SECONDS=0
phase() { echo "== $* (at ${SECONDS} s)"; }

phase "Release build and tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"
# Say why tests were skipped (GPU tests on a machine without a GPU), which ctest alone does not show.
grep -h "^SKIPPED:" build/Testing/Temporary/LastTest.log | sort | uniq -c | sed 's/^/skip reason: /' || true

# A kernel's registers and shared memory decide its speed on the GPU, which CI does not have: compare them with the
# baseline that was measured (scripts/kernel_footprint.sh says why).
if grep -q "^# compile CUDA with" build/CMakeFiles/kite_objects.dir/flags.make 2>/dev/null; then
  phase "CUDA kernel footprints against bench/kernel-footprint.txt"
  bash scripts/kernel_footprint.sh build
else
  echo "== CUDA kernel footprints: skipped (this build has no CUDA backend)"
fi

phase "README's results table against bench/results/*.jsonl"
python3 scripts/results-table.py --check

phase "ASan + UBSan build and tests"
# -O1: the sanitizers catch the same faults; -O0 made the engine and bench tests 2-4x slower under them.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DKITE_SANITIZE=ON -DKITE_CUDA=OFF >/dev/null
# The tests and what they start, not the benchmarks and study tools beside them (tests/CMakeLists.txt: kite_tests).
cmake --build build-asan -j"$jobs" --target kite_tests
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs"

phase "fuzz (${fuzz_seconds} s per target)"
bash scripts/fuzz.sh "$fuzz_seconds"
echo "all tests passed (${SECONDS} s)"
