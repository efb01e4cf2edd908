"""The pytest plugin, driven through pytester: markers, usage errors, isolation, the x64 guard."""

import textwrap

import jax
import pytest

from substrax.testing import restored_jax_config


PLUGIN_CONFTEST = 'pytest_plugins = ["substrax.testing.pytest_plugin"]\n'
STRICT = ("-p", "no:randomly", "-p", "no:cacheprovider", "-W", "error", "--strict-markers")


def _project(pytester: pytest.Pytester, source: str) -> None:
    pytester.makeconftest(PLUGIN_CONFTEST)
    pytester.makepyfile(test_inner=textwrap.dedent(source))


MARKED = """
    import threading

    import jax
    import jax.numpy as jnp
    import pytest

    def test_runtime_is_set_before_jax_loads():
        assert jax.default_backend() == "cpu"
        assert jax.device_count() == 8

    @pytest.mark.devices(8)
    def test_enough_devices():
        pass

    @pytest.mark.devices(9)
    def test_too_many_devices():
        raise AssertionError("must be skipped")

    @pytest.mark.devices(1, kind="gpu")
    def test_needs_a_gpu():
        raise AssertionError("must be skipped")

    @pytest.mark.devices(count=2, kind="cpu")
    def test_cpu_devices_by_kind():
        pass

    @pytest.mark.accelerator
    def test_needs_an_accelerator():
        raise AssertionError("must be skipped")

    @pytest.mark.accelerator(kind="tpu")
    def test_needs_a_tpu():
        raise AssertionError("must be skipped")

    @pytest.mark.x64
    def test_x64_is_thread_local():
        assert jnp.ones(2).dtype == jnp.float64
        seen = []
        other = threading.Thread(target=lambda: seen.append(jnp.ones(2).dtype))
        other.start()
        other.join()
        assert seen == [jnp.float32]

    def test_x64_is_off_outside_the_marker():
        assert jnp.ones(2).dtype == jnp.float32

    def test_fixtures(output_dir, rng_key, rngs):
        import os
        assert os.environ["AVITAI_OUTPUT_DIR"] == str(output_dir)
        assert output_dir.name == "outputs" and output_dir.is_dir()
        assert jax.dtypes.issubdtype(rng_key.dtype, jax.dtypes.prng_key)
        assert {"default", "params", "dropout", "sample"} <= set(vars(rngs))
"""


@pytest.mark.usefixtures("child_processes")
def test_markers_skip_with_reasons_in_a_fresh_session(pytester, monkeypatch):
    for name in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS", "SUBSTRAX_TEST_DEVICE_COUNT"):
        monkeypatch.delenv(name, raising=False)
    _project(pytester, MARKED)
    result = pytester.runpytest_subprocess(*STRICT, "-rs")
    result.assert_outcomes(passed=6, skipped=4)
    result.stdout.fnmatch_lines_random(
        [
            "substrax test runtime: JAX_PLATFORMS=cpu JAX_NUM_CPU_DEVICES=8",
            "SKIPPED * needs 9 device(s); visible: 8 cpu",
            "SKIPPED * needs 1 gpu device(s); visible: 8 cpu",
            "SKIPPED * needs an accelerator; default backend: cpu",
            "SKIPPED * needs a tpu accelerator; default backend: cpu",
        ]
    )
    # the skip is reported at the test's own location
    result.stdout.fnmatch_lines_random(["SKIPPED [[]1[]] test_inner.py:*: needs 9 device(s)*"])


@pytest.mark.usefixtures("child_processes")
def test_a_device_count_already_set_is_kept(pytester, monkeypatch):
    monkeypatch.setenv("JAX_NUM_CPU_DEVICES", "4")
    monkeypatch.delenv("SUBSTRAX_TEST_DEVICE_COUNT", raising=False)
    _project(
        pytester,
        """
        import jax
        import pytest

        @pytest.mark.devices(5)
        def test_five():
            pass

        def test_count():
            assert jax.device_count() == 4
        """,
    )
    result = pytester.runpytest_subprocess(*STRICT, "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * needs 5 device(s); visible: 4 cpu"])


@pytest.mark.usefixtures("child_processes")
def test_a_malformed_device_count_variable_is_a_usage_error(pytester, monkeypatch):
    monkeypatch.setenv("SUBSTRAX_TEST_DEVICE_COUNT", "eight")
    _project(pytester, "def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess(*STRICT)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*substrax test runtime: SUBSTRAX_TEST_DEVICE_COUNT='eight'*"])


