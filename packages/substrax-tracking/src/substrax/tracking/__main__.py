"""``python -m substrax.tracking``: plot a file log, or replay a spool file.

This module's path is an interface: ``python -m substrax.tracking`` runs it. The command line
lives in :mod:`substrax.tracking._cli` (``python -m substrax.tracking --help`` lists it).
"""

from ._cli import exit_with_main


if __name__ == "__main__":
    exit_with_main()
