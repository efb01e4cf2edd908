"""The project's own suites run under substrax's opt-in pytest plugin."""

pytest_plugins = ["substrax.testing.pytest_plugin"]
