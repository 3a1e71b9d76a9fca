#!/usr/bin/env bash
# End-to-end demo on a CPU, with no downloads: install, generate a small cube-single dataset with OGBench's own
# oracles, train QC (best-of-n, H=5) offline then online with a CPU-sized network, evaluate, plot the curves.
# Takes about 5 minutes on 2 cores after the install (1 of them generating the data). Override the output folders
# with DATA_DIR / SAVE_DIR. The settings were chosen so that success visibly rises in that time (task1, 60 episodes
# of data, 128x128 networks, 20 evaluation episodes; task2 with the same settings rose to 0.35 only).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${DATA_DIR:-data/ogbench}
SAVE_DIR=${SAVE_DIR:-exp}
export WANDB_MODE=${WANDB_MODE:-disabled}

bash scripts/install.sh

if [ ! -f "$DATA_DIR/cube-single-play-v0.npz" ] || [ "$(cat "$DATA_DIR/.quickstart" 2>/dev/null)" != 60 ]; then
  python3 -m envs.generate_ogbench --env_name=cube-single-play-v0 --save_dir="$DATA_DIR" \
    --num_episodes=60 --num_val_episodes=1 --seed=0
  echo 60 > "$DATA_DIR/.quickstart"  # the episode count of this data (an older quickstart generated 30)
fi

rm -rf "$SAVE_DIR/quickstart"
python3 main.py --run_group=quickstart --save_dir="$SAVE_DIR" --dataset_dir="$DATA_DIR" \
  --env_name=cube-single-play-singletask-task1-v0 --horizon_length=5 \
  --agent.actor_type=best-of-n --agent.actor_num_samples=8 \
  --agent.actor_hidden_dims='(128,128)' --agent.value_hidden_dims='(128,128)' --agent.batch_size=128 \
  --offline_steps=15000 --online_steps=5000 --start_training=1 \
  --eval_interval=2500 --eval_episodes=20 --log_interval=1000

python3 -m log_utils plot "$SAVE_DIR/quickstart" --out "$SAVE_DIR/quickstart/curves.png"
echo "Evaluation log: $(ls "$SAVE_DIR"/quickstart/*/eval.csv)"
echo "Curves: $SAVE_DIR/quickstart/curves.png"
