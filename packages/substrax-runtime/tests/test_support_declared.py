"""StructuredError (errors declared by fields) and Closeable (``with`` closes), from substrax.support."""

import logging
import pickle
import sys
import types
from pathlib import Path

import pytest

from substrax.support import Closeable, PicklableError, StructuredError


class _StoreError(StructuredError, RuntimeError, kw_only=True):
    template = "store {directory} failed"
    directory: Path


class _StepGoneError(_StoreError, kw_only=True):
    template = "step {step} is not in {directory}; saved: {saved}"
    step: int
    saved: tuple[int, ...] = ()


class _MissingFileError(StructuredError, FileNotFoundError):
    template = "no file at {path}"
    path: Path


class _ShownError(StructuredError, ValueError):
    value: object

    def _message(self) -> str:
        return f"value {self.value!r} is {'empty' if not self.value else 'refused'}"


def test_fields_become_the_constructor_and_the_message() -> None:
    error = _StepGoneError(directory=Path("/runs/a"), step=3, saved=(1, 2))
    assert (error.step, error.saved, error.directory) == (3, (1, 2), Path("/runs/a"))
    assert str(error) == "step 3 is not in /runs/a; saved: (1, 2)"
    assert error.args == (str(error),)
    assert isinstance(error, _StoreError | RuntimeError | PicklableError)
    assert repr(error) == "_StepGoneError('step 3 is not in /runs/a; saved: (1, 2)')"


def test_keyword_only_fields_refuse_positions_and_missing_fields_are_named() -> None:
    with pytest.raises(TypeError):
        _StepGoneError(Path("/runs/a"), 3)  # pyright: ignore[reportCallIssue]
    with pytest.raises(TypeError, match="step"):
        _StepGoneError(directory=Path("/runs/a"))  # pyright: ignore[reportCallIssue]


def test_a_message_method_replaces_the_template() -> None:
    assert str(_ShownError("")) == "value '' is empty"
    assert str(_ShownError(7)) == "value 7 is refused"


def test_errors_compare_by_identity_like_any_exception() -> None:
    one, two = _ShownError(1), _ShownError(1)
    assert one != two
    assert len({one, two}) == 2


@pytest.mark.parametrize(
    "error",
    [
        _StepGoneError(directory=Path("/runs/a"), step=3),
        _MissingFileError(Path("/runs/a/x")),
        _ShownError([1, 2]),
    ],
    ids=["inherited-fields", "os-error", "message-method"],
)
def test_a_pickled_error_comes_back_whole(error: Exception) -> None:
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
    assert type(copy) is type(error)
    assert (str(copy), copy.args, vars(copy)) == (str(error), error.args, vars(error))


def test_an_os_error_keeps_its_builtin_attributes() -> None:
    error = _MissingFileError(Path("/x"))
    assert isinstance(error, FileNotFoundError)
    assert (error.errno, error.filename, str(error)) == (None, None, "no file at /x")


class _Handle(Closeable):
    def __init__(self, *, fail: bool = False) -> None:
        self.closed = 0
        self.fail = fail

    def close(self) -> None:
        self.closed += 1
        if self.fail:
            raise OSError("disk gone")


def test_leaving_a_block_closes_once() -> None:
    with _Handle() as handle:
        assert handle.closed == 0
    assert handle.closed == 1


def test_a_failure_to_close_surfaces_when_the_block_succeeded() -> None:
    handle = _Handle(fail=True)
    with pytest.raises(OSError, match="disk gone"), handle:
        pass


def test_the_blocks_own_error_wins_over_a_failure_to_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    handle = _Handle(fail=True)
    with caplog.at_level(logging.WARNING), pytest.raises(KeyError, match="step"), handle:
        raise KeyError("step")
    assert handle.closed == 1
    assert "closing _Handle after KeyError failed as well" in caplog.text
    assert "disk gone" in caplog.text


def test_a_list_field_is_kept_as_a_tuple_the_caller_cannot_edit() -> None:
    known = ["data", "model"]
    error = _ShownError(known)
    known.append("pipe")
    assert error.value == ("data", "model")
    assert str(error) == "value ('data', 'model') is refused"


class _NamedImportError(StructuredError, ImportError, kw_only=True):
    template = "no {name}"
    name: str
    path: str


class _ExitError(StructuredError, SystemExit):
    template = "quitting with {code}"
    code: int


def test_fields_named_like_the_builtins_own_attributes_keep_their_values() -> None:
    error = _NamedImportError(name="wandb", path="/site/wandb")
    assert (error.name, error.path, str(error)) == ("wandb", "/site/wandb", "no wandb")
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
    assert (copy.name, copy.path) == ("wandb", "/site/wandb")
    assert _ExitError(3).code == 3


def test_a_missing_extra_names_the_package_as_import_error_does() -> None:
    from substrax.support import MissingExtraError

    error = MissingExtraError(
        "WandbLogger", "wandb.sdk", distribution="substrax-tracking", extra="wandb"
    )
    assert error.name == "wandb"
    assert pickle.loads(pickle.dumps(error)).name == "wandb"  # noqa: S301 - our own bytes


class _PartError(StructuredError, public_module="fake_public_part"):
    """A package's private base: it keeps its own module, the errors below it take the public one."""


class PartMissingError(_PartError, LookupError):
    template = "no part {name!r}"
    name: str


class _PartStateError(PartMissingError):
    """A private class below the base: no name of the public module, it keeps its own."""


class PartGoneError(_PartStateError):
    template = "part {name!r} is gone"


def test_the_errors_below_a_private_base_show_its_public_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _PartError.__module__ == _PartStateError.__module__ == __name__
    assert PartMissingError.__module__ == PartGoneError.__module__ == "fake_public_part"
    public = types.ModuleType("fake_public_part")
    public.PartMissingError = PartMissingError  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_public_part", public)
    copy = pickle.loads(pickle.dumps(PartMissingError("x")))  # noqa: S301 - our own bytes
    assert (type(copy), copy.name, str(copy)) == (PartMissingError, "x", "no part 'x'")


class _NoKeyError(StructuredError, KeyError):
    template = "no key {key!r}; known: {known}"
    key: str
    known: tuple[str, ...] = ()


def test_a_key_error_shows_its_message_as_written_not_quoted() -> None:
    error = _NoKeyError("a", ("b",))
    assert str(error) == "no key 'a'; known: ('b',)"
    assert error.args == (str(error),)
    assert str(pickle.loads(pickle.dumps(error))) == str(error)  # noqa: S301 - our own bytes


class _FlakyHook(_Handle):
    def _block_failed(self, error: BaseException) -> None:
        raise RuntimeError(f"cannot record {error!r}")


def test_close_runs_even_when_recording_the_failure_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    handle = _FlakyHook()
    with caplog.at_level(logging.WARNING), pytest.raises(KeyError), handle:
        raise KeyError("step")
    assert handle.closed == 1
    assert "could not record the block's KeyError" in caplog.text
