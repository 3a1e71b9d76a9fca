"""This project's chunk sampler against the authors' (`utils/datasets.py` of github ColinQiyangLi/qam), exhaustively:
every chunk start of the dataset at once, each field of the chunks both codes return compared.

    python -m benchmarks.reference_sampler --reference=/path/to/qam              # cube-single task1, H = 5

Both draw a batch's starts uniformly from `[0, size - H]` (theirs `np.random.randint`, here the sampler's own
generator), so the two samplers hand an agent the same batches in distribution exactly when their chunks agree
start by start. Here both codes' `sample_sequence` are called once with every start (their `randint` and this
project's `Dataset.draw_chunks` made to return them all) on the same arrays. Chunks
that run past an episode end (`valid[:, -1] = 0`) are left out of every loss in both codes; where they differ is
reported apart. The data is OGBench's cube-single play data made by `envs.generate_ogbench` (60 episodes unless
`--data_dir` has it), loaded by this project's `envs.env_utils.make_env_and_datasets`.
"""

import argparse
import importlib.util
import os
import sys
import tempfile
from unittest import mock

import numpy as np

from benchmarks.reference_curves import generate_data

FIELDS = ('rewards', 'masks', 'valid', 'terminals', 'actions', 'observations', 'next_observations')


def their_dataset_class(reference):
    """Their `Dataset`, imported from the file alone (their package is not put on the path)."""
    path = os.path.join(reference, 'utils', 'datasets.py')
    spec = importlib.util.spec_from_file_location('qam_reference_datasets', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Dataset


def every_chunk(ours, theirs_cls, horizon, discount):
    """({field: ours (N, ...)}, {field: theirs (N, ...)}) for every one of the N = size - H + 1 chunk starts of the
    dataset `ours` (this project's `Dataset`), theirs built from copies of its arrays."""
    keys = ('observations', 'actions', 'rewards', 'masks', 'terminals', 'next_observations')
    theirs = theirs_cls.create(**{k: np.array(ours[k]) for k in keys})
    starts = np.arange(ours.size - horizon + 1)
    with mock.patch.object(ours, 'draw_chunks', lambda batch_size, length: starts[:, None] + np.arange(length)):
        here = ours.sample_sequence(len(starts), horizon, discount)
    with mock.patch('numpy.random.randint', lambda high, size=None: np.arange(high)):
        there = theirs.sample_sequence(len(starts), horizon, discount)
    return here, there


def compare(here, there):
    """{field: (rows differing among valid chunks, rows differing among the others)} (float tolerance 1e-6)."""
    valid = np.asarray(there['valid'])[:, -1] > 0
    rows = {}
    for field in FIELDS:
        a, b = (np.asarray(x[field], dtype=np.float64) for x in (here, there))
        differs = (np.abs(a - b) > 1e-6).reshape(len(a), -1).any(axis=1)
        rows[field] = (int((differs & valid).sum()), int((differs & ~valid).sum()))
    return rows, int(valid.sum()), int((~valid).sum())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--reference', required=True, help='a checkout of github ColinQiyangLi/qam')
    parser.add_argument('--env_name', default='cube-single-play-singletask-task1-v0')
    parser.add_argument('--horizon', type=int, default=5)
    parser.add_argument('--discount', type=float, default=0.99)
    parser.add_argument('--data_dir', default=os.path.join(tempfile.gettempdir(), 'qc_reference_losses_data'))
    args = parser.parse_args(argv)
    if not os.path.isfile(os.path.join(args.reference, 'utils', 'datasets.py')):
        sys.exit(f'error: {args.reference} is not a checkout of github ColinQiyangLi/qam (no utils/datasets.py there)')
    generate_data(args.data_dir)
    from envs import env_utils

    _, _, dataset, _ = env_utils.make_env_and_datasets(args.env_name, dataset_dir=args.data_dir)
    here, there = every_chunk(dataset, their_dataset_class(args.reference), args.horizon, args.discount)
    rows, n_valid, n_other = compare(here, there)
    print(f'{args.env_name}, H = {args.horizon}: {n_valid + n_other} chunk starts, {n_valid} valid, {n_other} past an '
          'episode end')  # fmt: skip
    print('| field | differing, valid chunks | differing, chunks past an episode end |')
    print('|---|---:|---:|')
    for field, (a, b) in rows.items():
        print(f'| `{field}` | {a} | {b} |')
    return rows


if __name__ == '__main__':
    main()
