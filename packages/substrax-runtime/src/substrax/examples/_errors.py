"""The errors of ``substrax.examples``."""

from pathlib import Path

from substrax.support import StructuredError


class ExamplesRootNotADirectoryError(StructuredError, NotADirectoryError):
    """The examples root given to ``discover_examples`` is not a directory.

    Attributes:
        root: The path given.

    Example:
        >>> from pathlib import Path
        >>> from substrax.examples import ExamplesRootNotADirectoryError
        >>> print(ExamplesRootNotADirectoryError(Path("/no/such/examples")))
        examples root '/no/such/examples' is not a directory; pass the folder that holds the example scripts
    """

    __module__ = "substrax.examples"

    root: Path

    def _message(self) -> str:
        return (
            f"examples root {str(self.root)!r} is not a directory; pass the folder that holds "
            "the example scripts"
        )