@pytest.mark.usefixtures("child_processes")
def test_a_session_that_never_imports_jax_does_not_load_it(pytester):
    pytester.makeconftest(
        PLUGIN_CONFTEST
        + "import sys\n\n"
        + "def pytest_unconfigure():\n"
        + "    print('jax loaded:', 'jax' in sys.modules)\n"
    )
    pytester.makepyfile(
        test_inner=textwrap.dedent(
            """
            def test_plain(output_dir):
                assert output_dir.is_dir()

            def test_other():
                pass
            """
        )
    )
    result = pytester.runpytest_subprocess(*STRICT, "-s")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["jax loaded: False"])


@pytest.mark.parametrize(
    ("marker", "problem"),
    [
        ("devices", "is missing count; use @pytest.mark.devices(count, kind=None)"),
        ("devices(True)", "needs a device count: count=True must be an integer >= 1, not bool"),
        ("devices('2')", "needs a device count: count='2' must be an integer >= 1, not str"),
        ("devices(0)", "needs a device count: count=0 must be an integer >= 1"),
        ("devices(2, kind='quantum')", "names an unknown device kind 'quantum'*"),
        ("devices(2, kinds='gpu')", "got an unknown argument 'kinds'*"),
        ("devices(2, count=3)", "got 'count' twice; use @pytest.mark.devices(count, kind=None)"),
        (
            "devices(1, 'gpu', 3)",
            "got 3 positional argument(s) but takes at most 2 argument(s) (count, kind); "
            "use @pytest.mark.devices(count, kind=None)",
        ),
        ("accelerator(kind='cpu')", "names cpu, which is not an accelerator"),
        ("accelerator(kind=3)", "names an unknown device kind 3*"),
        ("accelerator(gpus=1)", "got an unknown argument 'gpus'; use *.accelerator(kind=None)"),
        ("x64(1)", "got 1 positional argument(s) but takes none; use @pytest.mark.x64"),
        ("x64(on=True)", "got an unknown argument 'on'; use @pytest.mark.x64"),
    ],
)
def test_malformed_markers_are_usage_errors(pytester, marker, problem):
    _project(
        pytester,
        f"""
        import pytest

        @pytest.mark.{marker}
        def test_marked():
            pass
        """,
    )
    result = pytester.runpytest_inprocess(*STRICT)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: test_inner.py::test_marked: @pytest.mark.* {problem}"])


def test_a_test_that_changes_global_config_fails_after_restoring(pytester):
    _project(
        pytester,
        """
        import jax

        def test_changes_config():
            jax.config.update("jax_debug_nans", True)
            jax.config.update("jax_debug_infs", True)

        def test_context_managers_are_fine():
            with jax.debug_nans(True):
                assert jax.config.jax_debug_nans

        def test_sees_the_restored_value():
            assert not jax.config.jax_debug_nans
        """,
    )
    result = pytester.runpytest_inprocess(*STRICT, "-p", "no:randomly")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_changes_config*",
            "*the test changed jax's global config: jax_debug_infs, jax_debug_nans (now restored)*",
        ]
    )
    assert not jax.config.jax_debug_nans


def test_a_context_manager_left_entered_fails_that_test_alone(pytester):
    pytester.makeconftest(PLUGIN_CONFTEST)
    pytester.makepyfile(
        test_a=textwrap.dedent(
            """
            import jax
            import jax.numpy as jnp

            def test_leaks_x64():
                jax.enable_x64(True).__enter__()  # entered, never exited

            def test_leaks_a_precision():
                jax.default_matmul_precision("highest").__enter__()

            def test_later_tests_start_clean():
                assert jnp.ones(1).dtype == jnp.float32
                assert jax.config.jax_default_matmul_precision is None
            """
        ),
        test_b=textwrap.dedent(
            """
            import jax
            import jax.numpy as jnp
            import pytest

            @pytest.fixture(scope="module")
            def wide_x64():  # a wider fixture's context manager, exited in its teardown
                with jax.enable_x64(True):
                    yield

            def test_uses_it(wide_x64):
                assert jnp.ones(1).dtype == jnp.float64
            """
        ),
    )
    with restored_jax_config() as changed:
        result = pytester.runpytest_inprocess(*STRICT)
    assert changed == []
    result.assert_outcomes(passed=4, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leaks_x64*",
            "the test changed jax's global config: jax_enable_x64 (thread-local) (now restored); "
            "a (thread-local) change is a jax config context manager entered and never exited "
            "(e.g. jax.enable_x64(True).__enter__()): use it in a `with` block",
            "*ERROR at teardown of test_leaks_a_precision*",
            "the test changed jax's global config: jax_default_matmul_precision (thread-local) "
            "(now restored)*",
        ]
    )
    assert "outside any test" not in result.stdout.str()


