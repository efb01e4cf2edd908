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
