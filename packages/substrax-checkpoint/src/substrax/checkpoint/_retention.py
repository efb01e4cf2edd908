"""Which steps a store keeps: the latest N, the best k by a metric, and every K-th step."""

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from substrax.support import Mode, check_int, check_mode


type ModeLike = Mode | Literal["min", "max"]
"""A :class:`~substrax.support.Mode`, or its plain string."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionPolicy:
    """The retention rules; a step is kept when any rule keeps it, and the newest always is.

    Args:
        max_to_keep: keep the latest this many steps (None keeps every step).
        keep_best: also keep the best this many steps by ``best_metric``.
        best_metric: the metric ``keep_best`` ranks by.
        best_mode: ``Mode.MIN``/``"min"`` or ``Mode.MAX``/``"max"``: whether a lower or a higher
            metric is better (stored as a ``Mode``).
        keep_every: also keep every step divisible by this (None for no such rule).

    Example:
        >>> from substrax.checkpoint import RetentionPolicy
        >>> policy = RetentionPolicy(max_to_keep=1, keep_best=1, best_metric="loss")
        >>> sorted(policy.steps_to_keep([1, 2, 3], {1: {"loss": 0.1}, 2: {"loss": 0.5}, 3: {}}))
        [1, 3]
    """

    max_to_keep: int | None = 5
    keep_best: int = 0
    best_metric: str | None = None
    best_mode: ModeLike = Mode.MIN
    keep_every: int | None = None

    def __post_init__(self) -> None:
        if self.max_to_keep is not None:
            check_int("max_to_keep", self.max_to_keep, minimum=1)
        check_int("keep_best", self.keep_best, minimum=0)
        if self.keep_best and not self.best_metric:
            raise ValueError(
                f"keep_best={self.keep_best} needs best_metric= (the metric to rank by)"
            )
        object.__setattr__(self, "best_mode", check_mode("best_mode", self.best_mode))
        if self.keep_every is not None:
            check_int("keep_every", self.keep_every, minimum=1)

    def steps_to_keep(
        self, steps: Iterable[int], metrics: Mapping[int, Mapping[str, float]]
    ) -> set[int]:
        """The steps these rules keep among ``steps``, given each step's metrics."""
        ordered = sorted(set(steps))
        if not ordered:
            return set()
        keep = {ordered[-1]}
        keep.update(ordered if self.max_to_keep is None else ordered[-self.max_to_keep :])
        if self.keep_every is not None:
            keep.update(step for step in ordered if step % self.keep_every == 0)
        if self.keep_best and self.best_metric is not None:
            name = self.best_metric
            scored = [(metrics[s][name], s) for s in ordered if name in metrics.get(s, {})]
            sign = 1.0 if self.best_mode == Mode.MIN else -1.0
            scored.sort(key=lambda pair: (sign * pair[0], pair[1]))
            keep.update(step for _, step in scored[: self.keep_best])
        return keep


@dataclass(frozen=True, slots=True)
class OrbaxPreservation:
    """An orbax ``PreservationPolicy`` that applies a ``RetentionPolicy`` with the store's metrics.

    Orbax deletes the steps it does not preserve only after the newest step is committed.
    """

    policy: RetentionPolicy
    metrics_of: Callable[[], Mapping[int, Mapping[str, float]]]
    on_evict: Callable[[list[int]], None]

    def should_preserve(self, checkpoints: Sequence[Any], *, context: object) -> Sequence[bool]:
        """One bool per orbax checkpoint info: whether to keep it."""
        del context
        keep = self.policy.steps_to_keep((info.step for info in checkpoints), self.metrics_of())
        decisions = [info.step in keep for info in checkpoints]
        evicted = [info.step for info, kept in zip(checkpoints, decisions, strict=True) if not kept]
        if evicted:
            self.on_evict(evicted)
        return decisions
