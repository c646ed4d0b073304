#!/usr/bin/env bash
# On the GPU machine: the benchmark run recorded in bench/results/. Expects a Release build with CUDA in
# build/ (carried from the dev machine). Writes its logs and JSON lines under ${OUT:-/tmp/kite-out}.
#   bash bench/device_run.sh [all|kite|peer]
set -uo pipefail
out=${OUT:-/tmp/kite-out}
mkdir -p "$out"
what=${1:-all}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
kite=build/kite
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"

# A checkpoint in the hub's exact layout (random weights), for `kite run` and the peer.
tok=/tmp/kite-tokdir
mkdir -p $tok && cp tests/data/tokenizer/tokenizer.json tests/data/tokenizer/tokenizer_config.json $tok/ && cp -r configs $tok/configs
ckpt=/tmp/qwen3-0.6b-base
[ -d $ckpt ] || python3 tests/data/tools/make_checkpoint.py qwen3-0.6b-base $ckpt --tokenizer-dir $tok >"$out/make_checkpoint.log" 2>&1

if [ "$what" = all ] || [ "$what" = kite ]; then
  # Time to the first token from process start (warm page cache: the second run is the one reported).
  for i in 1 2; do
    s=$(date +%s.%N)
    $kite run --model $ckpt --prompt "The capital of France is" --max-tokens 1 --backend cuda --json >"$out/first_token.json" 2>"$out/first_token.err"
    e=$(date +%s.%N)
    echo "first token run $i: $(echo "$e - $s" | bc) s" | tee -a "$out/first_token.txt"
  done
  $kite bench --dummy qwen3-0.6b-base -p 256,2048 -n 128 -b 1 --depth 256,16384 -o jsonl 2>&1 | tee "$out/kite-0.6b.jsonl"
  $kite bench --dummy qwen3-1.7b-base -p 2048 -n 128 -b 1 --depth 256 -o jsonl 2>&1 | tee "$out/kite-1.7b.jsonl"
fi
if [ "$what" = all ] || [ "$what" = peer ]; then
  PYTHONUNBUFFERED=1 python3 bench/peer_transformers.py $ckpt --out "$out/peer-transformers.jsonl" 2>&1 | grep -v Warning | tail -8
fi
