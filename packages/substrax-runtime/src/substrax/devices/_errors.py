"""The errors of ``substrax.devices``."""

from substrax.support import StructuredError

from ._hardware import HardwareType


class _DevicesError(StructuredError, public_module="substrax.devices"):
    """The base of every error here: each shows as ``substrax.devices``'s, where users import it."""


class UnknownHardwareError(_DevicesError, LookupError):
    """The batch-size table has no entry for this hardware.

    Attributes:
        hardware_type: The type asked for (``UNKNOWN`` for an unrecognised accelerator).
        device_kind: The device's own name, when it was detected.

    Example:
        >>> from substrax.devices import HardwareType, UnknownHardwareError
        >>> str(UnknownHardwareError(HardwareType.UNKNOWN, "NVIDIA L40S")).startswith("no batch")
        True
    """

    hardware_type: HardwareType
    device_kind: str | None = None

    def _message(self) -> str:
        from ._hardware import BATCH_SIZE_TABLE  # noqa: PLC0415  (the table imports this module)

        seen = f" (device_kind {self.device_kind!r})" if self.device_kind else ""
        return (
            f"no batch-size recommendation for {self.hardware_type.name}{seen}; the table knows "
            f"{', '.join(h.name for h in BATCH_SIZE_TABLE)}. Pass hardware_type= for the "
            "closest match, or measure (calibrax owns hardware specs)"
        )


class BatchDimensionError(_DevicesError, ValueError, kw_only=True):
    """A batch leaf whose batch dimension cannot be split evenly over the devices.

    Attributes:
        path: The leaf's key path, e.g. ``"['x']"``.
        shape: The leaf's shape.
        batch_axis: The dimension asked to be split.
        parts: How many devices it was to be split over.

    Example:
        >>> from substrax.devices import BatchDimensionError
        >>> error = BatchDimensionError(path="['x']", shape=(12, 3), batch_axis=0, parts=8)
        >>> error.parts, "multiple of 8" in str(error)
        (8, True)
    """

    path: str
    shape: tuple[int, ...]
    batch_axis: int
    parts: int

    def _message(self) -> str:
        leaf = f"batch leaf {self.path}" if self.path else "the batch"
        where = f"{leaf} has shape {self.shape}"
        if self.batch_axis >= len(self.shape):
            return (
                f"{where}: no dimension {self.batch_axis} to split over {self.parts} devices; "
                "pass batch_axis= naming its batch dimension, or replicate it "
                "(replicate_across_devices)"
            )
        rows = self.shape[self.batch_axis]
        return (
            f"{where}: its {rows} rows on dimension {self.batch_axis} do not split evenly over "
            f"{self.parts} devices; make the batch size a multiple of {self.parts} (drop or pad "
            "the last rows)"
        )


class BatchDtypeError(_DevicesError, TypeError, kw_only=True):
    """A batch leaf jax cannot hold: a NumPy array of a non-numeric dtype, or a masked array.

    Or a 64-bit leaf (int64, uint64, float64) whose values do not fit the 32-bit type jax gives
    it while ``jax_enable_x64`` is off. String, bytes and object arrays are not this error: they
    pass through as strings do.

    Attributes:
        path: The leaf's key path, e.g. ``"['when']"``.
        dtype: The leaf's dtype, e.g. ``"datetime64[s]"``.
        masked: The leaf is a ``numpy.ma.MaskedArray`` (whose mask jax would drop).
        low: A 64-bit leaf's smallest (finite) value, when it does not fit ``narrow``.
        high: Its largest (finite) value.
        narrow: The 32-bit dtype jax would give it, e.g. ``"int32"``.

    Example:
        >>> from substrax.devices import BatchDtypeError
        >>> error = BatchDtypeError(path="['when']", dtype="datetime64[s]")
        >>> isinstance(error, TypeError), "['when']" in str(error)
        (True, True)
    """

    path: str
    dtype: str
    masked: bool = False
    low: float | None = None
    high: float | None = None
    narrow: str | None = None

    def _message(self) -> str:
        leaf = f"batch leaf {self.path}" if self.path else "the batch (one array)"
        if self.narrow is not None:
            return (
                f"{leaf} is {self.dtype} with values from {self.low} to "
                f"{self.high}, which the {self.narrow} jax would give it cannot hold "
                "(jax_enable_x64 is off, so jax keeps 32 bits and would change them silently); "
                "enable 64-bit values (JAX_ENABLE_X64=1 before jax starts, or "
                "jax.config.update('jax_enable_x64', True)), or cast the leaf to a type that "
                "holds them"
            )
        if self.masked:
            return (
                f"{leaf} is a numpy masked array ({self.dtype}), whose mask a jax "
                "array cannot keep; pass the data filled (array.filled(0)) and the mask "
                "(numpy.ma.getmaskarray(array)) as two leaves"
            )
        return (
            f"{leaf} has dtype {self.dtype}, which a jax array cannot hold; "
            "convert it to a numeric or bool dtype (e.g. datetime64 to int64 with .astype), or "
            "keep it out of the batch"
        )


class BatchSizeMismatchError(_DevicesError, ValueError, kw_only=True):
    """Two leaves of one batch with different sizes along the batch dimension.

    Attributes:
        path: The first leaf's key path.
        size: Its size along ``batch_axis``.
        other_path: The leaf that differs.
        other_size: Its size along ``batch_axis``.
        batch_axis: The batch dimension.

    Example:
        >>> from substrax.devices import BatchSizeMismatchError
        >>> error = BatchSizeMismatchError(
        ...     path="['x']", size=16, other_path="['y']", other_size=8, batch_axis=0
        ... )
        >>> str(error).startswith("batch leaves ['x'] and ['y'] differ")
        True
    """

    template = (
        "batch leaves {path} and {other_path} differ on dimension {batch_axis}: {size} rows "
        "against {other_size}; every array leaf of a batch needs the same batch size (replicate "
        "a leaf that is not per-row with replicate_across_devices)"
    )

    path: str
    size: int
    other_path: str
    other_size: int
    batch_axis: int
