#!/usr/bin/env bash
# The main job: build kite (Release) and benchmark a dummy Qwen3-0.6B (random weights, no files), each
# row checked against the CPU backend first. On a machine without a usable GPU the CPU backend is
# benchmarked instead, with smaller rows (it is the float32 oracle, not a fast path).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target kite
if build/kite info | grep -q "^cuda: available"; then
  build/kite bench --dummy qwen3-0.6b-base -p 256,2048 -n 128 --depth 256,16384 "$@"
else
  echo "no usable GPU here: benchmarking the CPU backend with small rows"
  build/kite bench --dummy qwen3-0.6b-base -p 64 -n 8 --depth 64 -r 3 "$@"
fi
