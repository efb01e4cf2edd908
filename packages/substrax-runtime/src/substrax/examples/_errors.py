"""The errors of ``substrax.examples``."""

from pathlib import Path

from substrax.support import PicklableError


class ExamplesRootNotADirectoryError(PicklableError, NotADirectoryError):
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

    def __init__(self, root: Path) -> None:
        self.root = root
        super().__init__(
            f"examples root {str(root)!r} is not a directory; pass the folder that holds the "
            "example scripts"
        )
