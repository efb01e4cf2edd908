"""Console output and logger messages go through stdlib logging (caplog, handlers, filters)."""

import gc
import io
import logging
import subprocess
import sys
import textwrap

import pytest

from substrax.tracking import ConsoleLogger, FileLogger, MultiLogger


def test_console_lines_are_records_of_the_named_logger(caplog):
    out = io.StringIO()
    with ConsoleLogger("cap", stream=out) as logger:
        logger.log_scalars({"loss": 0.25}, step=3)
        logger.log_hyperparams({"lr": 0.1})
    [scalars, params] = [r for r in caplog.records if r.name == "substrax.tracking.run.cap"]
    assert (scalars.levelno, scalars.getMessage()) == (
        logging.INFO,
        "step       3 | loss       0.25",
    )
    assert params.getMessage() == 'hyperparams {"lr": 0.1}'
    assert out.getvalue().splitlines() == [
        "[cap] step       3 | loss       0.25",
        '[cap] hyperparams {"lr": 0.1}',
    ]


def test_the_convenience_methods_log_to_the_named_logger(caplog, tmp_path):
    caplog.set_level(logging.DEBUG, logger="substrax.tracking.run.files")
    with FileLogger("files", tmp_path) as logger:
        logger.debug("batch %d", 1)
        logger.info("epoch %d done", 2)
        logger.warning("loss went up")
        logger.error("nan at step %s", 7)
        logger.critical("giving up")
        logger.log(logging.INFO, "custom %s", "level")
    records = [r for r in caplog.records if r.name == "substrax.tracking.run.files"]
    assert [(r.levelname, r.getMessage()) for r in records] == [
        ("DEBUG", "batch 1"),
        ("INFO", "epoch 2 done"),
        ("WARNING", "loss went up"),
        ("ERROR", "nan at step 7"),
        ("CRITICAL", "giving up"),
        ("INFO", "custom level"),
    ]
    assert {r.funcName for r in records} == {"test_the_convenience_methods_log_to_the_named_logger"}


def test_messages_print_on_the_console_once_and_only_on_process_0(caplog):
    out, elsewhere = io.StringIO(), io.StringIO()
    console = ConsoleLogger("shown", stream=out)
    multi = MultiLogger([console], name="shown")  # the same stdlib logger
    multi.info("from the fan-out")
    console.warning("from the console")
    ConsoleLogger("shown", stream=elsewhere, process_index=1).info("not on process 1")
    multi.close()
    assert out.getvalue().splitlines() == [
        "[shown] from the fan-out",
        "[shown] WARNING: from the console",
    ]
    assert elsewhere.getvalue() == ""
    assert "not on process 1" not in caplog.text


def test_a_filter_of_the_application_drops_console_lines(caplog):
    out = io.StringIO()
    logger = ConsoleLogger("filtered", stream=out)
    logger.python_logger.addFilter(lambda record: "secret" not in record.getMessage())
    try:
        logger.log_text("note", "secret", step=0)
        logger.log_text("note", "public", step=0)
    finally:
        logger.close()
        logger.python_logger.filters.clear()
    assert out.getvalue() == "[filtered] step       0 | note: public\n"
    assert "secret" not in caplog.text
    assert "public" in caplog.text


def test_a_higher_level_prints_messages_but_no_values():
    out = io.StringIO()
    with ConsoleLogger("quiet", stream=out, level=logging.WARNING) as logger:
        logger.log_scalar("loss", 1.0, step=0)
        logger.info("not shown")
        logger.warning("shown")
    assert out.getvalue() == "[quiet] WARNING: shown\n"


def test_a_level_the_application_set_on_a_parent_logger_is_respected():
    out = io.StringIO()
    with ConsoleLogger("parent-level", stream=out) as logger:  # sets its own logger to INFO
        logger.info("before")
    parent = logging.getLogger("substrax")
    previous = parent.level
    parent.setLevel(logging.WARNING)
    try:
        with ConsoleLogger("parent-level", stream=out) as logger:
            logger.log_scalar("loss", 1.0, step=0)
            logger.info("hidden")
            logger.warning("shown")
        with ConsoleLogger("parent-level-new", stream=out) as logger:
            logger.info("hidden too")
    finally:
        parent.setLevel(previous)
    assert out.getvalue().splitlines() == ["[parent-level] before", "[parent-level] WARNING: shown"]


def test_the_handler_stays_on_the_named_logger_and_leaves_on_close():
    root_handlers = list(logging.getLogger().handlers)
    logger = ConsoleLogger("scoped", stream=io.StringIO())
    assert len(logger.python_logger.handlers) == 1
    assert logging.getLogger().handlers == root_handlers
    assert logging.getLogger("substrax").handlers == []
    logger.close()
    assert logger.python_logger.handlers == []


@pytest.mark.usefixtures("child_processes")
def test_without_logging_set_up_lines_go_to_stdout_and_once_through_the_app_handlers():
    child = textwrap.dedent(
        """
        import logging, sys
        from substrax.tracking import ConsoleLogger

        logger = ConsoleLogger("plain")
        logger.log_scalar("loss", 0.5, step=1)
        logger.info("hello")
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s|%(message)s")
        logger.log_scalar("loss", 0.25, step=2)  # now the application's handler shows it
        logger.close()
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[plain] step       1 | loss        0.5", "[plain] hello"]
    assert result.stderr.splitlines() == [
        "substrax.tracking.run.plain|step       2 | loss       0.25"
    ]


@pytest.mark.usefixtures("child_processes")
def test_create_logger_prints_on_stdout_though_its_file_log_has_a_handler(tmp_path):
    child = textwrap.dedent(
        f"""
        from substrax.tracking import create_logger

        with create_logger("both", {str(tmp_path)!r}) as logger:
            logger.log_scalar("loss", 0.5, step=1)
            logger.info("hello")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[both] step       1 | loss        0.5", "[both] hello"]
    assert (tmp_path / "both.log").read_text().count("hello") == 1


def test_a_console_logger_dropped_unclosed_prints_nothing_more():
    old = io.StringIO()
    ConsoleLogger("dropped", stream=old).log_scalar("loss", 1.0, step=0)
    gc.collect()
    new = io.StringIO()
    with ConsoleLogger("dropped", stream=new) as logger:
        assert len(logger.python_logger.handlers) == 1  # the dropped logger's handler is gone
        logger.log_scalar("loss", 2.0, step=1)
        logger.info("hello")
    assert len(old.getvalue().splitlines()) == 1
    assert new.getvalue().splitlines() == [
        "[dropped] step       1 | loss          2",
        "[dropped] hello",
    ]


def test_two_console_loggers_of_one_name_print_their_own_messages(caplog):
    """Hostile finding: b.info(...) went to a's stream, the first handler of the name."""
    first, second = io.StringIO(), io.StringIO()
    with ConsoleLogger("twin", stream=first) as a, ConsoleLogger("twin", stream=second) as b:
        b.info("from b")
        a.info("from a")
    assert first.getvalue().splitlines() == ["[twin] from a"]
    assert second.getvalue().splitlines() == ["[twin] from b"]
    (record,) = (r for r in caplog.records if r.getMessage() == "from b")
    assert record.funcName == "test_two_console_loggers_of_one_name_print_their_own_messages"
