#!/usr/bin/env bash
# The GPU benchmark: one prepared run of at most 10 minutes on a GPU node, from the project root.
#
#   bash benchmarks/gpu.sh [OUT_DIR]          # default OUT_DIR: benchmarks/gpu_results
#
# Sections, most important first, each written as soon as it ends (OUT_DIR/<section>.json and .log):
#   online  main.py's online loop at paper size: per-step and fused schedules, on host batches and with chunks gathered
#           on the device (--device_replay), S = 1, 4, 8, with its breakdown, and the start-up of 1 and 8 seeds;
#           `nvidia-smi dmon` samples the GPU's busy share meanwhile (dmon.txt)
#   updates per-step and fused update rates of QC, QC-FQL, QAM and QAM-F at paper size
#   seeds   seed-updates/s of S = 1, 4, 8, 16 seeds in one process
# Then OUT_DIR/summary.txt holds the card, every section's tables and its targets, and the paper-run estimate
# (1M offline updates + 1M online steps + evaluations, hours) from the online and updates sections' rates. Python wheels the node lacks can
# be installed first from a folder of wheels: QC_WHEELS=/path/to/wheels bash benchmarks/gpu.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/gpu_results}
mkdir -p "$out"
if [ -n "${QC_WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/qc-site "$QC_WHEELS"/*.whl
    export PYTHONPATH=/tmp/qc-site:$PWD
fi
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled MUJOCO_GL=${MUJOCO_GL:-disable} JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/qc-xla-cache}
budget=${QC_GPU_BUDGET_S:-570}  # seconds for all sections together
start=$(date +%s)
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } > "$out/card.txt" 2>&1

section() {  # section NAME SHARE_OF_WHAT_IS_LEFT
    local name=$1 left limit
    left=$(( budget - ($(date +%s) - start) ))
    limit=$(python3 -c "print(max(30, int($left * $2)))")
    echo "== $name (at most ${limit} s)"
    timeout "$limit" python3 -m benchmarks.run --only "$name" --out "$out/$name.json" "${@:3}" > "$out/$name.log" 2>&1
    echo "   exit $? after $(( $(date +%s) - start )) s"
}

nvidia-smi dmon -s u -d 1 > "$out/dmon.txt" 2>&1 &
dmon=$!
section online 0.6 "${@:2}"
kill "$dmon" 2>/dev/null
section updates 0.45 "${@:2}"
section seeds 0.95 "${@:2}"

{
    cat "$out/card.txt"
    for name in online updates seeds; do
        echo; echo "== $name"
        sed -n '/^Matmul rate/,$p' "$out/$name.log" 2>/dev/null
    done
    echo; echo "== GPU busy (nvidia-smi dmon, sm %) during the online section"
    python3 - "$out/dmon.txt" <<'PY'
import sys
values = []
for line in open(sys.argv[1]):
    parts = line.split()
    if parts and parts[0].isdigit() and len(parts) > 1 and parts[1].isdigit():
        values.append(int(parts[1]))
print(f'{len(values)} samples, mean sm {sum(values) / max(len(values), 1):.0f}%' if values else 'no samples')
PY
    echo; echo "== Paper run estimate (QC, one seed; benchmarks.run.paper_run_hours)"
    python3 - "$out" <<'PY'
import json, os, sys
from benchmarks.run import paper_run_hours
def load(name):
    path = os.path.join(sys.argv[1], f'{name}.json')
    return json.load(open(path)) if os.path.exists(path) else {}
offline = [r['fused_ups'] for r in load('updates').get('updates') or [] if r['agent'] == 'QC' and r['size'] == 'paper']
rows = [r for r in load('online').get('online') or [] if r['agent'] == 'QC' and r['seeds'] == 1
        and r['env_workers_flag'] == -1]
for r in rows if offline else []:
    print(f"  {r['schedule']}, {r['sampling']} sampling: {paper_run_hours(r, offline[0]):.2f} h "
          f"(offline {offline[0]:.0f} updates/s, online {r['steps_per_s']:.0f} steps/s)")
print('' if rows and offline else '  missing: the online and updates sections must both have finished')
PY
} > "$out/summary.txt"
cat "$out/summary.txt"
