#!/usr/bin/env bash
# On the GPU machine: the shared-memory configuration the driver picks for each decode kernel, for two builds, by
# ncu's LaunchStats and Occupancy sections (Shared Memory Configuration Size, static / dynamic / driver shared memory
# per block, the block limits by registers and by shared memory).
#
# Why (docs/notes-cuda.md, session 23): 112 bytes less static shared memory in the decode GEMV (gemv.cu's
# reduce_scratch sized to GEMV_WARPS instead of 32) made single-stream decode 25% slower, and the timeline showed the
# split-K attention's blocks starting beside the qkv product's far more often. Registers allow one attention block
# beside four qkv blocks either way; if the two kernels' shared-memory configurations differ, an SM must drain
# before the other kernel's blocks can start there. This shows whether they do.
#
#   A=/tmp/f/main B=/tmp/f/r16 OUT=/tmp/out bash bench/experiments/2026-12-01-smem-config.sh
# A and B are directories holding a cuda_forward_bench (B: main with reduce_scratch[GEMV_WARPS]). Writes
# $OUT/smem-config-A.txt and -B.txt (ncu's report) and prints the lines that matter side by side.
set -uo pipefail
: "${A:?A=DIR of the first cuda_forward_bench}" "${B:?B=DIR of the second}"
out=${OUT:-/tmp/kite-out}
mkdir -p "$out"
for name in A B; do
    dir=${!name}
    # Decode kernels only (prefill runs cuBLASLt GEMMs, not these); skip the first step's launches.
    ncu --clock-control none --section LaunchStats --section Occupancy \
        --kernel-name regex:'gemv_kernel|attention_decode_kernel|embed_kernel|publish' \
        --launch-skip 40 --launch-count 12 \
        "$dir/cuda_forward_bench" --shape qwen3-0.6b-base -p 0 -n 16 --depth 16384 --reps 1 --batch 1 \
        >"$out/smem-config-$name.txt" 2>&1 || echo "ncu failed for $name (see $out/smem-config-$name.txt)"
    echo "## $name ($dir)"
    grep -E '^  [A-Za-z_].*\(|Shared Memory Configuration Size|Shared Memory Per Block|Block Limit (Registers|Shared Mem)|Registers Per Thread' \
        "$out/smem-config-$name.txt" | sed 's/  */ /g'
done
