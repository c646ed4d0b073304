#!/usr/bin/env bash
# On the GPU machine: the GPU tests and the benchmark runs recorded in bench/results/.
#   BIN=DIR bash bench/device_run.sh [tests] [kite] [batched] [tokenizer] [peer] [first-token]
# BIN holds the Release binaries built with CUDA (kite, cuda_ops_test, cuda_e2e_test, engine_gpu_test, cuda_soak_test, bench_gpu_test,
# tokenizer_bench); default build/. Logs and JSON lines go under ${OUT:-/tmp/kite-out}.
set -uo pipefail
out=${OUT:-/tmp/kite-out}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bin=${BIN:-build}
kite=$bin/kite
# Tests find tests/data through the absolute path they were built with.
[ -e /work/main ] || { mkdir -p /work && ln -s "$root" /work/main; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"

want() { for w in "${steps[@]}"; do [ "$w" = "$1" ] && return 0; done; return 1; }
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests kite batched tokenizer peer first-token)

checkpoint() {  # a checkpoint in the hub's exact layout (random weights) for kite run and the peer
  ckpt=/tmp/qwen3-0.6b-base
  [ -d $ckpt ] && return
  tok=/tmp/kite-tokdir
  mkdir -p $tok && cp tests/data/tokenizer/tokenizer.json tests/data/tokenizer/tokenizer_config.json $tok/ && cp -r configs $tok/configs
  python3 tests/data/tools/make_checkpoint.py qwen3-0.6b-base $ckpt --tokenizer-dir $tok >"$out/make_checkpoint.log" 2>&1
}

if want tests; then
  for t in cuda_ops_test cuda_e2e_test engine_gpu_test cuda_soak_test bench_gpu_test; do
    echo "== $t" | tee -a "$out/gpu-tests.log"
    timeout 400 "$bin/$t" >>"$out/gpu-tests.log" 2>&1; echo "$t exit $?" | tee -a "$out/gpu-tests.log"
  done
  grep -E "passed|failed|FAIL|exit" "$out/gpu-tests.log"
fi
if want kite; then
  timeout 300 $kite bench --dummy qwen3-0.6b-base -p 256,2048 -n 128 --depth 256,16384 -o jsonl >"$out/kite-0.6b.jsonl" 2>&1
  timeout 200 $kite bench --dummy qwen3-1.7b-base -p 2048 -n 128 --depth 256 -o jsonl >"$out/kite-1.7b.jsonl" 2>&1
  cat "$out/kite-0.6b.jsonl" "$out/kite-1.7b.jsonl"
fi
if want batched; then
  timeout 300 $kite bench --dummy qwen3-0.6b-base -p 256 -n 128 -b 1,8,16,32,64,128 --depth 256 -o jsonl >"$out/kite-batched.jsonl" 2>&1
  cat "$out/kite-batched.jsonl"
fi
if want tokenizer; then
  python3 bench/tokenizer_bench_text.py --out /tmp/bench.txt >/dev/null
  commit=${COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
  host="h200-host:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  for i in 1 2 3; do $bin/tokenizer_bench --model tests/data/tokenizer --text /tmp/bench.txt --host "$host" --commit "$commit" --out "$out/tokenizer.jsonl" >/dev/null; done
  RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false python3 bench/tokenizer_hf_bench.py --tokenizer tests/data/tokenizer/tokenizer.json \
    --text /tmp/bench.txt --host "$host" --out "$out/tokenizer.jsonl" >/dev/null 2>&1
  cat "$out/tokenizer.jsonl"
fi
if want first-token; then
  checkpoint
  for i in 1 2 3; do  # process start to the first token, warm page cache after the first run
    s=$(date +%s.%N)
    $kite run --model $ckpt --prompt "The capital of France is" --max-tokens 1 --backend cuda --json >"$out/first_token.json" 2>"$out/first_token.err"
    rc=$?
    e=$(date +%s.%N)
    echo "first token run $i: exit $rc $(python3 -c "print(round($e - $s, 3))") s" | tee -a "$out/first_token.txt"
  done
  $kite run --model $ckpt --prompt "The capital of France is" --max-tokens 64 --backend cuda --json 2>&1 | tail -2 >"$out/run_cuda.txt"
fi
if want peer; then
  checkpoint
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/peer_transformers.py $ckpt --reps 3 --out "$out/peer-transformers.jsonl" 2>&1 | grep '^{'
fi
