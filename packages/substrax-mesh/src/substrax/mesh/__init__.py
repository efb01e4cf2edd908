"""substrax.mesh: device meshes with auto axes, logical-axis rules and sharding strategies (not built yet)."""
