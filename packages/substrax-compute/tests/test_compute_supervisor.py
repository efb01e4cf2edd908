"""The supervisor's blame: which node of a failed multi-node job failed first, from its records.

Each worker writes when its task failed and its status; the supervisor reads those files after
the workers exit. A record can be damaged (a full disk, a worker of an older release that wrote
only the time): such a node counts by when its worker exited, or not at all when it was stopped.
"""

import json

import pytest

from substrax.compute._blame import NodeExit, blame, failed_at, stopped_for_a_peer
from substrax.runtime import PEER_FAILURE_EXIT_CODE


def _record(run_dir, node, when, returncode):
    failed_at(run_dir, node).write_text(json.dumps({"time": when, "returncode": returncode}))


def test_the_task_that_failed_first_is_blamed_with_its_tasks_status_when_stopped(tmp_path):
    exits = {0: NodeExit(1, seen=10.0, stopped=False), 1: NodeExit(-15, seen=11.0, stopped=True)}
    _record(tmp_path, 0, 5.0, 1)
    _record(tmp_path, 1, 4.0, 3)
    assert blame(tmp_path, exits, first_exit=(0, 1)) == (1, 3)


def test_a_task_that_stopped_for_a_dead_peer_comes_after_any_other_failure(tmp_path):
    exits = {0: NodeExit(75, seen=10.0, stopped=False), 1: NodeExit(1, seen=12.0, stopped=False)}
    _record(tmp_path, 0, 1.0, PEER_FAILURE_EXIT_CODE)
    _record(tmp_path, 1, 9.0, 1)
    assert blame(tmp_path, exits, first_exit=(0, 75)) == (1, 1)


@pytest.mark.parametrize(
    "damaged",
    ['{"time": 4.0, "retur', "4.0", '{"time": "soon", "returncode": 1}', "[]", ""],
    ids=["truncated", "older-release", "bad-time", "not-an-object", "empty"],
)
def test_a_damaged_record_counts_by_the_workers_exit(tmp_path, damaged):
    exits = {0: NodeExit(1, seen=10.0, stopped=False), 1: NodeExit(2, seen=8.0, stopped=False)}
    _record(tmp_path, 0, 9.0, 1)
    failed_at(tmp_path, 1).write_text(damaged)
    assert blame(tmp_path, exits, first_exit=(1, 2)) == (1, 2)  # its exit (8.0) came first


def test_a_stopped_node_with_a_damaged_record_is_never_blamed(tmp_path):
    exits = {0: NodeExit(1, seen=10.0, stopped=False), 1: NodeExit(-15, seen=11.0, stopped=True)}
    failed_at(tmp_path, 1).write_text('{"time": 1.0')
    assert blame(tmp_path, exits, first_exit=(0, 1)) == (0, 1)


def test_without_any_record_the_first_exit_is_blamed(tmp_path):
    exits = {0: NodeExit(1, seen=10.0, stopped=False), 1: NodeExit(-15, seen=11.0, stopped=True)}
    assert blame(tmp_path, exits, first_exit=(0, 1)) == (0, 1)


def test_a_task_stopped_for_a_dead_peer_waits_for_its_peers_until_one_failed_on_its_own(tmp_path):
    """Hostile finding: a peer whose task raised lingers while jax shuts down; the supervisor
    stopped it at once when the peer watch's 75 came first, blamed the wrong node and recorded
    the raising task as cancelled. Until a failure of a node's own is on record, it waits."""
    _record(tmp_path, 0, 1.0, PEER_FAILURE_EXIT_CODE)
    assert stopped_for_a_peer(tmp_path, 0, nodes=3)
    _record(tmp_path, 2, 2.0, PEER_FAILURE_EXIT_CODE)
    assert stopped_for_a_peer(tmp_path, 0, nodes=3)
    _record(tmp_path, 1, 3.0, 1)  # the culprit is on record: the others are stopped at once
    assert not stopped_for_a_peer(tmp_path, 0, nodes=3)
    assert not stopped_for_a_peer(tmp_path, 1, nodes=3)


def test_a_failure_of_its_own_or_without_a_record_stops_the_peers_at_once(tmp_path):
    assert not stopped_for_a_peer(tmp_path, 0, nodes=2)  # a worker that died: no record
    _record(tmp_path, 0, 1.0, 3)
    assert not stopped_for_a_peer(tmp_path, 0, nodes=2)
