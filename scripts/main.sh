#!/usr/bin/env bash
# The main job: build kite (Release) and benchmark a dummy Qwen3-0.6B (random weights, no files), each
# row checked against the CPU backend first. On a machine without a usable GPU the CPU backend (the
# float32 oracle) is benchmarked instead, with the rows bench/results/cpu.jsonl records.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/install-deps.sh
if ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j"$(nproc)" --target kite
  if build/kite info | grep -q "^cuda: available"; then
    build/kite bench --dummy qwen3-0.6b-base -p 256,2048 -n 128 --depth 256,16384 "$@"
    exit
  fi
  kite=build/kite
else
  # No GPU device: a build without the CUDA backend, in its own folder (build/ keeps its configuration).
  # The binary could not use CUDA here, and nvcc would take minutes of a two-core machine.
  cmake -S . -B build-cpu -DCMAKE_BUILD_TYPE=Release -DKITE_CUDA=OFF >/dev/null
  cmake --build build-cpu -j"$(nproc)" --target kite
  kite=build-cpu/kite
fi
echo "no usable GPU here: benchmarking the CPU backend"
"$kite" bench --dummy qwen3-0.6b-base -p 64 -n 8 --depth 64 -r 3 "$@"
