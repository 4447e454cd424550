"""The ``study`` console script and ``python -m study``.

The command line's modules are imported here, inside the interrupt handling: a Ctrl-C while
Python is still importing them (the first ~0.1 s) exits 130 with one line, as later, instead
of a traceback from the middle of an import."""

from __future__ import annotations

import sys


def main() -> None:
    """Import the CLI, then run it on ``sys.argv`` (see :func:`study.cli.cli_main`)."""
    try:
        from study.cli import cli_main
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted before the command started; nothing ran. "
                         "Fix: re-run the same command\n")
        sys.exit(130)
    sys.exit(cli_main())


if __name__ == "__main__":
    main()
