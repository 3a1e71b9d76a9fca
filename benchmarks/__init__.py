"""Benchmark suite: update throughput and FLOP efficiency, evaluation, online loop, dataset memory.

Run everything with `python -m benchmarks.run` (or `--quick` for a CI-sized smoke run); see `benchmarks/RESULTS.md`.
"""
