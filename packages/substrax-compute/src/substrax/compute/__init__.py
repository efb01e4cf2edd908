"""substrax.compute: a project's jobs run on this machine, modal or skypilot's clouds (not built yet)."""
