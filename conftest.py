"""The project's own suites run under substrax's opt-in pytest plugin (and may use pytester)."""

pytest_plugins = ["substrax.testing.pytest_plugin", "pytester"]
