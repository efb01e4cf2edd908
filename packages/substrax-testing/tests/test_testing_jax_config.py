"""restored_jax_config: changes inside the block are undone and named."""

import jax
import pytest

from substrax.testing import restored_jax_config


def test_changes_are_restored_and_named():
    with restored_jax_config() as changed:
        jax.config.update("jax_debug_nans", True)
        jax.config.update("jax_log_compiles", True)
        assert changed == []
    assert changed == ["jax_debug_nans", "jax_log_compiles"]
    assert not jax.config.jax_debug_nans
    assert not jax.config.jax_log_compiles


def test_a_change_set_back_inside_the_block_is_not_reported():
    with restored_jax_config() as changed:
        jax.config.update("jax_debug_nans", True)
        jax.config.update("jax_debug_nans", False)
    assert changed == []


def test_values_are_restored_when_the_block_raises():
    def change_then_fail():
        with restored_jax_config():
            jax.config.update("jax_debug_infs", True)
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        change_then_fail()
    assert not jax.config.jax_debug_infs


def test_thread_local_context_managers_are_not_changes():
    with restored_jax_config() as changed, jax.enable_x64(True):
        assert jax.numpy.ones(1).dtype == jax.numpy.float64
    assert changed == []


def test_a_context_manager_left_entered_is_undone_and_named():
    with restored_jax_config() as changed:
        jax.config.update("jax_debug_nans", True)
        jax.enable_x64(True).__enter__()  # entered, never exited
        jax.transfer_guard_host_to_device("disallow").__enter__()  # one with a runtime hook
    assert changed == [
        "jax_debug_nans",
        "jax_enable_x64 (thread-local)",
        "jax_transfer_guard_host_to_device (thread-local)",
    ]
    assert jax.numpy.ones(1).dtype == jax.numpy.float32
    assert jax.config.jax_transfer_guard_host_to_device is None
    assert jax.device_put(jax.numpy.zeros(1) + 1).shape == (1,)
    jax.device_put(1.0)  # the runtime's guard is lifted too: this transfer is allowed
    assert not jax.config.jax_debug_nans


def test_an_override_that_was_there_before_the_block_is_kept():
    with jax.enable_x64(True):
        with restored_jax_config() as changed:
            jax.enable_x64(False).__enter__()
        assert changed == ["jax_enable_x64 (thread-local)"]
        assert jax.numpy.ones(1).dtype == jax.numpy.float64
    assert jax.numpy.ones(1).dtype == jax.numpy.float32


def test_an_option_that_cannot_be_set_back_is_named_not_called_restored(monkeypatch):
    def change_then_refuse_updates():
        with restored_jax_config():
            jax.config.update("jax_debug_nans", True)
            monkeypatch.setattr(jax.config, "update", lambda *_: None)

    with pytest.raises(ValueError, match=r"could not be set back: jax_debug_nans still differ"):
        change_then_refuse_updates()
    monkeypatch.undo()
    assert jax.config.jax_debug_nans
    jax.config.update("jax_debug_nans", False)


def test_a_fixture_that_changes_a_global_value_leaves_the_expected_override_alone():
    from substrax.testing._jax_config import ConfigWatch, snapshot_jax_config

    with restored_jax_config():
        watch = ConfigWatch()
        watch.baseline()
        with jax.enable_x64(True):  # an override around the fixture's setup, not its change
            before = snapshot_jax_config()
            jax.config.update("jax_enable_x64", True)  # the fixture's change: the global value
            watch.set_up(1, before)
        assert watch.restore() == ([], [])  # expected: the global value now, no override
        assert watch.torn_down(1) == (["jax_enable_x64"], [])
        assert watch.restore() == ([], [])
        assert not jax.config.jax_enable_x64
