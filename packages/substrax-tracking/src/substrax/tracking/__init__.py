"""substrax.tracking: step-wise experiment logging to the console, files, TensorBoard, W&B and MLflow.

Every logger has one surface (``log_scalar``, ``log_scalars``/``log_metrics``,
``log_hyperparams``, ``log_text``, ``log_image``, ``log_histogram``, ``close``). The W&B and
MLflow loggers send from a background thread and keep what they could not deliver in a spool
file (``python -m substrax.tracking replay SPOOL``). Importing this module imports neither jax
nor any backend SDK.

Example:
    >>> import io, tempfile
    >>> from substrax.tracking import create_logger
    >>> out = io.StringIO()
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     with create_logger("demo", log_dir=directory, stream=out) as logger:
    ...         logger.log_scalars({"loss": 0.5, "acc": 0.9}, step=1)
    >>> print(out.getvalue(), end="")
    [demo] step       1 | loss        0.5 | acc        0.9
"""

from substrax.support import lazy_exports


# Every public name is listed once, in __init__.pyi; each loads from its module on first use.
lazy_exports(__name__)
