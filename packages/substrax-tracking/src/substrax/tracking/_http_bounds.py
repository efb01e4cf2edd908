"""Bounds on MLflow's own HTTP calls while substrax talks to an MLflow server.

MLflow reads ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` and ``MLFLOW_HTTP_REQUEST_TIMEOUT`` from the
environment at every request (mlflow 2.x and 3.x); a client cannot be given its own values. Its
defaults (7 retries with backoff, 120 s per request) make one call to a dead server take minutes.
While an MLflow logger or replay of an ``http(s)`` server is open, each variable the user has
not set is set here (no retries inside MLflow, since substrax retries itself; ``timeout``
seconds per request), and removed again when the last one closes. A value the user set is
never changed: substrax's own bounds (construction, ``close``, ``replay --timeout``) hold
whatever MLflow does.

Example:
    >>> import os
    >>> from substrax.tracking._http_bounds import acquire, release
    >>> acquire("http://127.0.0.1:5000", 10.0)
    True
    >>> "MLFLOW_HTTP_REQUEST_MAX_RETRIES" in os.environ or "set by the user"
    True
    >>> release()
    >>> acquire("sqlite:///x.db", 10.0)  # a local store needs no bounds
    False
"""

from __future__ import annotations

import math
import os
import threading


__all__ = ["DEFAULT_TIMEOUT", "acquire", "release"]

DEFAULT_TIMEOUT = 10.0

_MAX_RETRIES = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
_TIMEOUT = "MLFLOW_HTTP_REQUEST_TIMEOUT"


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.set_here: dict[str, str] = {}


_STATE = _State()


def acquire(tracking_uri: str, timeout: float) -> bool:
    """Bound MLflow's HTTP calls for an ``http(s)`` ``tracking_uri``; return whether it did.

    Each ``acquire`` that returned True is matched by one :func:`release`.
    """
    if not tracking_uri.startswith(("http://", "https://")):
        return False
    with _STATE.lock:
        _STATE.users += 1
        defaults = {_MAX_RETRIES: "0", _TIMEOUT: str(max(1, math.ceil(timeout)))}
        for name, value in defaults.items():
            if name not in os.environ:
                os.environ[name] = value
                _STATE.set_here[name] = value
    return True


def release() -> None:
    """Undo one :func:`acquire`; the last one removes the variables it set (if still unchanged)."""
    with _STATE.lock:
        _STATE.users = max(0, _STATE.users - 1)
        if _STATE.users == 0:
            for name, value in _STATE.set_here.items():
                if os.environ.get(name) == value:
                    del os.environ[name]
            _STATE.set_here.clear()
