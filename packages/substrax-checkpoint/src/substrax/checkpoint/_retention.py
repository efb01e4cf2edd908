"""Which steps a store keeps: the latest N, the best k by a metric, and every K-th step."""

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from substrax.support import Mode, check_int, check_mode

from ._write_errors import BestMetricNotRecordedError


_logger = logging.getLogger(__name__)

type ModeLike = Mode | Literal["min", "max"]
"""A :class:`~substrax.support.Mode`, or its plain string."""
type StepMetrics = Mapping[int, Mapping[str, float]]  # each step's metrics, by name


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionPolicy:
    """The retention rules; a step is kept when any rule keeps it, and the newest always is.

    Args:
        max_to_keep: keep the latest this many steps (None keeps every step).
        keep_best: also keep the best this many steps by ``best_metric``.
        best_metric: the metric ``keep_best`` ranks by.
        best_mode: ``Mode.MIN``/``"min"`` or ``Mode.MAX``/``"max"`` (stored as a ``Mode``).
        keep_every: also keep every step divisible by this (None for no such rule).

    A ``keep_best`` rule by a metric no step records (a misspelled name) keeps every step, with
    a warning (``prune`` refuses it with ``BestMetricNotRecordedError``).

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

    def steps_to_keep(self, steps: Iterable[int], metrics: StepMetrics) -> set[int]:
        """The steps these rules keep among ``steps``, given each step's metrics.

        Every step is kept when ``keep_best`` ranks by a metric none records; NaN never ranks.
        """
        ordered = sorted(set(steps))
        if not ordered:
            return set()
        if self.unrecorded_metric(ordered, metrics) is not None:
            return set(ordered)
        keep = {ordered[-1]}
        keep.update(ordered if self.max_to_keep is None else ordered[-self.max_to_keep :])
        if self.keep_every is not None:
            keep.update(step for step in ordered if step % self.keep_every == 0)
        if self.keep_best and self.best_metric is not None:
            name = self.best_metric
            scored = [
                (value, s)
                for s in ordered
                if (value := metrics.get(s, {}).get(name)) is not None and math.isfinite(value)
            ]
            sign = 1.0 if self.best_mode == Mode.MIN else -1.0
            scored.sort(key=lambda pair: (sign * pair[0], pair[1]))
            keep.update(step for _, step in scored[: self.keep_best])
        return keep

    def unrecorded_metric(self, steps: Iterable[int], metrics: StepMetrics) -> str | None:
        """``best_metric`` when ``keep_best`` ranks by it and none of ``steps`` records it, else None.

        Example:
            >>> from substrax.checkpoint import RetentionPolicy
            >>> policy = RetentionPolicy(max_to_keep=1, keep_best=1, best_metric="lsos")
            >>> policy.unrecorded_metric([1, 2], {1: {"loss": 0.1}, 2: {"loss": 0.5}})
            'lsos'
        """
        name = self.best_metric
        if not self.keep_best or name is None:
            return None
        held = list(steps)
        if not held or any(name in metrics.get(step, {}) for step in held):
            return None
        return name


def recorded_metrics(metrics: StepMetrics) -> list[str]:
    """The metric names any step records, sorted."""
    return sorted({name for values in metrics.values() for name in values})


def prunable(
    policy: RetentionPolicy,
    steps: Sequence[int],
    metrics: StepMetrics,
    directory: Path,
    *,
    warned: set[str] | None = None,
) -> list[int]:
    """The steps ``policy`` drops; ``BestMetricNotRecordedError`` if none records its metric.

    With ``warned`` (the metrics warned of), such a metric keeps every step, warned of once.
    Under ``keep_best``, a step ``metrics`` lacks (its record could not be read) is kept: it may
    be the best, and a warning names it (once, with ``warned``).
    """
    missing = policy.unrecorded_metric(steps, metrics)
    if missing is not None and warned is None:
        recorded = tuple(recorded_metrics({step: metrics.get(step, {}) for step in steps}))
        raise BestMetricNotRecordedError(metric=missing, directory=directory, recorded=recorded)
    if missing is not None and warned is not None and len(steps) > 1 and missing not in warned:
        warned.add(missing)
        _logger.warning(
            "keep_best ranks by the metric %r, which no step records yet (the steps record: "
            "%s); every step is kept until one does: if it is not an epoch's metric still to "
            "come, check best_metric= or pass metrics={%r: ...} to save()",
            missing,
            ", ".join(recorded_metrics(metrics)) or "no metrics",
            missing,
        )
    keep = policy.steps_to_keep(steps, metrics)
    unread = [step for step in steps if step not in metrics and step not in keep]
    if policy.keep_best and unread:
        keep.update(unread)
        if news := [step for step in unread if f"record of step {step}" not in (warned or ())]:
            if warned is not None:
                warned.update(f"record of step {step}" for step in news)
            _logger.warning(
                "the metadata records of steps %s in %s cannot be read, so keep_best cannot rank "
                "them; they are kept, as any may be the best: `python -m substrax.checkpoint verify "
                "DIRECTORY` checks their files; delete those you do not need with store.delete",
                news,
                directory,
            )
    return [step for step in steps if step not in keep]
