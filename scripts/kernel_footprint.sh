#!/usr/bin/env bash
# Checks every CUDA kernel's footprint (registers, static shared memory, stack, spills), as ptxas reports it for the
# build's own flags, against bench/kernel-footprint.txt.
#
# Why: a kernel's footprint decides how many of its blocks, and which other kernels' blocks, fit an SM, and where its
# dynamic shared memory starts, and so its speed, and CI has no GPU to notice. A change of nothing the GPU ran but
# 112 bytes of static shared memory in the decode GEMV moved its staged vector off a 128-byte boundary, and
# single-stream decode became 25% slower (docs/cuda.md). With this check such a change shows
# up as a diff to the baseline, which is updated only after the change has run on the H200 (docs/BENCHMARKS.md,
# "Before a kernel change lands").
#
#   bash scripts/kernel_footprint.sh BUILD_DIR            # compare (exit 1 on a difference)
#   bash scripts/kernel_footprint.sh BUILD_DIR --update   # rewrite the baseline
# BUILD_DIR is a configured build with the CUDA backend (its flags are read from there). The baseline holds the
# nvcc version it was made with; under another version the check says so and passes (register allocation differs).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:?usage: kernel_footprint.sh BUILD_DIR [--update]}"
update="${2:-}"
baseline="$root/bench/kernel-footprint.txt"
flags_file="$build/CMakeFiles/kite_objects.dir/flags.make"
[ -f "$flags_file" ] || { echo "kernel_footprint: $flags_file not found (a build configured with the CUDA backend?)" >&2; exit 2; }
nvcc_bin="$(sed -n 's/^# compile CUDA with //p' "$flags_file")"
[ -x "$nvcc_bin" ] || { echo "kernel_footprint: no nvcc named in $flags_file" >&2; exit 2; }
read_flag() { sed -n "s/^$1 = //p" "$flags_file"; }
# The build's flags, without -Werror (ptxas -v prints to stderr) and with the include paths made absolute.
cuda_flags="$(read_flag CUDA_FLAGS | sed 's/-Werror=all-warnings//')"
cuda_defines="$(read_flag CUDA_DEFINES | sed 's/-DKITE_GIT_COMMIT=\\"[^"]*\\"//')"
includes="$(tr '\n' ' ' <"$build/CMakeFiles/kite_objects.dir/includes_CUDA.rsp")"
version="$("$nvcc_bin" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"

# Every kernel's dynamic shared memory is declared 128-byte aligned: where it starts otherwise depends on the static
# arrays before it, and the decode GEMV's cp.async-staged vector at byte 16 instead of 128 made each product ~30%
# slower with nothing else in its SASS changed (docs/cuda.md).
unaligned="$(grep -rn --include='*.cu' --include='*.cuh' 'extern __shared__' "$root"/src/backend/cuda | grep -v '__align__(128)' || true)"
if [ -n "$unaligned" ]; then
    echo "$unaligned" >&2
    echo "kernel_footprint: dynamic shared memory above not declared __align__(128)" >&2
    exit 1
fi

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
current="$scratch/footprint.txt"
echo "# kernel footprints (scripts/kernel_footprint.sh; nvcc $version): file kernel registers smem stack spill-stores spill-loads" >"$current"
# Every .cu of the backend (kernels/ and the paths beside it), named by its file name alone. The build keeps ptxas's
# report beside each object (scripts/cuda_compile_logged.sh); where it is missing or older than the object, the
# source is compiled here, device code only (-cubin), with the build's flags: the report is the same.
compiled=0
for source in $(find "$root"/src/backend/cuda -name '*.cu' | sort); do
    name="$(basename "$source")"
    object="$build/CMakeFiles/kite_objects.dir/${source#"$root"/}.o"
    if [ -f "$object.ptxas.log" ] && [ -f "$object" ] && ! [ "$object" -nt "$object.ptxas.log" ]; then
        cp "$object.ptxas.log" "$scratch/$name.log"
    else
        compiled=$((compiled + 1))
        # shellcheck disable=SC2086 # the flags are word lists
        (cd "$build" && eval "\"$nvcc_bin\" $cuda_defines $includes $cuda_flags -Xptxas -v -x cu -cubin \"$source\" -o \"$scratch/$name.cubin\"") \
            2>"$scratch/$name.log" || { cat "$scratch/$name.log" >&2; echo "kernel_footprint: $name did not compile" >&2; exit 2; }
    fi
    # ptxas prints, per kernel: "Compiling entry function 'NAME'", "N bytes stack frame, N bytes spill stores, N bytes
    # spill loads" and "Used N registers, [used N barriers, ]N bytes smem, ...".
    awk -v file="$name" '
        /Compiling entry function/ { match($0, /\x27[^\x27]+\x27/); kernel = substr($0, RSTART + 1, RLENGTH - 2) }
        /bytes stack frame/ { stack = $1; stores = $5; loads = $9 }
        /Used [0-9]+ registers/ {
            regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
            smem = 0; if (match($0, /[0-9]+ bytes smem/)) { smem = substr($0, RSTART, RLENGTH); sub(/ bytes smem/, "", smem) }
            print file, kernel, regs, smem, stack, stores, loads
        }' "$scratch/$name.log" >>"$scratch/raw.txt"
done
# Kernel names demangled, the anonymous namespace and the parameter lists left out (the mangled names carry a hash
# of the source's path).
while read -r file kernel regs smem stack stores loads; do
    pretty="$(echo "$kernel" | c++filt | sed 's/^void //; s/(anonymous namespace):://g; s/(.*//' | tr -d ' ')"
    echo "$file $pretty $regs $smem $stack $stores $loads"
done <"$scratch/raw.txt" | sort >>"$current"

if [ "$update" = "--update" ]; then
    cp "$current" "$baseline"
    echo "kernel_footprint: wrote $(($(wc -l <"$baseline") - 1)) kernels to bench/kernel-footprint.txt"
    exit 0
fi
[ -f "$baseline" ] || { echo "kernel_footprint: no baseline: run with --update" >&2; exit 1; }
base_version="$(sed -n '1s/.*nvcc \([0-9.]*\)).*/\1/p' "$baseline")"
if [ "$base_version" != "$version" ]; then
    echo "kernel_footprint: skipped: the baseline is from nvcc $base_version, this is nvcc $version"
    exit 0
fi
if ! diff -u "$baseline" "$current" >"$scratch/diff.txt"; then
    cat "$scratch/diff.txt"
    echo "kernel_footprint: a kernel's footprint changed (above: file kernel registers smem stack spill-stores spill-loads)." >&2
    echo "Run the change on the H200 first (docs/BENCHMARKS.md, 'Before a kernel change lands'), then" >&2
    echo "  bash scripts/kernel_footprint.sh $build --update" >&2
    exit 1
fi
echo "kernel_footprint: $(($(wc -l <"$baseline") - 1)) kernels as in bench/kernel-footprint.txt ($compiled source(s) compiled here, the others' reports from the build)"
