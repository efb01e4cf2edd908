"""substrax.checkpoint: a step-addressed orbax checkpoint store that restores onto any topology (not built yet)."""
