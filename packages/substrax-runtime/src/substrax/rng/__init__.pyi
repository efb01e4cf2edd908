# The public names of substrax.rng, each once: type checkers read this stub, and at run time
# substrax.support.lazy_exports reads it for __all__, dir() and each name's first use.

from ._errors import MissingRngStreamError as MissingRngStreamError
from ._keys import (
    NNX_EXTRA as NNX_EXTRA,
    fold_in_name as fold_in_name,
    key_from as key_from,
    rngs_from_seed as rngs_from_seed,
    split_key as split_key,
)
