"""The metric JSONL and CSV of a FileLogger hold the same records once it opens them again.

A kill between the two files' writes leaves one a few records ahead of the other (the JSONL, which
is written first; the CSV on a full disk that refused the JSONL's lines). Each test leaves the
files as such a kill would, and opens a logger on them as a restarted (or resumed) run does.
"""

import csv
import json
import logging

import pytest

from substrax.tracking import FileLogger


NAMES = ("loss", 'a "quoted", name', "acc")


def values(step: int) -> dict[str, float]:
    special = (float("nan"), float("inf"), -0.0)[step % 3]
    return {"loss": 1.0 / (step + 1), NAMES[1]: special, "acc": step * 1e-7}


def first_run(log_dir, steps):
    """The first attempt: each name at each step (and one without a step), then closed."""
    with FileLogger("run", log_dir) as logger:
        logger.log_scalar("loss", 7.0)
        for step in range(steps):
            logger.log_scalars(values(step), step=step)


def records(log_dir):
    """The JSONL's records and the CSV's rows, each as ``(time, step, name, repr(value))``."""
    jsonl = []
    for line in (log_dir / "run.metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        number = float(record["value"])  # "NaN", "Infinity", "-Infinity" as floats
        jsonl.append((record["time"], record["step"], record["name"], repr(number)))
    with (log_dir / "run.metrics.csv").open(newline="") as file:
        rows = list(csv.reader(file))
    assert rows[0] == ["time", "step", "name", "value"]
    table = [(float(t), int(s) if s else None, n, repr(float(v))) for t, s, n, v in rows[1:]]
    return jsonl, table


def cut(path, lines, *, torn=0):
    """Drop the last ``lines`` lines of ``path``, and ``torn`` bytes of the line before them."""
    kept = path.read_bytes().splitlines(keepends=True)[: -lines or None]
    path.write_bytes(b"".join(kept)[: len(b"".join(kept)) - torn])


@pytest.mark.parametrize("resume_step", [None, 58])
@pytest.mark.parametrize("torn", [0, 5])
def test_rows_the_csv_lacks_are_added_from_the_jsonl(tmp_path, caplog, resume_step, torn):
    first_run(tmp_path, 60)
    whole, _ = records(tmp_path)
    cut(tmp_path / "run.metrics.csv", 4, torn=torn)  # a kill after the JSONL's write
    # the rows of step 59 and the last of step 58: that one lacks after a resume from step 58 too
    with caplog.at_level(logging.WARNING), FileLogger("run", tmp_path, resume_step=resume_step):
        pass
    jsonl, table = records(tmp_path)
    assert table == jsonl
    assert jsonl == [r for r in whole if resume_step is None or r[1] is None or r[1] <= 58]
    assert "run.metrics.csv lacked the last" in caplog.text


def test_the_rows_added_come_before_those_logged_next(tmp_path):
    first_run(tmp_path, 5)
    cut(tmp_path / "run.metrics.csv", 2)
    with FileLogger("run", tmp_path) as logger:
        logger.log_scalars(values(5), step=5)
    jsonl, table = records(tmp_path)
    assert table == jsonl
    assert [step for _, step, name, _ in table if name == "loss"] == [None, 0, 1, 2, 3, 4, 5]


def test_a_csv_of_its_header_only_or_missing_is_rebuilt(tmp_path):
    first_run(tmp_path, 3000)  # far more than one block of the reads from a file's end
    csv_path = tmp_path / "run.metrics.csv"
    cut(csv_path, len(csv_path.read_text().splitlines()) - 1)
    with FileLogger("run", tmp_path):
        pass
    jsonl, table = records(tmp_path)
    assert len(jsonl) == 1 + 3 * 3000
    assert table == jsonl
    csv_path.unlink()
    with FileLogger("run", tmp_path):
        pass
    assert records(tmp_path) == (jsonl, jsonl)


def test_many_rows_lacking_are_added_in_order(tmp_path):
    first_run(tmp_path, 3000)
    cut(tmp_path / "run.metrics.csv", 2500)  # lines held in several blocks
    with FileLogger("run", tmp_path):
        pass
    jsonl, table = records(tmp_path)
    assert table == jsonl


def test_records_the_jsonl_lacks_are_added_from_the_csv(tmp_path):
    first_run(tmp_path, 60)
    whole, _ = records(tmp_path)
    cut(tmp_path / "run.metrics.jsonl", 7, torn=3)  # the JSONL's lines refused (a full disk)
    with FileLogger("run", tmp_path):
        pass
    jsonl, table = records(tmp_path)
    assert jsonl == table == whole


def test_files_that_do_not_end_alike_get_the_csv_rewritten_from_the_jsonl(tmp_path, caplog):
    first_run(tmp_path, 10)
    csv_path = tmp_path / "run.metrics.csv"
    rows = csv_path.read_text().splitlines(keepends=True)
    rows[-1] = rows[-1].replace(",acc,", ",edited,")  # a row the JSONL does not hold
    csv_path.write_text("".join(rows))
    with caplog.at_level(logging.WARNING), FileLogger("run", tmp_path):
        pass
    jsonl, table = records(tmp_path)
    assert table == jsonl
    assert len(jsonl) == 1 + 3 * 10
    assert "the CSV is rewritten from the JSONL" in caplog.text


def test_files_that_agree_are_left_alone(tmp_path, caplog):
    first_run(tmp_path, 10)
    before = {p.name: p.read_bytes() for p in tmp_path.glob("run.metrics.*")}
    with caplog.at_level(logging.WARNING), FileLogger("run", tmp_path, resume_step=9):
        pass
    assert {p.name: p.read_bytes() for p in tmp_path.glob("run.metrics.*")} == before
    assert not caplog.text
