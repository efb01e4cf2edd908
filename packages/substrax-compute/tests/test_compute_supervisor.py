"""The supervisor's blame: which node of a failed multi-node job failed first, from its records.

Each worker writes when its task failed and its status; the supervisor reads those files after
the workers exit. A record can be damaged (a full disk, a worker of an older release that wrote
only the time): such a node counts by when its worker exited, or not at all when it was stopped.
"""

import json

import pytest

from substrax.compute._supervisor import _blame, _Exit, _failed_at
from substrax.runtime import PEER_FAILURE_EXIT_CODE


def _record(run_dir, node, when, returncode):
    _failed_at(run_dir, node).write_text(json.dumps({"time": when, "returncode": returncode}))


def test_the_task_that_failed_first_is_blamed_with_its_tasks_status_when_stopped(tmp_path):
    exits = {0: _Exit(1, seen=10.0, stopped=False), 1: _Exit(-15, seen=11.0, stopped=True)}
    _record(tmp_path, 0, 5.0, 1)
    _record(tmp_path, 1, 4.0, 3)
    assert _blame(tmp_path, exits, first_exit=(0, 1)) == (1, 3)


def test_a_task_that_stopped_for_a_dead_peer_comes_after_any_other_failure(tmp_path):
    exits = {0: _Exit(75, seen=10.0, stopped=False), 1: _Exit(1, seen=12.0, stopped=False)}
    _record(tmp_path, 0, 1.0, PEER_FAILURE_EXIT_CODE)
    _record(tmp_path, 1, 9.0, 1)
    assert _blame(tmp_path, exits, first_exit=(0, 75)) == (1, 1)


@pytest.mark.parametrize(
    "damaged",
    ['{"time": 4.0, "retur', "4.0", '{"time": "soon", "returncode": 1}', "[]", ""],
    ids=["truncated", "older-release", "bad-time", "not-an-object", "empty"],
)
def test_a_damaged_record_counts_by_the_workers_exit(tmp_path, damaged):
    exits = {0: _Exit(1, seen=10.0, stopped=False), 1: _Exit(2, seen=8.0, stopped=False)}
    _record(tmp_path, 0, 9.0, 1)
    _failed_at(tmp_path, 1).write_text(damaged)
    assert _blame(tmp_path, exits, first_exit=(1, 2)) == (1, 2)  # its exit (8.0) came first


def test_a_stopped_node_with_a_damaged_record_is_never_blamed(tmp_path):
    exits = {0: _Exit(1, seen=10.0, stopped=False), 1: _Exit(-15, seen=11.0, stopped=True)}
    _failed_at(tmp_path, 1).write_text('{"time": 1.0')
    assert _blame(tmp_path, exits, first_exit=(0, 1)) == (0, 1)


def test_without_any_record_the_first_exit_is_blamed(tmp_path):
    exits = {0: _Exit(1, seen=10.0, stopped=False), 1: _Exit(-15, seen=11.0, stopped=True)}
    assert _blame(tmp_path, exits, first_exit=(0, 1)) == (0, 1)
