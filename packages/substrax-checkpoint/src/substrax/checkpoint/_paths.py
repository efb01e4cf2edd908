"""Where a run's checkpoints go."""

from pathlib import Path


def resolve_checkpoint_dir(checkpoint_dir: Path | None, run_dir: Path | None) -> Path:
    """An explicit ``checkpoint_dir`` wins; otherwise ``run_dir / "checkpoints"``. Creates nothing.

    Example:
        >>> resolve_checkpoint_dir(None, Path("/runs/a"))
        PosixPath('/runs/a/checkpoints')
        >>> resolve_checkpoint_dir(Path("/ckpt"), Path("/runs/a"))
        PosixPath('/ckpt')
    """
    if checkpoint_dir is not None:
        return Path(checkpoint_dir)
    if run_dir is not None:
        return Path(run_dir) / "checkpoints"
    raise ValueError(
        "neither checkpoint_dir nor run_dir is set; pass the checkpoint directory or the run's "
        "output directory (e.g. substrax.artifacts.resolve_output_dir(...).path)"
    )
