"""``python -m substrax.tracking replay``: a spool file, or every spool of a log directory."""

import json

import pytest

from substrax.tracking import _sink
from substrax.tracking._cli import main
from substrax.tracking._records import Record


class Sink:
    """A run of a backend we control: down, or taking what it is sent."""

    def __init__(self, target):
        self.run = target["run"]
        self.received = []
        self.finished = False

    def target(self):
        return {"backend": "test", "run": self.run}

    def deliver(self, records):
        if self.run in DOWN:
            raise ConnectionError("server gone")
        self.received.extend(records)

    def is_permanent(self, error):
        del error
        return False

    def finish(self):
        self.finished = True


DOWN: set[str] = set()
MADE: dict[str, Sink] = {}


@pytest.fixture(autouse=True)
def backend(monkeypatch):
    DOWN.clear()
    MADE.clear()

    def build(target):
        return MADE.setdefault(target["run"], Sink(target))

    monkeypatch.setitem(_sink._FACTORIES, "test", build)


def write_spool(path, run, steps):
    target = {"backend": "test", "run": run}
    lines = []
    for step in steps:
        record = Record(kind="scalars", step=step, time=1.0, payload={"values": {"loss": 0.5}})
        lines.append(json.dumps({"target": target, "record": record.to_json()}) + "\n")
    path.write_text("".join(lines))


def test_a_log_directory_replays_every_spool_in_it_and_nothing_else(tmp_path, capsys):
    write_spool(tmp_path / "a.spool.jsonl", "a", range(3))
    write_spool(tmp_path / "b.spool.jsonl", "b", range(2))
    (tmp_path / "a.metrics.jsonl").write_text("{}\n")  # the file log beside them: not a spool
    (tmp_path / "nested").mkdir()
    write_spool(tmp_path / "nested" / "c.spool.jsonl", "c", range(1))  # another run's directory
    assert main(["replay", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["log_dir"] == str(tmp_path)
    assert [(s["spool"], s["delivered"], s["remaining"]) for s in out["spools"]] == [
        (str(tmp_path / "a.spool.jsonl"), 3, 0),
        (str(tmp_path / "b.spool.jsonl"), 2, 0),
    ]
    assert sorted(MADE) == ["a", "b"]
    assert [r.step for r in MADE["a"].received] == [0, 1, 2]
    assert MADE["a"].finished
    assert MADE["b"].finished
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.metrics.jsonl", "nested"]
    assert main(["replay", str(tmp_path)]) == 0  # again: nothing left, nothing sent twice
    assert capsys.readouterr().out == (
        f"no spool in {tmp_path}: nothing to replay here; these directories below it hold "
        "spools: ['nested']; replay each run's log directory\n"
    )
    assert [r.step for r in MADE["a"].received] == [0, 1, 2]


def test_a_log_directory_with_a_backend_down_delivers_the_rest_and_exits_1(tmp_path, capsys):
    write_spool(tmp_path / "a.spool.jsonl", "a", range(2))
    write_spool(tmp_path / "b.spool.jsonl", "b", range(2))
    DOWN.add("a")
    assert main(["replay", str(tmp_path), "--timeout", "30"]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "a.spool.jsonl: delivered 0, remaining 2",
        "b.spool.jsonl: delivered 2, remaining 0",
    ]
    [line] = err.splitlines()
    assert line.startswith(f"python -m substrax.tracking: error: 2 records stay in {tmp_path}")
    assert "ConnectionError: server gone" in line
    assert (tmp_path / "a.spool.jsonl").exists()
    assert not (tmp_path / "b.spool.jsonl").exists()
    DOWN.clear()
    assert main(["replay", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "a.spool.jsonl: delivered 2, remaining 0\n"


def test_a_path_that_does_not_exist_is_named_as_a_spool_or_a_log_directory(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "gone")]) == 2
    assert capsys.readouterr().err == (
        f"python -m substrax.tracking: error: '{tmp_path / 'gone'}' does not exist; pass a spool "
        "file (the <log_dir>/<name>.spool.jsonl path that the logger's warning named) or a log "
        "directory\n"
    )


def test_sync_is_replay_by_another_name_and_sends_nothing_twice(tmp_path, capsys):
    write_spool(tmp_path / "a.spool.jsonl", "a", range(3))
    assert main(["sync", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "a.spool.jsonl: delivered 3, remaining 0\n"
    assert main(["sync", str(tmp_path)]) == 0  # idempotent: the spool emptied
    assert [r.step for r in MADE["a"].received] == [0, 1, 2]


def test_a_folder_of_runs_names_the_run_directories_that_hold_spools(tmp_path, capsys):
    """A second-pass review: `sync runs` said "every record was delivered" of runs/run1's spool."""
    (tmp_path / "run, 1").mkdir()
    (tmp_path / "proj" / "run2" / "logs").mkdir(parents=True)  # two levels down (third pass)
    write_spool(tmp_path / "run, 1" / "a.spool.jsonl", "a", range(2))
    write_spool(tmp_path / "proj" / "run2" / "logs" / "b.spool.jsonl", "b", range(2))
    assert main(["sync", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "these directories below it hold spools: ['proj/run2/logs', 'run, 1']" in out
    assert "every record was delivered" not in out
    assert main(["sync", str(tmp_path), "--json"]) == 0
    below = json.loads(capsys.readouterr().out)["spools_below"]
    assert below == ["proj/run2/logs", "run, 1"]
    assert (tmp_path / "run, 1" / "a.spool.jsonl").exists()
