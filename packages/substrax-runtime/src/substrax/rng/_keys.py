"""Keys from an explicit owner, never a default seed; streams derived from a seed by name."""

# Callers are untyped at run time: the isinstance checks below are the validation.
# pyright: reportUnnecessaryIsInstance=false

import hashlib
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from substrax.support import check_int, require

from ._errors import MissingRngStreamError


if TYPE_CHECKING:
    from flax import nnx


NNX_EXTRA = "substrax-runtime[nnx]"


def _is_rngs(value: object) -> bool:
    # An nnx.Rngs can only exist once flax.nnx is imported, so flax is never imported here.
    nnx = sys.modules.get("flax.nnx")
    return nnx is not None and isinstance(value, nnx.Rngs)


def _check_streams(streams: Iterable[str]) -> tuple[str, ...]:
    # tuple() before the checks: checking a generator first would use it up
    try:
        names = None if isinstance(streams, str) else tuple(streams)
    except TypeError:  # not iterable
        names = None
    if names is None or not all(isinstance(s, str) and s for s in names):
        shown = streams if names is None else names
        raise TypeError(f"streams must be a sequence of non-empty names, got {shown!r}")
    return names


def _as_int(value: object) -> object:
    """A NumPy integer as its Python int (for ``check_int``); anything else as it is."""
    return int(value) if isinstance(value, np.integer) else value


def key_from(rng: "jax.Array | nnx.Rngs", *, streams: Iterable[str], context: str) -> jax.Array:
    """Take a key from an explicit owner: an ``nnx.Rngs`` stream or a key itself.

    There is no fallback to a default seed: a caller that wants randomness must hand it over.

    Args:
        rng: An ``nnx.Rngs`` (the first of ``streams`` it holds is drawn from), a typed key
            (``jax.random.key``, ndim 0) or a raw ``uint32[2]`` key (``jax.random.PRNGKey``).
        streams: Acceptable stream names, in preference order (any iterable of str, a
            generator included; a lone str is refused).
        context: What asks for the key, for error messages.

    Returns:
        A key.

    Raises:
        MissingRngStreamError: ``rng`` is an ``nnx.Rngs`` holding none of ``streams``.
        TypeError: ``rng`` is neither, e.g. an int seed or a batch of keys.

    Example:
        >>> import jax
        >>> from substrax.rng import key_from
        >>> key = key_from(jax.random.key(0), streams=("dropout",), context="demo")
        >>> key.shape
        ()
    """
    names = _check_streams(streams)
    if not names:
        raise ValueError(f"{context}: key_from needs at least one stream name, got streams=()")
    if _is_rngs(rng):
        rngs: Any = rng
        for name in names:
            if name in rngs:
                return rngs[name]()
        raise MissingRngStreamError(context=context, streams=names)
    if _is_one_key(rng):
        return jnp.asarray(rng)
    raise TypeError(
        f"{context} needs one PRNG key (jax.random.key(seed)) or an nnx.Rngs, got "
        f"{_describe(rng)}; there is no default seed"
    )


def _is_one_key(value: object) -> bool:
    # a typed key of shape (), or a raw uint32 key of shape (2,)
    if not isinstance(value, jax.Array | np.ndarray):
        return False
    if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        return value.ndim == 0
    return value.dtype == np.uint32 and value.shape == (2,)


def _check_one_key(key: object, who: str) -> None:
    if not _is_one_key(key):
        raise TypeError(f"{who} needs one PRNG key (jax.random.key(seed)), got {_describe(key)}")


def _describe(value: object) -> str:
    if isinstance(value, jax.Array | np.ndarray):
        return f"an array of dtype {value.dtype} and shape {value.shape}"
    return repr(value)


def fold_in_name(key: jax.Array, name: str) -> jax.Array:
    """Fold a name into a key, the same way in every interpreter.

    The data folded in is the first 4 bytes of the default (64-byte) BLAKE2b digest of the
    UTF-8 ``name``, read as a big-endian uint32, passed to ``jax.random.fold_in`` (Python's
    ``hash`` is salted per process, so it would not do). This is the derivation substrax 0.1.22
    documents, and a test pins it (``"params"`` folds in 1405647464). It was checked against
    that description only, not against keys 0.1.22 produced: if a seed's streams differ from the
    ones an 0.1.22 run drew, compare the jax versions and ``jax_default_prng_impl`` (they change
    what a key draws), and whether the keys came from ``rngs_from_seed`` (which uses this
    function) or from ``nnx.Rngs(seed)`` (which does not).

    Only 32 bits of the name are folded in, so different names can derive the same key: among
    ``n`` names two collide with probability about ``n * (n - 1) / 2**33`` (1 in 95 million for
    10 names, 1 in 8,600 for 1,000, even odds near 77,000 names; ``"layer_76135"`` and
    ``"layer_76334"`` collide). ``rngs_from_seed`` refuses streams whose names collide; where you
    fold many names yourself, fold in an index (``jax.random.fold_in(key, i)``) or check that
    the derived keys differ. The derivation is kept as it is so that seeds keep their streams.

    Args:
        key: The parent key.
        name: A non-empty name, e.g. a stream name.

    Returns:
        The derived key.

    Raises:
        TypeError: ``key`` is not one PRNG key, or ``name`` is not a str.
        ValueError: ``name`` is empty, or holds a lone surrogate (it has no UTF-8 form).

    Example:
        >>> import jax
        >>> from substrax.rng import fold_in_name
        >>> a = fold_in_name(jax.random.key(0), "params")
        >>> bool((jax.random.key_data(a) == jax.random.key_data(fold_in_name(jax.random.key(0), "params"))).all())
        True
    """
    _check_one_key(key, "fold_in_name")
    if not isinstance(name, str):  # pyright: ignore[reportUnnecessaryIsInstance] - user input
        raise TypeError(f"fold_in_name needs a name (a non-empty str), got {name!r}")
    if not name:
        raise ValueError("fold_in_name needs a non-empty name, got ''")
    return jax.random.fold_in(key, np.uint32(_folded(name)))


