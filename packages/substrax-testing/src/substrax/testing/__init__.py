"""substrax.testing: the pytest plugin, fresh-interpreter runs, trace and compile counting (not built yet)."""
