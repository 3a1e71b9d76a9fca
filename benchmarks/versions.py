"""`main.py` of this tree against `main.py` of an earlier commit: online steps/s with the same flags and data.

    python -m benchmarks.versions                      # against REF (the main.py that issue 25 measured)
    python -m benchmarks.versions --ref=HEAD~3 --steps=3000 --out=/tmp/versions.json

The earlier commit is checked out into a temporary git worktree. Each version runs as a subprocess with
`--online_steps` of `short` and of `short + steps` (tiny QC networks, no offline phase, no evaluation), and its
rate is the extra steps over the extra wall time, so start-up and compiles cancel out. This tree's runs use the
persistent compilation cache, warmed by a run of each length first, so that its timed runs load their programs.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.common import ENV_NAME, SIZES, load_average

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REF = 'fcf69bc'  # main before issues 24 and 25: "today's main.py" of issue 25.


def tiny_flags(data_dir, save_dir):
    """The flags both versions accept: QC with tiny networks on the generated cube-single data."""
    spec = SIZES['tiny']
    hidden = '(' + ','.join(map(str, spec['hidden'])) + ')'
    return [
        f'--env_name={ENV_NAME}', f'--dataset_dir={data_dir}', f'--save_dir={save_dir}', '--offline_steps=0',
        f'--agent.actor_hidden_dims={hidden}', f'--agent.value_hidden_dims={hidden}',
        f'--agent.batch_size={spec["batch_size"]}', f'--agent.actor_num_samples={spec["num_samples"]}',
        f'--agent.flow_steps={spec["flow_steps"]}', '--agent.actor_type=best-of-n', '--horizon_length=5',
        '--eval_interval=0', '--eval_episodes=0', '--log_interval=1000', '--save_interval=100000000',
        '--start_training=5',
    ]  # fmt: skip


def wall(tree, flags, steps, name):
    """Seconds of one `main.py` run of `steps` online steps in `tree`."""
    env = dict(os.environ, WANDB_MODE='disabled', PYTHONPATH=tree)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, 'main.py', *flags, f'--online_steps={steps}', f'--exp_name={name}'], cwd=tree, env=env,
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return time.perf_counter() - start


def rate(tree, flags, short, steps, label, warm=False):
    """Online steps/s of `tree`'s main.py: the extra `steps` over the extra seconds."""
    if warm:  # Both lengths: the device replay's storage has a row per online step, so each length compiles its own.
        wall(tree, flags, short, f'{label}_warm')
        wall(tree, flags, short + steps, f'{label}_warm_long')
    t_short = wall(tree, flags, short, f'{label}_short')
    t_long = wall(tree, flags, short + steps, f'{label}_long')
    return steps / (t_long - t_short)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--ref', default=REF, help='the earlier commit')
    parser.add_argument('--steps', type=int, default=3000, help='online steps timed')
    parser.add_argument('--short', type=int, default=200, help='online steps of the run subtracted')
    parser.add_argument('--out', default=None, help='JSON output')
    args = parser.parse_args(argv)

    from benchmarks.online import dataset_dir

    data = dataset_dir()
    with tempfile.TemporaryDirectory(prefix='qc-bench-versions-') as tmp:
        old_tree = os.path.join(tmp, 'old')
        subprocess.run(['git', '-C', ROOT, 'worktree', 'add', '--detach', old_tree, args.ref], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            flags = tiny_flags(data, os.path.join(tmp, 'runs'))
            cache = ['--compilation_cache_dir=' + os.path.join(tmp, 'xla')]
            new = rate(ROOT, flags + cache, args.short, args.steps, 'new', warm=True)
            old = rate(old_tree, flags, args.short, args.steps, 'old')
        finally:
            subprocess.run(['git', '-C', ROOT, 'worktree', 'remove', '--force', old_tree], check=False)
    result = dict(ref=args.ref, steps=args.steps, new_steps_per_s=new, old_steps_per_s=old, ratio=new / old,
                  load_average=load_average(), cpu_count=os.cpu_count())  # fmt: skip
    print(f'main.py online steps/s, tiny QC, {args.steps} steps: this tree {new:.1f}, {args.ref} {old:.1f} '
          f'({new / old:.2f}x)')  # fmt: skip
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == '__main__':
    main()
