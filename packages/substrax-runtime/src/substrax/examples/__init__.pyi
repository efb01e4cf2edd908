# The public names of substrax.examples, each once: type checkers read this stub, and at run time
# substrax.support.lazy_exports reads it for __all__, dir() and each name's first use.

from ._discover import discover_examples as discover_examples
from ._errors import ExamplesRootNotADirectoryError as ExamplesRootNotADirectoryError
