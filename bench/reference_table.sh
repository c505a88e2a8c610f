#!/usr/bin/env bash
# The controller's reference table (docs/BENCHMARKS.md, "Session 13's final measurements"): the 14 rows
# of bench_policies.py and the eleven s11 shapes, predictive with the shipped forecaster, one setting of
# PolicyConfig overrides. Deterministic figures; run two settings side by side to compare.
#
#   bench/reference_table.sh OUTDIR [k=v,k=v]      # no params = the defaults
#   CHECKPOINT=forecaster/checkpoints/candidate_v3.safetensors bench/reference_table.sh OUTDIR
#                                                   # a learned checkpoint other than the shipped one
#
# Writes OUTDIR/{main,more,sine300,sine1200,shapes}.txt (each bench_policies.py's printed table) and
# OUTDIR/shapes/ (bench/gen_shapes_s11.py's CSVs, generated once). PYTHON (default .venv/bin/python)
# and the tree (the current directory; set PYTHONPATH to measure another) are the caller's.
set -euo pipefail
out=${1:?usage: bench/reference_table.sh OUTDIR [k=v,k=v]}
params=${2:-}
py=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
extra=()
if [[ -n "$params" ]]; then extra=(--params "$params"); fi
if [[ -n "${CHECKPOINT:-}" ]]; then extra+=(--checkpoint "$CHECKPOINT"); fi
run() {
  local name=$1
  shift
  OMP_NUM_THREADS=1 nice -n 5 "$py" bench/bench_policies.py --policies predictive --forecaster default \
    "${extra[@]}" "$@" >"$out/$name.txt" 2>"$out/$name.err"
}
[[ -d "$out/shapes" ]] || "$py" bench/gen_shapes_s11.py --out "$out/shapes" >/dev/null
run main --workloads code,conv,mmpp,mmpp-holdout,sine,mooncake --time-split 0.7
run more --workloads mmpp@3,mmpp@4,mmpp-holdout@1,mmpp-holdout@2,mmpp-diurnal,ramp
run sine300 --workloads sine --sine-period-s 300
run sine1200 --workloads sine --sine-period-s 1200
shapes=$(ls "$out"/shapes/s11_*.csv | sed 's/^/file:/' | paste -sd, -)
run shapes --workloads "$shapes"
echo "done: $out"
