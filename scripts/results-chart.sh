#!/usr/bin/env bash
# The README's chart: the numbers of its results table (scripts/results-table.py --tsv, from bench/results/*.jsonl)
# as grouped bars on a log scale, drawn by gnuplot (Debian: apt-get install -y gnuplot-nox).
#   bash scripts/results-chart.sh            # writes docs/results.png
#   bash scripts/results-chart.sh OUT.png
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/docs/results.png}"
command -v gnuplot >/dev/null || { echo "results-chart: gnuplot not found (apt-get install -y gnuplot-nox)" >&2; exit 2; }
data="$(mktemp)"
trap 'rm -f "$data"' EXIT
python3 "$root/scripts/results-table.py" --tsv >"$data"
gnuplot <<GNUPLOT
set terminal pngcairo size 1200,560 font "DejaVu Sans,11" noenhanced
set output "$out"
set datafile separator "\t"
set datafile missing "-"
set title "tok/s on one NVIDIA H200, Qwen3-0.6B shape unless named (bf16, log scale): bench/results/*.jsonl, bash scripts/results-chart.sh"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.9 border -1
set boxwidth 0.9
set logscale y 10
set yrange [10:400000]
set format y "%.0s%c"
set ytics nomirror
set grid ytics lc rgb "#dddddd"
set key top right
set xtics rotate by 30 right nomirror
set lmargin 8
plot "$data" every ::1 using 2:xtic(1) title "kite" lc rgb "#e8772e", \
     "" every ::1 using 3 title "llama.cpp" lc rgb "#3b6fb6", \
     "" every ::1 using 4 title "transformers" lc rgb "#999999"
GNUPLOT
echo "results-chart: wrote $out"
