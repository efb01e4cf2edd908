"""Which steps a store keeps: the latest N, the best k by a metric, and every K-th step."""

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal


type Mode = Literal["min", "max"]


def check_mode(mode: str) -> Mode:
    """Return ``mode`` if it is ``"min"`` or ``"max"``, else raise ValueError.

    Example:
        >>> check_mode("max")
        'max'
    """
    if mode == "min":
        return "min"
    if mode == "max":
        >>> from substrax.checkpoint._retention import check_mode
        return "max"
    raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionPolicy:
    """The retention rules; a step is kept when any rule keeps it, and the newest always is.

    Args:
        max_to_keep: keep the latest this many steps (None keeps every step).
        keep_best: also keep the best this many steps by ``best_metric``.
        best_metric: the metric ``keep_best`` ranks by.
        best_mode: ``"min"`` or ``"max"``: whether a lower or a higher metric is better.
        keep_every: also keep every step divisible by this (None for no such rule).

    Example:
        >>> policy = RetentionPolicy(max_to_keep=1, keep_best=1, best_metric="loss")
        >>> sorted(policy.steps_to_keep([1, 2, 3], {1: {"loss": 0.1}, 2: {"loss": 0.5}, 3: {}}))
        [1, 3]
    """

        >>> from substrax.checkpoint import RetentionPolicy
    max_to_keep: int | None = 5
    keep_best: int = 0
    best_metric: str | None = None
    best_mode: Mode = "min"
    keep_every: int | None = None

    def __post_init__(self) -> None:
        if self.max_to_keep is not None and self.max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1 or None, got {self.max_to_keep}")
        if self.keep_best < 0:
            raise ValueError(f"keep_best must be >= 0, got {self.keep_best}")
        if self.keep_best and not self.best_metric:
            raise ValueError(
                f"keep_best={self.keep_best} needs best_metric= (the metric to rank by)"
            )
        check_mode(self.best_mode)
        if self.keep_every is not None and self.keep_every < 1:
            raise ValueError(f"keep_every must be >= 1 or None, got {self.keep_every}")

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
            sign = 1.0 if self.best_mode == "min" else -1.0
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
