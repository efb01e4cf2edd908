import pickle

import pytest

from substrax.runtime import (
    RuntimeConfigurationError,
    XlaFlagConflictError,
    merge_xla_flags,
    parse_xla_flags,
)


def test_parse_keeps_order_and_bare_flags():
    assert parse_xla_flags(" --b=2  --a --c=x=y ") == {"--b": "2", "--a": None, "--c": "x=y"}


def test_parse_empty():
    assert parse_xla_flags("") == {}


def test_parse_same_duplicate_is_one_entry():
    assert parse_xla_flags("--a=1 --a=1 --b --b") == {"--a": "1", "--b": None}


@pytest.mark.parametrize("token", ["a=1", "-a", "--", "--=1", "---a"])
def test_parse_malformed_token(token):
    with pytest.raises(ValueError, match="malformed"):
        parse_xla_flags(f"--ok {token}")


def test_parse_conflicting_duplicate():
    with pytest.raises(XlaFlagConflictError) as info:
        parse_xla_flags("--a=1 --a=2")
    assert (info.value.flag, info.value.existing, info.value.requested) == ("--a", "1", "2")


def test_conflict_error_message_and_attributes():
    error = XlaFlagConflictError("--a", "1", "2")
    assert str(error) == "XLA flag --a is already set to '1' and was requested as '2'"
    assert isinstance(error, RuntimeConfigurationError)
    assert isinstance(error, RuntimeError)
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own error, round-tripped
    assert (copy.flag, copy.existing, copy.requested) == ("--a", "1", "2")


def test_conflict_between_bare_and_valued_flag():
    with pytest.raises(XlaFlagConflictError) as info:
        merge_xla_flags("--a", ["--a=2"])
    assert info.value.existing is None
    assert info.value.requested == "2"
    assert "a bare flag" in str(info.value)
    with pytest.raises(XlaFlagConflictError):
        merge_xla_flags("--a", ["--a=false"])


@pytest.mark.parametrize("same", ["--a=true", "--a=True", "--a=1"])
def test_a_bare_flag_and_its_true_value_are_one_as_xla_reads_them(same):
    """Hostile finding: ``--flag`` and ``--flag=true`` were refused as a conflict."""
    assert merge_xla_flags("--a", [same]) == "--a"
    assert parse_xla_flags(f"{same} --a") == {"--a": same.removeprefix("--a=")}


def test_merge_appends_and_keeps_positions():
    assert merge_xla_flags("--b=1 --a=2", ["--c", "--a=2"]) == "--b=1 --a=2 --c"


def test_merge_into_empty():
    assert merge_xla_flags("", ["--x=1", "--y"]) == "--x=1 --y"


def test_merge_never_replaces_a_value():
    with pytest.raises(XlaFlagConflictError, match="--a is already set to '1'"):
        merge_xla_flags("--a=1", ["--a=2"])


def test_merge_refuses_malformed_requested_flag():
    with pytest.raises(ValueError, match="malformed"):
        merge_xla_flags("", ["xla_dump_to=/tmp"])


def test_merge_refuses_a_bare_string():
    with pytest.raises(TypeError, match="iterable of flags"):
        merge_xla_flags("", "--a=1")


def test_flags_that_are_no_str_are_refused_by_type():
    with pytest.raises(TypeError, match="XLA_FLAGS must be a str"):
        parse_xla_flags(None)


def test_a_quoted_value_is_read_as_xla_reads_it():
    # `--xla_dump_to="/tmp/a b"` was refused as malformed, though XLA's own parser takes it
    flags = parse_xla_flags('--xla_dump_to="/tmp/a b"  --b=\'x "y\' --c="q\\"d\\\\" --d=e"f')
    assert flags == {"--xla_dump_to": "/tmp/a b", "--b": 'x "y', "--c": 'q"d\\', "--d": 'e"f'}
    assert parse_xla_flags('--a="1" --a=1') == {"--a": "1"}  # the same value, quoted or not


def test_a_quoted_value_merges_and_is_written_back_quoted():
    merged = merge_xla_flags('--xla_dump_to="/tmp/a b"', ["--xla_dump_to='/tmp/a b'", "--x"])
    assert merged == '--xla_dump_to="/tmp/a b" --x'
    merged = merge_xla_flags("", ['--a="x \\"y\\""', "--b='it is'"])
    assert merged == '--a="x \\"y\\"" --b="it is"'
    assert parse_xla_flags(merged) == {"--a": 'x "y"', "--b": "it is"}  # reads back the same
    with pytest.raises(XlaFlagConflictError, match="'/tmp/a b'"):
        merge_xla_flags('--xla_dump_to="/tmp/a b"', ["--xla_dump_to=/tmp/c"])


@pytest.mark.parametrize(
    ("text", "says"),
    [('--a="x y', "never closes"), ("--a='x", "never closes"), ('--a="x"y', "after the quoted")],
)
def test_a_quote_xla_would_read_otherwise_is_refused(text, says):
    with pytest.raises(ValueError, match=says):
        parse_xla_flags(f"--ok {text}")
