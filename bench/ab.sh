#!/usr/bin/env bash
# Same-machine A/B of builds on the GPU machine (a diagnostic: cuda_forward_bench has no correctness gate; run
# each build's cuda_ops_test / cuda_e2e_test before trusting its numbers).
#   AB="main:DIR_A tune:DIR_B long:DIR_B:KITE_X=1,KITE_Y=2 ..." [ROUNDS=2] [SHAPES="..."] bash bench/ab.sh
# Each DIR holds a cuda_forward_bench binary; an optional third field sets environment variables for that entry
# (comma-separated), so one binary can be compared under its env switches. The entries run interleaved, round
# after round, so the drift of one lent machine (up to ~3% between calls, docs/BENCHMARKS.md) falls on all of
# them alike: single-stream decode at depths 256 .. 16,384 (0.6B) and 256 (other shapes), batched decode B=8,
# 16 and 32 at depth 256. SINGLE=0 leaves out the single-stream rows; BATCHES="8,16,32" picks the batch sizes
# (BATCHES=none: no batched rows); DEPTHS="256,16384" picks the 0.6B single-stream depths.
# Writes ${OUT:-/tmp/kite-out}/ab.txt (every row of every round) and ab-summary.txt (ms per step, the mean of
# the rounds, per build, and each build's change against the first); ab-errors.txt lists the runs that failed, if any.
set -uo pipefail
out=${OUT:-/tmp/kite-out}
mkdir -p "$out"
rounds=${ROUNDS:-2}
shapes=${SHAPES:-"qwen3-0.6b-base qwen3-1.7b-base"}
batches=${BATCHES:-8,16,32}
[ "${SINGLE:-1}" = 0 ] && shapes=""
[ -n "${AB:-}" ] || { echo "AB=\"name:dir name:dir ...\" is required" >&2; exit 2; }
raw="$out/ab.txt"
: >"$raw"
rm -f "$out/ab-errors.txt"
# One cuda_forward_bench run (arguments after NAME SHAPE) of the current entry, whose binary directory and
# environment are the loop's $dir and env_args; a run that fails is reported (an entry's rows would otherwise just
# be missing from the summary, e.g. when a variable's value holds a comma and splits into a word env runs).
run_entry() {
  local name=$1 shape=$2 log
  shift 2
  log=$(mktemp)
  if ! timeout 120 env "${env_args[@]}" "$dir/cuda_forward_bench" "$@" >"$log" 2>&1; then
    echo "ab.sh: entry $name ($shape) failed: $(tail -1 "$log")" | tee -a "$out/ab-errors.txt" >&2
  fi
  grep '^tg' "$log" | sed "s/^/$name $shape /" >>"$raw"
  rm -f "$log"
}
for round in $(seq 1 "$rounds"); do
  for pair in $AB; do
    IFS=: read -r name dir vars <<<"$pair"
    env_args=(KITE_AB_ENTRY="$name") # env needs one assignment at least
    [ -n "$vars" ] && IFS=, read -r -a more <<<"$vars" && env_args+=("${more[@]}")
    for shape in $shapes; do
      if [ "$shape" = qwen3-0.6b-base ]; then
        args=(--depth "${DEPTHS:-256,1024,2048,4096,16384}" --batch 1)
      else
        args=(--depth 256 --batch 1)
      fi
      run_entry "$name" "$shape" --shape "$shape" -p 0 -n 64 --reps 3 "${args[@]}"
    done
    [ "$batches" = none ] ||
      run_entry "$name" qwen3-0.6b-base --shape qwen3-0.6b-base -p 0 -n 64 --reps 3 --depth 256 --batch "$batches"
  done
done
# Rows: NAME SHAPE tgN [x B] @ depth D (variant) TOK_S MS FLOOR
awk -v order="$AB" '
  BEGIN { n = split(order, pairs, " "); for (i = 1; i <= n; i++) { split(pairs[i], kv, ":"); names[i] = kv[1] } }
  {
    name = $1; label = $2; for (i = 3; i <= NF - 3; i++) label = label " " $i
    ms = $(NF - 1); sum[label, name] += ms; count[label, name]++
    if (!(label in seen)) { seen[label] = 1; labels[++n_labels] = label }
  }
  END {
    printf "%-60s", "ms per step (mean of rounds)"; for (i = 1; i <= n; i++) printf " %12s", names[i]; printf "\n"
    for (j = 1; j <= n_labels; j++) {
      l = labels[j]; printf "%-60s", l
      base = count[l, names[1]] ? sum[l, names[1]] / count[l, names[1]] : 0
      for (i = 1; i <= n; i++) {
        if (!count[l, names[i]]) { printf " %12s", "-"; continue }
        v = sum[l, names[i]] / count[l, names[i]]
        if (i == 1 || base == 0) printf " %12.4f", v; else printf " %6.4f%+5.1f%%", v, 100 * (v - base) / base
      }
      printf "\n"
    }
  }' "$raw" | tee "$out/ab-summary.txt"
