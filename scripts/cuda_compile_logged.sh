#!/usr/bin/env bash
# The CUDA compiler launcher of kite's library objects (CMakeLists.txt): runs one nvcc command, which the build gives
# -Xptxas=-v, and keeps ptxas's report of every kernel's registers, shared memory, stack and spills beside the object
# as OBJECT.ptxas.log. scripts/kernel_footprint.sh reads those reports instead of compiling every kernel a second
# time. Everything else nvcc prints (warnings, errors) still goes to stderr.
set -uo pipefail
out=""
previous=""
for arg in "$@"; do
  if [[ "$previous" == "-o" ]]; then out="$arg"; fi
  previous="$arg"
done
if [[ -z "$out" ]]; then exec "$@"; fi
log="$out.ptxas.log"
"$@" 2>"$log.partial"
status=$?
# ptxas -v lines: "ptxas info    : ..." and the indented "N bytes stack frame, ..." under each kernel.
grep -v -E '^ptxas info|^ +[0-9]+ bytes stack frame' "$log.partial" >&2 || true
if [[ $status -eq 0 ]]; then
  # Newer than the object (the report was last written before nvcc's host pass): kernel_footprint.sh takes a report
  # no older than its object as this object's.
  { mv "$log.partial" "$log" && touch "$log"; } || status=1
else
  rm -f "$log.partial" "$log"
fi
exit "$status"
