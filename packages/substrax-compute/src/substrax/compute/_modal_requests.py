"""Requests to Modal that ``ModalBackend.status`` makes: each bounded in time, each error sorted.

Modal's SDK retries a connection for about a minute and takes no deadline for it, so each
request runs in a daemon thread and is given up after ``REQUEST_SECONDS``. An error that means
Modal gave no answer (no connection, no token, a refusal, a server error) is told apart from the
way a function call ended, so that an unreachable API never reads as a failed run.
"""

import queue
import threading
from collections.abc import Callable
from typing import Any, cast

from ._backend import RunState
from ._errors import BackendRequestError


REQUEST_SECONDS = 30.0
"""How long ``status`` waits for each answer from Modal."""


def within[T](seconds: float, request: Callable[[], T], *, operation: str) -> T:
    """``request()``, given up after ``seconds`` (it finishes unwatched in a daemon thread).

    Raises:
        BackendRequestError: No answer came in time.
    """
    answers: queue.Queue[tuple[bool, object]] = queue.Queue(maxsize=1)

    def ask() -> None:
        try:
            answers.put((True, request()))
        except BaseException as error:  # handed to the caller, raised there
            answers.put((False, error))

    threading.Thread(target=ask, name="substrax-modal-request", daemon=True).start()
    try:
        answered, value = answers.get(timeout=seconds)
    except queue.Empty:
        cause = f"Modal did not answer in {seconds:g} s"
        raise BackendRequestError("modal", operation, cause) from None
    if not answered:
        raise cast("BaseException", value)
    return cast("T", value)


def unanswered(modal: Any) -> tuple[type[BaseException], ...]:  # noqa: ANN401 - the SDK
    """Modal's errors for a request that got no answer about the run: not the run's outcome."""
    errors = modal.exception
    return (
        errors.ConnectionError, errors.ClientClosed, errors.AuthError,
        errors.PermissionDeniedError, errors.NotFoundError, errors.InvalidError,
        errors.InternalError, errors.ServiceError, errors.ResourceExhaustedError,
        errors.UnimplementedError, errors.TimeoutError,
    )  # fmt: skip


def call_outcome(call: Any, modal: Any) -> RunState | None:  # noqa: ANN401 - the SDK's objects
    """The state ``call.get(timeout=0)`` tells, or None: the call returned, or its output expired.

    RUNNING while the call runs, FAILED or CANCELLED once it ended so; when it returned, the
    run's manifest decides.

    Raises:
        modal.exception.Error: One of ``unanswered(modal)``: Modal did not answer.
    """
    errors = modal.exception
    try:
        call.get(timeout=0)
    except TimeoutError:  # the builtin one: no output yet
        return RunState.RUNNING
    except errors.OutputExpiredError:
        return None
    except errors.FunctionTimeoutError:
        return RunState.FAILED
    except unanswered(modal):
        raise
    except errors.InputCancellation:
        return RunState.CANCELLED
    except Exception:  # the worker function's own error, raised remotely
        return RunState.FAILED
    return None
