#!/usr/bin/env bash
# A tiny sweep on this machine (about 1 minute on 2 cores): makes a small cube-single dataset with OGBench's
# oracle, runs sweeps/examples/tiny.yaml through the local executor, then prints its status and results table.
set -euo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=${WANDB_MODE:-disabled}
python3 -m envs.generate_ogbench --env_name=cube-single-play-v0 --save_dir=exp/sweep_demo/data --num_episodes=3 \
    --num_val_episodes=1 --episode_length=61 --seed=0
python3 sweep.py launch sweeps/examples/tiny.yaml exp/sweep_demo/sweep --executor=local --max_parallel=2
python3 sweep.py status exp/sweep_demo/sweep
python3 sweep.py table exp/sweep_demo/sweep --out exp/sweep_demo/results.md --plots exp/sweep_demo/plots
