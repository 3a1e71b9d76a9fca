#!/usr/bin/env bash
# Does it reproduce the paper? On one GPU node: generates cube-double-play-v0 if missing, trains the QC paper's
# QC-FQL (8 seeds) and QC presets (--paper=qam: the QAM paper's QAM and QAM-F) offline for 100k steps within
# --budget_minutes (default 20), and prints the table against the published point with the plot. `--tiny` runs the
# same chain on a CPU in about a minute. See sweeps/paper_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=${WANDB_MODE:-disabled}
exec python3 -m sweeps.paper_check "$@"
