"""substrax.runtime: process and xla settings, device detection, output directories, rng keys, shared types and json records (not built yet)."""
