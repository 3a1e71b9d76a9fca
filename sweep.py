"""Sweeps of paper methods x environments x seeds: launch them (locally or on SLURM), follow them, tabulate them.

    python sweep.py launch SPEC DIR --executor=slurm --partition=gpu --gpus=1 --time=1440
    python sweep.py launch SPEC DIR --executor=local --devices=0,1,2,3 --runs_per_device=2
    python sweep.py status DIR
    python sweep.py table DIR --out DIR/results.md --plots DIR/plots

SPEC (YAML, JSON or Python) names a paper's protocol (qc, the default, or qam), its method presets
(sweeps/presets.py), environments, seeds and flag overrides; see sweeps/spec.py. Every run is started with
`--resume` under a deterministic name, so launching a SPEC again skips finished runs, continues interrupted ones and
starts missing ones.
"""

import argparse
import sys

from sweeps.presets import PROTOCOLS
from utils.errors import run_cli


def parser():
    methods = '; '.join(f'{protocol} protocol: {", ".join(found)}' for protocol, found in PROTOCOLS.items())
    p = argparse.ArgumentParser(
        prog='sweep.py', description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f'Method presets ({methods}); a SPEC names its protocol (protocol: qam) or prefixes names (qam:FQL).',
    )  # fmt: skip
    sub = p.add_subparsers(dest='command', required=True)
    launch = sub.add_parser('launch', help='submit every run of SPEC that is not finished')
    launch.add_argument('spec', help='SPEC file (.yaml, .yml, .json or .py)')
    launch.add_argument('dir', help='sweep directory (runs, logs and job state go here)')
    launch.add_argument('--executor', choices=('local', 'slurm'), default='local')
    launch.add_argument('--max_parallel', type=int,
                        help='local: processes at once (default 1; with --devices, all the GPUs take)')  # fmt: skip
    launch.add_argument('--devices', help='local: GPUs to spread the processes over, one GPU per process, e.g. 0,1,2,3 '
                        'or all (default: every process sees every GPU)')  # fmt: skip
    launch.add_argument('--runs_per_device', type=int, default=1,
                        help='local, with --devices: processes per GPU at once (default 1)')  # fmt: skip
    launch.add_argument('--runs_per_job', type=int, default=1, help='slurm: processes side by side in one job')
    slurm = launch.add_argument_group('slurm options (default: the cluster default)')
    slurm.add_argument('--partition')
    slurm.add_argument('--gpus', type=int, help='GPUs per job')
    slurm.add_argument('--cpus', type=int, help='CPUs per job')
    slurm.add_argument('--mem', help="memory per job, e.g. '64G'")
    slurm.add_argument('--time', type=int, default=24 * 60, help='minutes per job; then checkpoint and requeue')
    slurm.add_argument('--account')
    slurm.add_argument('--array_parallelism', type=int, default=256, help='array tasks running at once')
    slurm.add_argument('--signal_delay', type=int, default=120,
                       help='seconds before the time limit at which a job is told to checkpoint')  # fmt: skip
    slurm.add_argument('--max_timeouts', type=int, default=20,
                       help='times a job that reaches --time is requeued (preemptions do not count)')  # fmt: skip
    status = sub.add_parser('status', help='one line per run: state, last step, last eval success, error')
    status.add_argument('dir')
    table = sub.add_parser('table', help='success at the end of each phase per method x task, with 95%% CIs')
    table.add_argument('dir')
    table.add_argument('--out', help='also write the table (markdown) here')
    table.add_argument('--plots', help='write one learning-curve PNG per task into this directory')
    return p


def main(argv):
    args = parser().parse_args(argv)
    if args.command == 'launch':
        from sweeps.launch import SlurmOptions, launch

        options = SlurmOptions(
            partition=args.partition, gpus=args.gpus, cpus=args.cpus, mem=args.mem, time=args.time,
            account=args.account, array_parallelism=args.array_parallelism, signal_delay=args.signal_delay,
            max_timeouts=args.max_timeouts,
        )  # fmt: skip
        launch(args.spec, args.dir, args.executor, args.max_parallel, args.runs_per_job, options, args.devices,
               args.runs_per_device)  # fmt: skip
    elif args.command == 'status':
        from sweeps.report import status_lines

        print('\n'.join(status_lines(args.dir)))
    else:
        from sweeps.report import plot_tasks, table_markdown

        text = table_markdown(args.dir)
        print(text)
        if args.out:
            with open(args.out, 'w') as f:
                f.write(text + '\n')
        if args.plots:
            for path in plot_tasks(args.dir, args.plots):
                print(f'plot: {path}')
    return 0


if __name__ == '__main__':
    sys.exit(run_cli(main, sys.argv[1:]))
