"""``python -m substrax.tracking``: plot a file log or replay a spool; this path is an interface."""

from ._cli import exit_with_main


if __name__ == "__main__":
    exit_with_main()
