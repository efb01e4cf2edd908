# The public names of substrax.callbacks, each once: type checkers read this stub, and at run time
# substrax.support.lazy_exports reads it for __all__, dir() and each name's first use.

from substrax.support import Mode as Mode

from ._callback_list import CallbackList as CallbackList, is_checkpointable as is_checkpointable
from ._early_stopping import (
    EarlyStoppingCallback as EarlyStoppingCallback,
    EarlyStoppingConfig as EarlyStoppingConfig,
)
from ._errors import (
    CallbackStateMismatchError as CallbackStateMismatchError,
    CostAnalysisError as CostAnalysisError,
    MetricValueError as MetricValueError,
    MissingMetricError as MissingMetricError,
    MonitorMismatchError as MonitorMismatchError,
    NoLearningRateFoundError as NoLearningRateFoundError,
)
from ._loss_spike import LossSpike as LossSpike, LossSpikeDetector as LossSpikeDetector
from ._plateau_lr import ReduceLROnPlateauCallback as ReduceLROnPlateauCallback
from ._profiler import ProfilerWindow as ProfilerWindow
from ._progress import ProgressCallback as ProgressCallback
from ._protocol import (
    BaseCallback as BaseCallback,
    Logs as Logs,
    TrainerLike as TrainerLike,
    TrainingCallback as TrainingCallback,
)
from ._throughput import (
    MetricsLogger as MetricsLogger,
    ThroughputMeter as ThroughputMeter,
    step_flops as step_flops,
)
from ._tracker import (
    BestMetricTracker as BestMetricTracker,
    EarlyStopping as EarlyStopping,
    PlateauMode as PlateauMode,
)
