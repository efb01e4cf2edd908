"""Which node of a failed multi-node local job failed first, from what each worker recorded.

Each worker writes ``node-<N>.failed-at`` in the run's directory when it sees its task fail
(when, and the task's status); the supervisor reads those records to name the node whose task
failed first, and to tell a task that stopped because a peer died (the peer watch's
``PEER_FAILURE_EXIT_CODE``) from one that failed on its own.
"""

import contextlib
import json
from pathlib import Path
from typing import NamedTuple

from substrax.runtime import PEER_FAILURE_EXIT_CODE


def failed_at(run_dir: Path, node: int) -> Path:
    """The record ``node``'s worker writes when its task fails (``FAILED_AT_ENV``)."""
    return run_dir / f"node-{node}.failed-at"


class NodeExit(NamedTuple):
    """A worker's exit, as the supervisor saw it."""

    code: int
    seen: float  # when the supervisor saw the worker exit (time.time())
    stopped: bool  # it had been sent STOP_SIGNAL by then


def blame(
    run_dir: Path, exits: dict[int, NodeExit], *, first_exit: tuple[int, int]
) -> tuple[int, int]:
    """The node that failed first, and its worker's exit status (its task's, if it was stopped).

    A failed node's time is when its worker saw its task fail (the record it wrote), else when
    its worker exited; a task that ended with ``PEER_FAILURE_EXIT_CODE`` stopped because a
    peer died (its peer watch said so) and comes after any other failure, whatever the times.
    A node that was stopped and left no record of a failed task is not a candidate.
    """
    order: dict[int, tuple[bool, float]] = {}
    status = {node: code for node, (code, _, _) in exits.items()}
    for node, (code, seen, stopped) in exits.items():
        if code == 0:
            continue
        try:
            record = json.loads(failed_at(run_dir, node).read_text())
            order[node] = (record["returncode"] == PEER_FAILURE_EXIT_CODE, float(record["time"]))
            if stopped and isinstance(record["returncode"], int):
                status[node] = record["returncode"]  # its task's, not the stopped worker's
        except (OSError, ValueError, KeyError, TypeError):  # none: its worker died, or stopped
            if not stopped:
                order[node] = (False, seen)
    node = min(order, key=order.__getitem__, default=first_exit[0])
    return node, status[node]


def stopped_for_a_peer(run_dir: Path, node: int, nodes: int) -> bool:
    """Whether ``node``'s task stopped because a peer died, and no node's own failure is on record.

    A peer whose task raised may still be ending then (a process that raised lingers while jax
    shuts down, and its worker records its failure only once it ended): the supervisor gives
    the others the job's grace to end on their own, so that such a peer is the one named.
    """
    codes: dict[int, object] = {}
    for other in range(nodes):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            codes[other] = json.loads(failed_at(run_dir, other).read_text())["returncode"]
    return codes.get(node) == PEER_FAILURE_EXIT_CODE and all(
        code == PEER_FAILURE_EXIT_CODE for code in codes.values()
    )
