#!/usr/bin/env bash
# Four seeds of QC on cube-single trained in one process (--seeds), then the plot of their evaluations
# (docs/seeds_demo.png in the README). CPU-sized network; a few minutes on 2 cores. No downloads: the dataset is
# generated locally with OGBench's scripted oracles.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${DATA_DIR:-data/ogbench}
SAVE_DIR=${SAVE_DIR:-exp}
OUT=${OUT:-$SAVE_DIR/seeds_demo/curves.png}
export WANDB_MODE=${WANDB_MODE:-disabled}

if [ ! -f "$DATA_DIR/cube-single-play-v0.npz" ]; then
  python3 -m envs.generate_ogbench --env_name=cube-single-play-v0 --save_dir="$DATA_DIR" \
    --num_episodes=30 --num_val_episodes=3 --seed=0
fi

rm -rf "$SAVE_DIR/seeds_demo"
python3 main.py --run_group=seeds_demo --save_dir="$SAVE_DIR" --dataset_dir="$DATA_DIR" --exp_name=qc \
  --env_name=cube-single-play-singletask-task2-v0 --horizon_length=5 --seeds=0,1,2,3 \
  --agent.actor_type=best-of-n --agent.actor_num_samples=8 \
  --agent.actor_hidden_dims='(128,128)' --agent.value_hidden_dims='(128,128)' --agent.batch_size=128 \
  --offline_steps=3000 --online_steps=2000 --start_training=1 \
  --eval_interval=1000 --eval_episodes=10 --log_interval=500

python3 -m log_utils plot "$SAVE_DIR/seeds_demo" --out "$OUT" --band=minmax
echo "Runs: $(ls -d "$SAVE_DIR"/seeds_demo/qc_sd*)"
echo "Curves: $OUT"
