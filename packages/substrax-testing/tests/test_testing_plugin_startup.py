"""The pytest plugin with jax imported early, imported first by a test, and under xdist."""

import textwrap

import pytest


PLUGIN_CONFTEST = 'pytest_plugins = ["substrax.testing.pytest_plugin"]\n'
STRICT = ("-p", "no:randomly", "-p", "no:cacheprovider", "-W", "error", "--strict-markers")
DEVICE_TESTS = """
    import jax
    import pytest

    def test_count():
        assert jax.device_count() == 8
        assert jax.default_backend() == "cpu"

    @pytest.mark.devices(4)
    def test_four():
        pass
"""


@pytest.fixture
def fresh_runtime(monkeypatch):
    for name in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS", "JAX_PLATFORMS", "SUBSTRAX_TEST_DEVICE_COUNT"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("child_processes", "fresh_runtime")
@pytest.mark.parametrize("order", ["before", "after"])
def test_a_conftest_that_imports_jax_still_gets_the_test_runtime(pytester, order):
    conftest = PLUGIN_CONFTEST + "import jax\n"
    pytester.makeconftest(conftest if order == "after" else "import jax\n" + PLUGIN_CONFTEST)
    pytester.makepyfile(test_inner=textwrap.dedent(DEVICE_TESTS))
    result = pytester.runpytest_subprocess(*STRICT, "-rs")
    result.assert_outcomes(passed=2)


SESSION_ENVIRONMENT = """
    import os

    from substrax.runtime import JaxRuntime
    from substrax.testing import run_python

    def test_the_session_environment():
        assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
        program = "import json, jax; print(json.dumps(jax.config.jax_enable_compilation_cache))"
        run = run_python(program, timeout=120, runtime=JaxRuntime(cpu_devices=2)).check()
        assert run.last_json() is False  # a child does not use the user's cache either
"""


@pytest.mark.usefixtures("child_processes", "fresh_runtime")
@pytest.mark.parametrize("jax_first", [False, True])
def test_the_session_preallocates_nothing_and_its_children_use_no_cache(
    pytester, monkeypatch, jax_first
):
    """A spec review: testing.md promises no GPU memory preallocation (nothing set it), and
    runtime.md no cache in a test session (a run_python child used the user's)."""
    for name in ("XLA_PYTHON_CLIENT_PREALLOCATE", "JAX_ENABLE_COMPILATION_CACHE"):
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest(("import jax\n" if jax_first else "") + PLUGIN_CONFTEST)
    pytester.makepyfile(test_inner=textwrap.dedent(SESSION_ENVIRONMENT))
    result = pytester.runpytest_subprocess(*STRICT)
    result.assert_outcomes(passed=1)


@pytest.mark.usefixtures("child_processes", "fresh_runtime")
def test_the_header_shows_the_runtime_set_in_the_config_of_a_jax_imported_first(
    pytester, monkeypatch
):
    """Hostile finding: it showed the variables jax read at import ("jax defaults", cuda)."""
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")  # inherited; the plugin moves jax onto cpu
    pytester.makeconftest("import jax\n" + PLUGIN_CONFTEST)
    pytester.makepyfile(test_inner=textwrap.dedent(DEVICE_TESTS))
    result = pytester.runpytest_subprocess(*STRICT)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "substrax test runtime: JAX_PLATFORMS=cpu JAX_NUM_CPU_DEVICES=8 "
            "(set in jax's config: jax was imported first)"
        ]
    )


@pytest.mark.usefixtures("child_processes", "fresh_runtime")
def test_a_conftest_that_starts_jax_backends_is_a_usage_error(pytester):
    pytester.makeconftest(PLUGIN_CONFTEST + "import jax\n\njax.numpy.zeros(1)\n")
    pytester.makepyfile(test_inner=textwrap.dedent(DEVICE_TESTS))
    result = pytester.runpytest_subprocess(*STRICT)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*jax's backends started before the substrax plugin configured them*into a fixture*"]
    )


@pytest.mark.usefixtures("child_processes", "fresh_runtime")
def test_a_config_change_by_the_test_that_first_imports_jax_fails_and_is_restored(
    pytester, monkeypatch
):
    monkeypatch.delenv("JAX_ENABLE_X64", raising=False)
    pytester.makeconftest(PLUGIN_CONFTEST)
    pytester.makepyfile(
        test_inner=textwrap.dedent(
            """
            def test_first_to_import_jax():
                import jax
                jax.config.update("jax_enable_x64", True)

            def test_next():
                import jax.numpy as jnp
                assert jnp.zeros(1).dtype == jnp.float32
            """
        )
    )
    result = pytester.runpytest_subprocess(*STRICT)
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        ["*the test changed jax's global config: jax_enable_x64 (now restored)*"]
    )


@pytest.mark.usefixtures("child_processes", "fresh_runtime")
@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "import pytest\n\n@pytest.mark.accelerator('cpu')\ndef test_m():\n    pass\n",
            "*test_m: @pytest.mark.accelerator('cpu') names cpu, which is not an accelerator",
        ),
        (
            "import jax\n\njax.config.update('jax_enable_x64', True)\n\ndef test_a():\n    pass\n",
            "*jax_enable_x64 was switched on while collecting tests*",
        ),
    ],
    ids=["malformed-marker", "x64-at-import"],
)
def test_usage_errors_reach_the_user_under_xdist(pytester, monkeypatch, source, message):
    monkeypatch.delenv("JAX_ENABLE_X64", raising=False)
    pytester.makeconftest(PLUGIN_CONFTEST)
    pytester.makepyfile(test_inner=source)
    result = pytester.runpytest_subprocess(*STRICT, "-n", "2")
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([message])
