"""Backends found through the substrax.compute.backends entry-point group; handles and the store."""

import dataclasses
import importlib.metadata
from datetime import UTC, datetime

import pytest

from substrax.compute import (
    ComputeBackend,
    RunHandle,
    RunState,
    RunStore,
    UnknownBackendError,
    backend_names,
    backend_state_dir,
    default_state_dir,
    load_backend,
)
from substrax.compute._backend import new_run_id


def test_built_in_backends_are_registered():
    assert backend_names() == ["local", "modal", "skypilot"]
    backend = load_backend("local", {"state_dir": "/tmp/x"})
    assert isinstance(backend, ComputeBackend)
    assert backend.name == "local"


def test_entry_point_group_is_where_the_built_ins_are_registered():
    from substrax.compute import ENTRY_POINT_GROUP

    assert ENTRY_POINT_GROUP == "substrax.compute.backends"
    registered = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    assert sorted(entry.name for entry in registered) == backend_names()


def _discover(*entries):
    def discover(group):
        return [importlib.metadata.EntryPoint(name, value, group) for name, value in entries]

    return discover


def test_unknown_backend_lists_the_registered_ones():
    with pytest.raises(UnknownBackendError) as caught:
        load_backend("nowhere", discover=_discover(("local", "substrax.compute:LocalBackend")))
    assert caught.value.name == "nowhere"
    assert caught.value.known == ("local",)
    assert isinstance(caught.value, LookupError)


def test_factory_that_returns_no_backend_is_refused():
    with pytest.raises(TypeError, match="is not a ComputeBackend"):
        load_backend("bad", discover=_discover(("bad", "builtins:dict")))


def test_run_state_finality():
    assert [s for s in RunState if s.is_final] == [
        RunState.SUCCEEDED,
        RunState.FAILED,
        RunState.CANCELLED,
    ]


def test_store_round_trip_newest_first_and_unknown_run(tmp_path):
    store = RunStore(tmp_path)
    older = RunHandle(
        run_id="a-1",
        backend="local",
        job="a",
        project="/p",
        submitted_at=datetime(2026, 1, 1, tzinfo=UTC),
        settings={"state_dir": "/s"},
    )
    newer = dataclasses.replace(older, run_id="a-2", submitted_at=datetime(2026, 1, 2, tzinfo=UTC))
    store.save(older)
    store.save(newer)
    assert store.load("a-1") == older
    assert [h.run_id for h in store.handles()] == ["a-2", "a-1"]
    with pytest.raises(KeyError, match="no run 'zzz'"):
        store.load("zzz")


def test_state_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("SUBSTRAX_STATE_DIR", str(tmp_path / "a"))
    assert default_state_dir() == tmp_path / "a"
    monkeypatch.delenv("SUBSTRAX_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir() == tmp_path / "xdg" / "substrax"
    assert RunStore().root == tmp_path / "xdg" / "substrax" / "compute" / "runs"


def test_run_ids():
    run_id = new_run_id("demo", now=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert run_id.startswith("demo-20260102T030405Z-")
    assert len(run_id) == len("demo-20260102T030405Z-") + 6


@pytest.mark.parametrize("bad", [3, ["/tmp/s"], {"path": "/tmp/s"}, True])
def test_backend_state_dir_refuses_a_setting_that_is_not_a_path_naming_it(bad):
    match = rf"setting=.* must be a state directory \(a str or a Path\), or None .*not {type(bad).__name__}"
    with pytest.raises(TypeError, match=match):
        backend_state_dir(bad, "local")


def test_backend_state_dir_takes_a_path_as_its_text(tmp_path):
    assert backend_state_dir(tmp_path / "s", "local") == backend_state_dir(
        str(tmp_path / "s"), "local"
    )
    assert backend_state_dir(str(tmp_path / "s"), "local") == (tmp_path / "s").resolve()
