"""The kinds of jax call ``counted_calls`` counts, their default weights, and the counts.

:class:`CallCounts` holds what a counted block made, keyed by ``(kind, package)``. Importing this
module imports no jax.
"""

from collections import Counter
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Final


DISPATCH: Final = "dispatch"
HOST_TO_DEVICE: Final = "host_to_device"
DEVICE_TO_HOST: Final = "device_to_host"
COMPILE: Final = "compile"
KINDS: Final = (DISPATCH, HOST_TO_DEVICE, DEVICE_TO_HOST, COMPILE)
"""What is counted: a compiled program run from Python at the top level (``dispatch``), a host
value handed to ``jax.device_put`` (``host_to_device``, one per leaf) or to ``jnp.asarray`` or
``jnp.array`` (one per call), an array's value read on the host (``device_to_host``:
``float()``, ``np.asarray``, ``.tolist()``, printing) and an XLA compilation (``compile``)."""

JAX_CALL_WEIGHTS: Final[Mapping[str, int]] = MappingProxyType(dict.fromkeys(KINDS, 1))
"""The default weights: every kind counts once per event. A kind weighted 0 is not counted."""

ALIASES: Final[Mapping[str, str]] = MappingProxyType(
    {"jit_dispatch": DISPATCH, "device_put_leaves": HOST_TO_DEVICE}
)
"""substrax 0.1.22's names of two kinds, accepted wherever a kind is named. Its third,
``device_put`` (calls of ``jax.device_put``), is a started-function kind: weighting it counts
the calls of ``jax.device_put`` under that name."""

DEVICE_PUT: Final = "device_put"


class CallCounts(Counter[tuple[str, str]]):
    """Counts keyed by ``(kind, package)``; ``kind`` is one of :data:`KINDS` or a custom kind.

    A custom kind is one ``counted_calls`` was given a weight function for (``custom_kinds``);
    the names in :data:`ALIASES` stand for the kinds they name. ``uncounted`` holds the
    :data:`KINDS` the block did not count (its ``weights`` left them out or weighted them 0):
    their counts read 0, and ``per_iteration`` refuses a limit on them.

    Example:
        >>> from substrax.testing import CallCounts
        >>> counts = CallCounts({("dispatch", "substrax"): 2, ("dispatch", "other"): 1})
        >>> counts.of("dispatch"), counts.of("dispatch", "other"), counts.of("compile")
        (3, 1, 0)
        >>> counts.packages("dispatch")
        {'other': 1, 'substrax': 2}
        >>> CallCounts({("steps", "mylib"): 3}, custom_kinds=("steps",)).of("steps")
        3
        >>> CallCounts(uncounted=("compile",)).copy().uncounted
        ('compile',)
    """

    custom_kinds: tuple[str, ...]
    uncounted: tuple[str, ...]

    def __init__(
        self,
        counts: Mapping[tuple[str, str], int] | None = None,
        /,
        *,
        custom_kinds: Sequence[str] = (),
        uncounted: Sequence[str] = (),
    ) -> None:
        super().__init__(counts or {})
        self.custom_kinds = tuple(custom_kinds)
        self.uncounted = tuple(dict.fromkeys(map(check_kind, uncounted)))

    def copy(self) -> "CallCounts":
        """A copy, with the same custom and uncounted kinds."""
        return CallCounts(self, custom_kinds=self.custom_kinds, uncounted=self.uncounted)

    def __reduce__(self) -> tuple[object, ...]:  # Counter's would drop the kinds
        kinds = {"custom_kinds": self.custom_kinds, "uncounted": self.uncounted}
        return (type(self), (dict(self),), kinds)

    def of(self, kind: str, package: str | None = None) -> int:
        """The count of one kind, overall or for one package.

        Args:
            kind: One of :data:`KINDS` (or :data:`ALIASES`), or a custom kind.
            package: A key the keys function returned; None sums over all of them.

        Returns:
            The count (0 when nothing of that kind was seen).

        Raises:
            ValueError: ``kind`` is none of these.
        """
        kind = counted_kind(self, kind)
        if package is not None:
            return self[kind, package]
        return sum(count for (seen, _), count in self.items() if seen == kind)

    def kinds(self) -> dict[str, int]:
        """Every kind's overall count, zeros included: :data:`KINDS`, then the custom kinds.

        Returns:
            ``{kind: count}``.
        """
        return {kind: self.of(kind) for kind in (*KINDS, *self.custom_kinds)}

    def packages(self, kind: str) -> dict[str, int]:
        """One kind's counts by package, sorted by package.

        Args:
            kind: One of :data:`KINDS` (or :data:`ALIASES`), or a custom kind.

        Returns:
            ``{package: count}`` for the packages with a non-zero count.

        Raises:
            ValueError: ``kind`` is none of these.
        """
        kind = counted_kind(self, kind)
        return {p: n for (k, p), n in sorted(self.items()) if k == kind and n}


def check_kind(kind: str) -> str:
    """The built-in kind ``kind`` names (an alias resolved).

    Raises:
        ValueError: ``kind`` names none of :data:`KINDS` or :data:`ALIASES`.
    """
    kind = ALIASES.get(kind, kind)
    if kind not in KINDS:
        raise ValueError(
            f"unknown call kind {kind!r}; the kinds are {', '.join(KINDS)} (or 0.1.22's "
            f"{', '.join(ALIASES)}); count other calls with a weight function"
        )
    return kind


def counted_kind(counts: CallCounts, kind: str) -> str:
    """The kind ``kind`` names in ``counts``: one of its custom kinds, or a built-in one.

    ``device_put`` is a kind too when it was not weighted (nothing counted: 0).

    Raises:
        ValueError: ``kind`` is none of these; names the custom kinds ``counts`` holds too.
    """
    if kind in counts.custom_kinds or kind == DEVICE_PUT:
        return kind
    try:
        return check_kind(kind)
    except ValueError as error:
        if not counts.custom_kinds:
            raise
        own = ", ".join(counts.custom_kinds)
        raise ValueError(f"{error}; the kinds of your own counted here: {own}") from error
