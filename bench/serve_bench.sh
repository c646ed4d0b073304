#!/usr/bin/env bash
# The serving benchmark of issue 37 on one machine, in one call: for each server, start it, wait for /health, run
# the workloads with bench/kite-serve-bench (each gated before any figure), stop it.
#   BIN=DIR [MODEL=CKPT] [LLAMA_SERVER=PATH GGUF=FILE] bash bench/serve_bench.sh [kite] [llama]
# Workloads (greedy, streamed, ignore_eos): random 256 tokens in / 128 out at concurrency 1, 16, 64, 128; shared
# prefix (a common 2,048-token system prompt + 64-token user turns, 128 out) at concurrency 32.
# BIN holds kite and kite-serve-bench (a build dir, bench/ under it, or a flat folder of packed binaries; default
# build/). MODEL: the checkpoint kite serves (default: a random-weight qwen3-0.6b-base in the hub's layout, made by
# tests/data/tools/make_checkpoint.py as bench/device_run.sh does); its tokenizer cuts the prompts. llama-server
# runs GGUF (the same checkpoint converted) with LLAMA_ARGS (default: -np 128, flash attention, all layers on the
# GPU, a context of 128 x 2,304 tokens: every slot holds the longest request). KITE_ARGS are added to kite serve's;
# KITE_LABEL names kite's rows (default "kite serve"; say there what KITE_ARGS change, e.g. "kite serve (fp8 KV)").
# Rows are appended to ${RESULTS:-$OUT/serve.jsonl}; logs go under ${OUT:-/tmp/kite-out}. QUICK=1 runs each workload
# with few requests (a check of the script, not a measurement). CONCURRENCY (default "1 16 64 128") picks the random
# workloads' concurrencies and SHARED_PREFIX=0 leaves the shared-prefix one out, for a call that has rows already.
# Exit 1 when any server or workload failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-/tmp/kite-out}
mkdir -p "$out"
results=${RESULTS:-$out/serve.jsonl}
bin=${BIN:-build}
pick() { for p in "$bin/$1" "$bin/bench/$1"; do [ -x "$p" ] && { echo "$p"; return 0; }; done; return 1; }
kite=$(pick kite) || { echo "serve_bench: no kite in $bin" >&2; exit 2; }
gen=$(pick kite-serve-bench) || { echo "serve_bench: no kite-serve-bench in $bin (or $bin/bench)" >&2; exit 2; }
servers=("$@")
[ ${#servers[@]} -eq 0 ] && { servers=(kite); [ -n "${LLAMA_SERVER:-}" ] && servers+=(llama); }
for s in "${servers[@]}"; do
  case $s in
    kite) ;;
    llama) [ -x "${LLAMA_SERVER:-}" ] && [ -f "${GGUF:-}" ] || { echo "serve_bench: llama needs LLAMA_SERVER=PATH and GGUF=FILE" >&2; exit 2; } ;;
    *) echo "serve_bench: unknown server '$s' (kite, llama)" >&2; exit 2 ;;
  esac
done

model=${MODEL:-}
if [ -z "$model" ]; then
  model=/tmp/qwen3-0.6b-base
  if [ ! -d $model ]; then
    tok=/tmp/kite-tokdir
    mkdir -p $tok && cp tests/data/tokenizer/tokenizer.json tests/data/tokenizer/tokenizer_config.json $tok/ && cp -r configs $tok/configs
    python3 tests/data/tools/make_checkpoint.py qwen3-0.6b-base $model --tokenizer-dir $tok >"$out/make_checkpoint.log" 2>&1 ||
      { echo "serve_bench: make_checkpoint.py failed (see $out/make_checkpoint.log)" >&2; exit 1; }
  fi
