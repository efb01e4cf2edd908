"""The key fixtures come from one seed, 42 unless the run gives --substrax-seed."""

import textwrap

import pytest


PLUGIN_CONFTEST = 'pytest_plugins = ["substrax.testing.pytest_plugin"]\n'
STRICT = ("-p", "no:randomly", "-p", "no:cacheprovider", "-W", "error", "--strict-markers")

KEYS = """
    import json

    import jax


    def test_keys(rng_seed, rng_key, rngs, request):
        assert jax.dtypes.issubdtype(rng_key.dtype, jax.dtypes.prng_key)
        assert {"default", "params", "dropout", "sample"} <= set(vars(rngs))
        record = {
            "seed": rng_seed,
            "key": jax.random.key_data(rng_key).tolist(),
            "params": jax.random.key_data(rngs.params()).tolist(),
        }
        print("KEYS", json.dumps(record))
"""


def _keys(pytester: pytest.Pytester, *args: str) -> dict:
    import json

    pytester.makeconftest(PLUGIN_CONFTEST)
    pytester.makepyfile(test_inner=textwrap.dedent(KEYS))
    result = pytester.runpytest_subprocess(*STRICT, "-s", *args)
    result.assert_outcomes(passed=1)
    (line,) = [line for line in result.outlines if "KEYS " in line]
    return {"header": result.outlines, **json.loads(line.partition("KEYS ")[2])}


@pytest.mark.usefixtures("child_processes")
def test_the_seed_is_42_unless_one_option_changes_every_key_fixture(pytester):
    import jax

    from substrax.rng import rngs_from_seed

    default = _keys(pytester)
    assert default["seed"] == 42
    assert default["key"] == jax.random.key_data(jax.random.key(42)).tolist()
    streams = ("default", "params", "dropout", "sample")
    expected = rngs_from_seed(42, streams).params()
    assert default["params"] == jax.random.key_data(expected).tolist()
    assert "substrax seed: 42 (change it with --substrax-seed N)" in default["header"]

    other = _keys(pytester, "--substrax-seed", "7")
    assert other["seed"] == 7
    assert other["key"] == jax.random.key_data(jax.random.key(7)).tolist()
    assert other["params"] == jax.random.key_data(rngs_from_seed(7, streams).params()).tolist()
    assert "substrax seed: 7 (change it with --substrax-seed N)" in other["header"]


@pytest.mark.parametrize("value", ["-1", "seven", "4294967296", "99999999999999999999"])
def test_a_bad_seed_is_a_usage_error(pytester, value):
    pytester.makeconftest(PLUGIN_CONFTEST)
    pytester.makepyfile(test_inner="def test_nothing():\n    pass\n")
    result = pytester.runpytest_inprocess(*STRICT, "--substrax-seed", value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*--substrax-seed takes an integer from 0 to 4294967295, not '{value}'*"]
    )


def test_the_largest_seed_gives_its_own_keys(pytester):
    pytester.makeconftest(PLUGIN_CONFTEST)
    pytester.makepyfile(
        test_inner=textwrap.dedent(
            """
            import jax

            def test_key(rng_seed, rng_key, rngs):
                assert rng_seed == 2**32 - 1
                assert jax.random.key_data(rng_key).tolist() == [0, 2**32 - 1]
            """
        )
    )
    result = pytester.runpytest_inprocess(*STRICT, "--substrax-seed", "4294967295")
    result.assert_outcomes(passed=1)
