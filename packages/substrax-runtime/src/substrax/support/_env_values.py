"""Whether jax reads two values of one of its environment variables as the same setting."""

import os


# The words jax reads as a boolean variable's true and false (its ``bool_env``).
_TRUE_WORDS = frozenset({"1", "t", "true", "y", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "f", "false", "n", "no", "off"})


def reads_false(text: str) -> bool:
    """Whether jax reads ``text`` as a boolean variable's false (``0``, ``off``, ``False``...).

    Example:
        >>> from substrax.support import reads_false
        >>> reads_false(" Off "), reads_false("")
        (True, False)
    """
    return text.strip().lower() in _FALSE_WORDS


def env_values_agree(variable: str, given: str, rendered: str) -> bool:
    """Whether jax reads ``given`` as the value ``rendered`` of ``variable``.

    ``1`` is ``true``, ``" 8"`` is ``8``, ``cpu, cuda`` is ``cpu,cuda``, and two spellings of
    one path are one directory.

    Example:
        >>> from substrax.support import env_values_agree
        >>> env_values_agree("JAX_ENABLE_X64", "1", "true"), env_values_agree("JAX_PLATFORMS", "cpu", "tpu")
        (True, False)
    """
    text = given.strip()
    if text == rendered:
        return True
    if rendered in {"true", "false"}:
        return text.lower() in (_TRUE_WORDS if rendered == "true" else _FALSE_WORDS)
    if variable == "JAX_PLATFORMS":
        return ",".join(p.strip() for p in text.split(",") if p.strip()) == rendered
    if variable == "JAX_COMPILATION_CACHE_DIR":
        return os.path.normpath(text) == os.path.normpath(rendered)
    try:
        return float(text) == float(rendered)
    except ValueError:
        return False
