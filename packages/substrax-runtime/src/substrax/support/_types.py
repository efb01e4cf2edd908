"""Arguments of the wrong type, refused with one wording for every part."""


def check_type[T](name: str, value: object, kind: type[T], wanted: str) -> T:
    """``value`` if it is a ``kind``; else a TypeError naming ``name``, ``wanted`` and the value.

    For arguments a user passes where a wrong type would fail deep inside, unnamed.

    Example:
        >>> from substrax.support import check_type
        >>> check_type("config", {"lr": 0.1}, tuple, "a tuple of settings")
        Traceback (most recent call last):
        ...
        TypeError: config must be a tuple of settings, not dict {'lr': 0.1}
    """
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be {wanted}, not {type(value).__name__} {value!r:.60}")
    return value
