"""Sweeps: grids of paper methods x environments x seeds, run locally or on SLURM, with status and result tables.

`sweep.py` is the command line; `presets` holds the paper's methods, `spec` turns a SPEC file into runs,
`jobs` runs them (local subprocesses or SLURM through submitit) and `report` reads the results back.
"""
