import io
import logging

import pytest

from substrax.runtime import configure_entry_point_logging


@pytest.fixture
def root_logger():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def test_installs_one_named_handler_and_replaces_it(root_logger):
    other = logging.NullHandler()
    root_logger.addHandler(other)
    first, second = io.StringIO(), io.StringIO()
    configure_entry_point_logging(stream=first)
    handler = configure_entry_point_logging(
        logging.DEBUG, stream=second, fmt="%(levelname)s %(message)s"
    )
    named = [h for h in root_logger.handlers if h.get_name() == handler.get_name()]
    assert named == [handler]
    assert other in root_logger.handlers  # never force=True
    assert root_logger.level == logging.DEBUG
    logging.getLogger("substrax.demo").debug("hello")
    assert first.getvalue() == ""
    assert second.getvalue() == "DEBUG hello\n"
    root_logger.removeHandler(other)
