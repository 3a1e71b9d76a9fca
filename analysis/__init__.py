"""Reading run directories: the files a run writes and their readers (`run_files`), learning curves and their plots
(`plotting`, behind `python -m log_utils plot`), and the paper's published curves (`paper`, `published/`).

The package sits below the run layer: it imports only `utils/` and third-party modules. `training/`, `sweeps/` and
`log_utils.py` import it, never the reverse (`tests/test_import_graph.py` checks this).
"""
