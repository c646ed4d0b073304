#!/usr/bin/env bash
# Builds kite's libFuzzer targets in build-fuzz (clang, ASan + UBSan) and runs each for a bounded time.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# SECONDS_PER_TARGET defaults to 20; targets default to every fuzz/fuzz_*.c. Each target starts from its seed
# corpus fuzz/corpus/NAME/ and keeps what it finds in fuzz/corpus-run/NAME/ (git-ignored). Crash inputs land
# in build-fuzz/fuzz/artifacts/. KITE_FUZZ_JOBS targets run at once (default: one per core). Exits non-zero if any
# target fails.
set -euo pipefail

seconds="${1:-20}"
if [[ $# -gt 0 ]]; then shift; fi
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [[ "$seconds" -eq 0 ]]; then
  echo "usage: $0 [SECONDS_PER_TARGET>0] [TARGET...]" >&2
  exit 2
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-fuzz"
jobs="${KITE_FUZZ_JOBS:-$(nproc)}" # build jobs, and the targets run at once

if [[ $# -gt 0 ]]; then
  targets=("$@")
else
  targets=()
  for source in "$root"/fuzz/fuzz_*.c; do
    name="$(basename "$source" .c)"
    targets+=("$name")
  done
fi

CC="${CC:-clang}" cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKITE_FUZZ=ON -DKITE_CUDA=OFF \
  -DKITE_TESTS=OFF -DKITE_SANITIZE=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target "${targets[@]}"

# libFuzzer runs one thread: KITE_FUZZ_JOBS targets (default: one per core) run at once, each for its own
# SECONDS_PER_TARGET; each one's output is printed when it ends.
mkdir -p "$build/fuzz/artifacts" "$build/fuzz/logs"
failed=()
declare -A running=() # pid -> target
finish_one() {
  local pid=""
  local status=0
  wait -n -p pid "${!running[@]}" || status=$?
  local target="${running[$pid]}"
  unset "running[$pid]"
  echo "== $target: ${seconds}s"
  cat "$build/fuzz/logs/$target.log"
  if [[ $status -ne 0 ]]; then failed+=("$target"); fi
}
for target in "${targets[@]}"; do
  run_corpus="$root/fuzz/corpus-run/$target"
  seed_corpus="$root/fuzz/corpus/$target"
  mkdir -p "$run_corpus"
  corpora=("$run_corpus")
  if [[ -d "$seed_corpus" ]]; then corpora+=("$seed_corpus"); fi
  while [[ ${#running[@]} -ge $jobs ]]; do finish_one; done
  "$build/fuzz/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/fuzz/artifacts/$target-" "${corpora[@]}" >"$build/fuzz/logs/$target.log" 2>&1 &
  running[$!]="$target"
done
while [[ ${#running[@]} -gt 0 ]]; do finish_one; done

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz: FAILED: ${failed[*]} (inputs in $build/fuzz/artifacts/)" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} target(s) ran ${seconds}s each without a failure"
