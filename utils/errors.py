"""Errors a user can act on, and the one wrapper that turns them into a line on stderr and an exit status.

Every command-line entry point (the drivers, the dataset generators, the plotting CLI) runs its `main` through
`run_cli`, so a bad flag, an unknown environment or a missing dataset ends with one line and no traceback.
"""

import sys


class UserError(Exception):
    """A problem the user can fix; its message is one actionable line. Exits with `exit_code` (2)."""

    exit_code = 2
    prefix = 'error: '


class UsageError(UserError):
    """A bad flag or command-line input."""


def run_cli(main, argv=None):
    """Calls `main(argv)`; a `UserError` (or subclass) prints its one line to stderr and exits with its code."""
    try:
        return main(argv)
    except UserError as e:
        print(f'{e.prefix}{e}', file=sys.stderr, flush=True)
        sys.exit(e.exit_code)


def cli_main(main):
    """`main` wrapped by `run_cli`, for `absl.app.run(cli_main(main))`."""
    return lambda argv: run_cli(main, argv)
