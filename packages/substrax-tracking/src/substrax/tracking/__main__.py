"""``python -m substrax.tracking``: plot a file log, or replay a spool file (``--help`` says how).

This module's path is an interface: ``python -m substrax.tracking`` runs it.
"""

from ._cli import exit_with_main


if __name__ == "__main__":
    exit_with_main()