def _folded(name: str) -> int:
    """The 32 bits ``fold_in_name`` folds in for ``name``; ValueError if it is no UTF-8 text."""
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError as error:  # a lone surrogate, e.g. "\ud800"
        raise ValueError(
            f"the name {name!r} is not valid Unicode text (it holds the lone surrogate "
            f"{name[error.start]!r}, which UTF-8 cannot encode); use a name of real characters"
        ) from None
    return int.from_bytes(hashlib.blake2b(encoded).digest()[:4], "big")


def _refuse_colliding_names(names: Sequence[str]) -> None:
    """Refuse two names that fold in the same bits: their derived keys would be equal."""
    seen: dict[int, str] = {}
    for name in names:
        other = seen.setdefault(_folded(name), name)
        if other != name:
            raise ValueError(
                f"stream names {other!r} and {name!r} derive the same key (fold_in_name folds "
                "in only 32 bits of a name's hash, and theirs are equal); rename one of them"
            )


def split_key(key: jax.Array, num: int = 2) -> jax.Array:
    """Split ``key`` into ``num`` new keys.

    Args:
        key: The key to split.
        num: How many keys, at least 1 (an int or a NumPy integer, as ``rngs_from_seed``'s seed).

    Returns:
        The keys, stacked on a leading axis of length ``num``.

    Raises:
        TypeError: ``key`` is not one PRNG key, or ``num`` is neither an int nor a NumPy integer
            (a bool is refused).
        ValueError: ``num`` is below 1.

    Example:
        >>> import jax
        >>> from substrax.rng import split_key
        >>> split_key(jax.random.key(0), 3).shape
        (3,)
    """
    _check_one_key(key, "split_key")
    return jax.random.split(key, check_int("split_key num", _as_int(num), minimum=1))


def rngs_from_seed(seed: int, streams: Iterable[str] = ("default",)) -> "nnx.Rngs":
    """Build an ``nnx.Rngs`` whose streams are derived from one seed by name.

    Each stream gets ``fold_in_name(jax.random.key(seed), name)``, so adding, removing or
    reordering streams leaves every other stream's keys unchanged. Two names that fold in the
    same 32 bits (see ``fold_in_name``) would get the same keys: they are refused. Needs the
    ``[nnx]`` extra.

    Args:
        seed: A non-negative int.
        streams: Distinct stream names (any iterable of str, a generator included).

    Returns:
        The ``nnx.Rngs``.

    Raises:
        TypeError: ``seed`` is not an int (a bool is refused) or a name is not a string.
        ValueError: ``seed`` is negative or past what ``jax.random.key`` takes (``2**32 - 1``,
            or ``2**63 - 1`` with x64 on), or ``streams`` is empty, repeats a name or holds
            two names that derive the same key (naming both), or a name holds a lone surrogate.
        MissingExtraError: flax is not installed (an ``ImportError``; install
            ``substrax-runtime[nnx]``).

    Example:
        >>> from substrax.rng import rngs_from_seed
        >>> rngs = rngs_from_seed(0, ("params", "dropout"))
        >>> rngs.dropout().shape
        ()
    """
    checked = check_int("seed", _as_int(seed), minimum=0)
    wide = jax.dtypes.canonicalize_dtype(np.int64) == np.int64  # jax_enable_x64, here and now
    if checked > (largest := 2**63 - 1 if wide else 2**32 - 1):
        hint = "" if wide else " with jax_enable_x64 off (it would give the keys of a small seed)"
        raise ValueError(
            f"seed={checked} is past {largest}, the largest seed jax.random.key takes{hint}; "
            "use a smaller seed (seed % 2**32, say)"
        )
    names = _check_streams(streams)
    if not names:
        raise ValueError("rngs_from_seed needs at least one stream name")
    if len(set(names)) != len(names):
        duplicates = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"stream names must be distinct; repeated: {', '.join(duplicates)}")
    _refuse_colliding_names(names)
    nnx = require("flax.nnx", who="rngs_from_seed", distribution="substrax-runtime", extra="nnx")
    root = jax.random.key(checked)
    return nnx.Rngs(**{name: fold_in_name(root, name) for name in names})
