"""PreemptionHandler(flush=...): the run's loggers are flushed before the preemption save."""

import signal

import numpy as np
import pytest

from substrax.checkpoint import OrbaxCheckpointStore, PreemptionHandler


class _Watched:
    def __init__(self, store, events):
        self._store = store
        self._events = events

    def save(self, step, items, **options):
        self._events.append(("save", step))
        return self._store.save(step, items, **options)

    def __getattr__(self, name):
        return getattr(self._store, name)


class _Logger:
    def __init__(self, events, fails=False):
        self._events = events
        self._fails = fails

    def flush(self):
        self._events.append(("flush",))
        if self._fails:
            raise RuntimeError("the logger is closed")


@pytest.mark.parametrize("fails", [False, True])
def test_the_preemption_save_flushes_the_loggers_first(store_dir, fails):
    events = []
    store = OrbaxCheckpointStore(store_dir)
    items = lambda: {"model": {"w": np.zeros(2)}}  # noqa: E731
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with PreemptionHandler(
            _Watched(store, events), flush=[_Logger(events, fails=fails)]
        ) as preemption:
            preemption.check(0, items)
            assert events == []  # no signal yet: nothing is flushed at a step boundary
            signal.raise_signal(signal.SIGTERM)
            with pytest.raises(SystemExit):
                preemption.check(1, items)
    finally:
        signal.signal(signal.SIGTERM, previous)  # after a save it keeps absorbing signals
    assert events == [("flush",), ("save", 1)]  # a flush that fails costs no checkpoint
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.list_steps() == [1]


def test_what_cannot_flush_is_refused_at_construction(store_dir):
    with OrbaxCheckpointStore(store_dir) as store, pytest.raises(TypeError, match="flush="):
        PreemptionHandler(store, flush=["not a logger"])
