"""The statistics every comparison of seeds uses: the mean with a percentile-bootstrap interval (of one task, or of
the mean over tasks) and a two-sided permutation test of a difference of means (within each task, for several).

`sweep.py table`, the published QAM curves (`analysis/paper.py`, which has every seed) and the side-by-side
benchmarks (`benchmarks/reference_curves.py`) all call these, so that our interval and a published one, or ours and
the reference code's, are computed the same way.
"""

import numpy as np

BOOTSTRAP_SAMPLES = 10000
PERMUTATIONS = 20000


def bootstrap_ci(values, rng, samples=BOOTSTRAP_SAMPLES):
    """(mean, low, high) of 1-D `values`: the mean and its 95% percentile-bootstrap interval (seeds resampled)."""
    values = np.asarray(values, dtype=np.float64)
    means = values[rng.integers(0, len(values), size=(samples, len(values)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(values.mean()), float(low), float(high)


def bootstrap_mean_of_means(groups, rng, samples=BOOTSTRAP_SAMPLES):
    """(mean, low, high) of the mean over groups (tasks) of each group's mean over its values (seeds), with a 95%
    percentile-bootstrap interval that resamples the seeds within every task."""
    groups = [np.asarray(g, dtype=np.float64) for g in groups]
    means = np.mean([g[rng.integers(0, len(g), size=(samples, len(g)))].mean(axis=1) for g in groups], axis=0)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(np.mean([g.mean() for g in groups])), float(low), float(high)


def permutation_p(a, b, rng, permutations=PERMUTATIONS):
    """Two-sided permutation p-value of mean(a) - mean(b) for two groups of seeds: random relabellings of the
    pooled seeds, the observed labelling counted among them."""
    return stratified_permutation_p([a], [b], rng, permutations)


def stratified_permutation_p(a_groups, b_groups, rng, permutations=PERMUTATIONS):
    """Two-sided permutation p-value of the difference of the mean over tasks of each task's seed mean, `a_groups`
    against `b_groups` (one list of seeds per task, in the same task order): seeds are relabelled within each task
    only, so a task with more seeds on one side weighs as much as in the statistic. One task: `permutation_p`."""
    if len(a_groups) != len(b_groups) or not a_groups:
        raise ValueError(f'one group of seeds per task on both sides, got {len(a_groups)} and {len(b_groups)}')
    observed, permuted = 0.0, np.zeros(permutations)
    for a, b in zip(a_groups, b_groups, strict=True):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        pooled = np.concatenate([a, b])
        observed += a.mean() - b.mean()
        shuffled = pooled[np.argsort(rng.random((permutations, len(pooled))), axis=1)]
        permuted += shuffled[:, : len(a)].mean(axis=1) - shuffled[:, len(a) :].mean(axis=1)
    observed, permuted = abs(observed) / len(a_groups), np.abs(permuted) / len(a_groups)
    return float((1 + np.sum(permuted >= observed - 1e-12)) / (permutations + 1))
