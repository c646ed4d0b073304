#!/usr/bin/env bash
# On the build machine: packs Release binaries of one or more builds for a call to the lent GPU machine, which
# receives only the checkout and the ignored paths named in the call's `carry` (64 MiB in all).
#   bash bench/device_pack.sh TAG NAME=BUILD_DIR[:binary,binary...] [NAME=BUILD_DIR...]
# Default binaries: cuda_ops_test cuda_e2e_test engine_gpu_test cuda_soak_test bench_gpu_test cuda_forward_bench kite-serve-bench kite (those a
# build has). Writes .device_in/TAG/NAME/*.xz (stripped, xz -9e) and .device_in/TAG/unpack.sh; carry
# .device_in/TAG, and on the device start the command with `source .device_in/TAG/unpack.sh`: it unpacks NAME's
# binaries to /tmp/f/NAME/ and links /work/main and each build's source tree to the checkout (the tests find
# tests/data through the absolute path they were built with). Then, e.g.:
#   AB="main:/tmp/f/main try:/tmp/f/try:KITE_X=1" ROUNDS=3 bash bench/ab.sh
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,9p "$0" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
tag=$1
shift
dest=$root/.device_in/$tag
rm -rf "$dest"
mkdir -p "$dest"
defaults="tests/cuda/cuda_ops_test tests/cuda/cuda_e2e_test tests/engine_gpu/engine_gpu_test tests/engine_gpu/cuda_soak_test tests/bench/bench_gpu_test bench/cuda_forward_bench bench/kite-serve-bench kite"
links="/work/main"
for spec in "$@"; do
  name=${spec%%=*}
  rest=${spec#*=}
  dir=${rest%%:*}
  [ "$name" != "$spec" ] && [ -d "$dir" ] || { echo "device_pack: '$spec' is not NAME=BUILD_DIR" >&2; exit 2; }
  if [ "$rest" != "$dir" ]; then
    wanted=()
    IFS=, read -r -a names <<<"${rest#*:}"
    for n in "${names[@]}"; do
      found=$(cd "$dir" && ls tests/*/"$n" bench/"$n" "$n" 2>/dev/null | head -1 || true)
      [ -n "$found" ] || { echo "device_pack: no $n in $dir" >&2; exit 2; }
      wanted+=("$found")
    done
  else
    read -r -a wanted <<<"$defaults"
  fi
  mkdir -p "$dest/$name"
  for rel in "${wanted[@]}"; do
    [ -f "$dir/$rel" ] || continue
    strip -o "$dest/$name/.stripped" "$dir/$rel"
    # xz: half gzip's size, and a call's carry is bounded; the GPU machine unpacks with Python's lzma (no xz there
    # is assumed).
    xz -9e -T2 -c "$dest/$name/.stripped" >"$dest/$name/$(basename "$rel").xz"
    rm -f "$dest/$name/.stripped"
  done
  # The source tree the build was configured from (its tests embed tests/data paths under it).
  src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$dir/CMakeCache.txt" 2>/dev/null || true)
  [ -n "$src" ] && case " $links " in *" $src "*) ;; *) links="$links $src" ;; esac
done
cat >"$dest/unpack.sh" <<EOF
# Sourced on the GPU machine from the checkout's root (bench/device_pack.sh wrote it).
root=\$(pwd)
mkdir -p /work
for l in $links; do [ -e "\$l" ] || { mkdir -p "\$(dirname "\$l")" && ln -s "\$root" "\$l"; }; done
for d in "\$root/.device_in/$tag"/*/; do
  n=\$(basename "\$d"); mkdir -p /tmp/f/\$n
  for f in "\$d"*.xz; do b=\$(basename "\$f" .xz); python3 -c 'import lzma,sys,shutil; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "\$f" /tmp/f/\$n/\$b && chmod +x /tmp/f/\$n/\$b; done
done
EOF
du -sh "$dest" | sed 's/^/device_pack: /'
