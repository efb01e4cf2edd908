"""substrax.optim: data-parallel placement, fast spmd train steps, collectives and optax assembly (not built yet)."""