def test_a_wider_fixture_that_leaves_the_config_changed_fails_its_teardown(pytester):
    pytester.makeconftest(
        PLUGIN_CONFTEST
        + textwrap.dedent(
            """
            import jax
            import pytest

            @pytest.fixture(scope="session")
            def log_compiles():  # changes the config for its tests, and sets it back
                jax.config.update("jax_log_compiles", True)
                yield
                jax.config.update("jax_log_compiles", False)
            """
        )
    )
    pytester.makepyfile(
        test_a=textwrap.dedent(
            """
            import jax
            import pytest

            @pytest.fixture(scope="module")
            def nan_debugging():
                jax.config.update("jax_debug_nans", True)  # never set back
                yield

            @pytest.fixture(scope="module")
            def messy_teardown():
                yield
                jax.config.update("jax_debug_infs", True)  # changed after the tests

            def test_uses_both(nan_debugging, log_compiles):
                assert jax.config.jax_debug_nans and jax.config.jax_log_compiles

            def test_still_sees_them(nan_debugging, log_compiles):
                assert jax.config.jax_debug_nans and jax.config.jax_log_compiles

            def test_asks_for_the_messy_one(messy_teardown):
                pass
            """
        ),
        test_b=textwrap.dedent(
            """
            import jax

            def test_next_module_starts_clean():
                assert not jax.config.jax_debug_nans
            """
        ),
    )
    result = pytester.runpytest_inprocess(*STRICT, "-p", "no:randomly")
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_asks_for_the_messy_one*",
            "*the module-scoped fixture 'nan_debugging' changed jax's global config and did not "
            "set it back: jax_debug_nans (now restored)*",
            "*ERROR at setup of test_next_module_starts_clean*",
            "*jax's global config was changed outside any test and fixture setup*: "
            "jax_debug_infs (now restored)*",
        ]
    )
    assert not jax.config.jax_debug_nans
    assert not jax.config.jax_debug_infs
    assert not jax.config.jax_log_compiles


def test_enabling_x64_at_import_stops_the_session(pytester, monkeypatch):
    monkeypatch.delenv("JAX_ENABLE_X64", raising=False)
    _project(
        pytester,
        """
        import jax

        jax.config.update("jax_enable_x64", True)

        def test_anything():
            pass
        """,
    )
    with restored_jax_config() as changed:
        result = pytester.runpytest_inprocess(*STRICT)
    assert changed == ["jax_enable_x64"]
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: jax_enable_x64 was switched on while collecting tests*"])


def test_x64_for_the_whole_run_is_allowed(pytester, monkeypatch):
    monkeypatch.setenv("JAX_ENABLE_X64", "1")
    _project(
        pytester,
        """
        import jax

        jax.config.update("jax_enable_x64", True)

        def test_anything():
            pass
        """,
    )
    with restored_jax_config():
        result = pytester.runpytest_inprocess(*STRICT)
    result.assert_outcomes(passed=1)


def test_markers_are_registered_for_strict_markers(pytester):
    pytester.makeconftest(PLUGIN_CONFTEST)
    result = pytester.runpytest_inprocess("--markers")
    result.stdout.fnmatch_lines_random(
        [
            "@pytest.mark.x64:*",
            "@pytest.mark.devices(count, kind=None):*",
            "@pytest.mark.accelerator(kind=None):*",
        ]
    )


@pytest.mark.x64
def test_x64_marker_in_this_session():
    assert jax.numpy.ones(1).dtype == jax.numpy.float64


def test_this_session_runs_on_cpu():
    assert jax.default_backend() == "cpu"


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("SUBSTRAX_TEST_DEVICE_CONT", " (did you mean SUBSTRAX_TEST_DEVICE_COUNT?)"),
        ("SUBSTRAX_TEST_PLATFORMS", " (did you mean SUBSTRAX_TEST_JAX_PLATFORMS?)"),
        ("SUBSTRAX_TEST_SEED", ""),
    ],
)
def test_a_misspelled_variable_is_a_usage_error_naming_the_one_meant(monkeypatch, name, hint):
    from substrax.testing import pytest_plugin

    monkeypatch.setenv(name, "4")
    with pytest.raises(pytest.UsageError) as raised:
        pytest_plugin._configure_runtime()  # refused before anything is applied
    assert str(raised.value) == (
        f"substrax test runtime: {name}='4' is not a variable the plugin reads{hint}; it reads "
        "SUBSTRAX_TEST_DEVICE_COUNT and SUBSTRAX_TEST_JAX_PLATFORMS: rename it, or unset it"
    )
