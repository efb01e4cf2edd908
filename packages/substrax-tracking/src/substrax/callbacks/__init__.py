"""substrax.callbacks: the training-callback protocol, early stopping and other metric-driven callbacks.

A callback is structural (:class:`TrainingCallback` is a Protocol); a trainer drives a
:class:`CallbackList` through its hooks and reads ``should_stop`` itself.

Example:
    >>> from substrax.callbacks import EarlyStopping
    >>> stopper = EarlyStopping(patience=2, min_delta=0.01, mode="min")
    >>> improved = []
    >>> for step, loss in enumerate([1.0, 0.5, 0.49, 0.495, 0.5]):
    ...     improved.append(stopper.update(loss))
    ...     if stopper.should_stop:
    ...         break
    >>> improved, step
    ([True, True, False, False], 3)
"""

from ._callback_list import (
    CallbackList as CallbackList,
    CallbackStateMismatchError as CallbackStateMismatchError,
    is_checkpointable as is_checkpointable,
)
from ._early_stopping import (
    EarlyStoppingCallback as EarlyStoppingCallback,
    EarlyStoppingConfig as EarlyStoppingConfig,
    MissingMetricError as MissingMetricError,
)
from ._loss_spike import LossSpike as LossSpike, LossSpikeDetector as LossSpikeDetector
from ._plateau_lr import (
    NoLearningRateFoundError as NoLearningRateFoundError,
    ReduceLROnPlateauCallback as ReduceLROnPlateauCallback,
)
from ._progress import ProgressCallback as ProgressCallback
from ._protocol import (
    BaseCallback as BaseCallback,
    Logs as Logs,
    TrainerLike as TrainerLike,
    TrainingCallback as TrainingCallback,
)
from ._tracker import (
    BestMetricTracker as BestMetricTracker,
    EarlyStopping as EarlyStopping,
    PlateauMode as PlateauMode,
)


__all__ = [
    "BaseCallback",
    "BestMetricTracker",
    "CallbackList",
    "CallbackStateMismatchError",
    "EarlyStopping",
    "EarlyStoppingCallback",
    "EarlyStoppingConfig",
    "Logs",
    "LossSpike",
    "LossSpikeDetector",
    "MissingMetricError",
    "NoLearningRateFoundError",
    "PlateauMode",
    "ProgressCallback",
    "ReduceLROnPlateauCallback",
    "TrainerLike",
    "TrainingCallback",
    "is_checkpointable",
]