fi
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
gpu=${gpu:-$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')}
# The commit the kite binary was built from (kite --version), not the checkout's HEAD: on the GPU machine the
# checkout's history can be older than the binaries carried to it.
commit=${COMMIT:-$("$kite" --version 2>/dev/null | sed -n 's/^kite [^ ]* (\(.*\))$/\1/p')}
commit=${commit:-unknown}
# The prompts' text: the repository's own documentation (English prose, code and tables).
text=$out/serve_text.txt
cat README.md docs/*.md >"$text"
quick=${QUICK:-0}
# A request whose stream is silent REQUEST_TIMEOUT seconds fails (a token every few milliseconds is the norm), and a
# workload that runs past WORKLOAD_LIMIT seconds is stopped: a stalled server then costs a failed row, not the call.
request_timeout=${REQUEST_TIMEOUT:-30}
workload_limit=${WORKLOAD_LIMIT:-600}
failed=0

# run_workloads LABEL PORT [extra generator args]: the issue's workloads against the server on PORT.
run_workloads() {
  local label=$1 port=$2
  shift 2
  local common=(--tokenizer "$model" --text "$text" --port "$port" --output-len 128 --server "$label" --gpu "$gpu"
                --commit "$commit" --wait 10 --timeout "$request_timeout" --out "$results")
  local c n
  for c in ${CONCURRENCY:-1 16 64 128}; do
    n=$((c * 4 > 32 ? c * 4 : 32))
    [ "$quick" = 1 ] && n=$c
    echo "== $label: random 256/128, concurrency $c, $n requests" | tee -a "$out/serve_bench.log"
    timeout "$workload_limit" "$gen" "${common[@]}" "$@" --dataset random --input-len 256 --concurrency $c --num-requests $n \
      2>&1 | tee -a "$out/serve_bench.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
    set -- # the reference (when given) is checked once, with the first workload
  done
  [ "${SHARED_PREFIX:-1}" = 1 ] || return 0
  n=256
  [ "$quick" = 1 ] && n=32
  echo "== $label: shared-prefix 2048 + 64 / 128, concurrency 32, $n requests" | tee -a "$out/serve_bench.log"
  timeout "$workload_limit" "$gen" "${common[@]}" --dataset shared-prefix --prefix-len 2048 --input-len 64 --concurrency 32 --num-requests $n \
    2>&1 | tee -a "$out/serve_bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
}

# wait_health PID PORT: until GET /health answers 200 (bash's /dev/tcp: no curl on the GPU machine); fails at once
# when the server exits, and after 10 minutes.
wait_health() {
  local pid=$1 port=$2 i line
  for i in $(seq 6000); do
    kill -0 "$pid" 2>/dev/null || return 1
    line=$( (exec 3<>"/dev/tcp/127.0.0.1/$port" && printf 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3 &&
             head -1 <&3) 2>/dev/null) && [[ $line == "HTTP/1."?" 200"* ]] && return 0
    sleep 0.1
  done
  return 1
}

# stop PID NAME STRICT: SIGTERM, then the exit status (STRICT=1: non-zero fails the run); a server that does not
# stop within 60 s is killed and fails the run.
stop() {
  local pid=$1 name=$2 strict=$3 i
  kill -TERM "$pid" 2>/dev/null
  for i in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "serve_bench: $name did not stop within 60 s; killed" >&2
    kill -KILL "$pid"
    failed=1
  fi
  wait "$pid"
  local rc=$?
  [ $rc -eq 0 ] || { echo "serve_bench: $name exited $rc" >&2; [ "$strict" = 1 ] && failed=1; }
}

for s in "${servers[@]}"; do
  if [ "$s" = kite ]; then
    port=${KITE_PORT:-8089}
    # The reference: `kite run` on the same backend, one prompt per process (a single sequence, as the generator
    # sends the reference prompts one at a time), 128 tokens with eos ignored.
    ref=$out/serve_reference.jsonl
    : >"$ref"
    for p in "The capital of France is" "def fibonacci(n):"; do
      $kite run --model "$model" --prompt "$p" --max-tokens 128 --ignore-eos --temperature 0 --json ${KITE_RUN_ARGS:-} \
        2>>"$out/serve_reference.err" | grep '^{' >>"$ref"
    done
    extra=()
    [ "$(wc -l <"$ref")" -eq 2 ] && [ "${REFERENCE:-1}" = 1 ] && extra=(--reference "$ref")
    [ ${#extra[@]} -eq 0 ] && echo "serve_bench: no reference gate (kite run failed or REFERENCE=0)" | tee -a "$out/serve_bench.log"
    # shellcheck disable=SC2086
    $kite serve --model "$model" --port "$port" ${KITE_ARGS:-} >"$out/kite_serve.out" 2>"$out/kite_serve.err" &
    pid=$!
    if wait_health $pid "$port"; then
      run_workloads "${KITE_LABEL:-kite serve}" "$port" "${extra[@]}"
    else
      echo "serve_bench: kite serve did not become healthy (see $out/kite_serve.err)" >&2
      failed=1
    fi
    stop $pid "kite serve" 1
    grep -h "stopped; KV blocks free\|engine steps:" "$out/kite_serve.err" | tail -2
  else
    port=${LLAMA_PORT:-8090}
    # shellcheck disable=SC2086
    "$LLAMA_SERVER" -m "$GGUF" --host 127.0.0.1 --port "$port" ${LLAMA_ARGS:--np 128 -fa on -ngl 999 -c 294912} \
      >"$out/llama_server.out" 2>"$out/llama_server.err" &
    pid=$!
    if wait_health $pid "$port"; then
      run_workloads "llama-server" "$port"
    else
      echo "serve_bench: llama-server did not become healthy (see $out/llama_server.err)" >&2
      failed=1
    fi
    stop $pid "llama-server" 0
  fi
done
echo "rows in $results:"
grep -c '"test": "serve"' "$results" 2>/dev/null || echo 0
exit $failed
