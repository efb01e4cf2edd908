"""Read back the scalar curves of a file log, and render them to PNG files and an HTML page."""

from __future__ import annotations

import html
import json
import logging
import os
from pathlib import Path

from substrax.support import require, write_atomically

from ._errors import FileLogValueError, NoFileLogError
from ._log_files import decode_number
from ._paths import file_part, safe_name


__all__ = ["plot_log_dir", "read_scalars"]

_logger = logging.getLogger(__name__)
_MARKERS_BELOW = 50  # a curve of fewer points shows each one
_PAGE = (
    "<!doctype html>\n<html><head><meta charset='utf-8'><title>{title}</title><style>"
    "body{{font-family:sans-serif}}figure{{display:inline-block;margin:8px}}</style>"
    "</head><body>\n<h1>{heading}</h1>\n{sections}\n</body></html>\n"
)


def read_scalars(path: str | os.PathLike[str]) -> dict[str, list[tuple[int, float]]]:
    r"""The ``(step, value)`` series of each metric in a ``*.metrics.jsonl`` file.

    A line without a step is numbered; one that is not JSON (cut short by a crash) is skipped.

    Raises:
        FileLogValueError: a line is JSON but not a metric, or is not UTF-8 text, or the first
            line is no JSON object (another file, such as the ``.metrics.csv``).

    Example:
        >>> import tempfile, pathlib
        >>> from substrax.tracking import read_scalars
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     p = pathlib.Path(directory) / "x.metrics.jsonl"
        ...     _ = p.write_text('{"time": 0, "step": 3, "name": "loss", "value": 0.5}\n')
        ...     read_scalars(p)
        {'loss': [(3, 0.5)]}
    """
    source, series = Path(path), dict[str, list[tuple[int, float]]]()
    with source.open("rb") as file:
        for index, raw in enumerate(file):
            try:
                entry = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as error:
                if not raw.endswith(b"\n"):  # a last line cut short inside a character
                    continue
                reason = f"it is not UTF-8 text: {error.reason} at byte {error.start}"
                raise FileLogValueError(source, index + 1, reason) from None
            except json.JSONDecodeError:  # a blank line, or one cut short by a crash
                if index == 0 and raw.strip() and not raw.lstrip().startswith(b"{"):
                    reason = "it is no JSON object (another file, such as the .metrics.csv?)"
                    raise FileLogValueError(source, 1, reason) from None
                continue
            if entry is None:
                continue
            try:
                step = entry.get("step")
                name = entry["name"]
                point = (index if step is None else int(step), decode_number(entry["value"]))
            except KeyError as error:
                raise FileLogValueError(source, index + 1, f"no {error} field") from None
            except (AttributeError, TypeError, ValueError, OverflowError) as error:
                raise FileLogValueError(source, index + 1, str(error)) from None
            if not isinstance(name, str):
                raise FileLogValueError(source, index + 1, f"its name {name!r} is not a string")
            series.setdefault(name, []).append(point)
    return series


def _draw(title: str, points: list[tuple[int, float]], png: Path) -> None:
    """Draw one curve of ``points`` into ``png`` (numpy's overflow is matplotlib's ValueError)."""
    import numpy as np  # noqa: PLC0415  (matplotlib's own dependency)
    from matplotlib.figure import Figure  # noqa: PLC0415  (the plots extra, checked by the caller)

    with np.errstate(over="ignore", invalid="ignore"):
        figure = Figure(figsize=(6, 3.5))
        axes = figure.add_subplot()
        steps, values = zip(*points, strict=True)
        axes.plot(steps, values, marker="." if len(points) < _MARKERS_BELOW else None)
        axes.set(title=title, xlabel="step")
        axes.grid(visible=True, alpha=0.3)
        figure.tight_layout()
        figure.savefig(png, dpi=90)


def plot_log_dir(
    log_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None
) -> Path:
    """Draw a PNG per metric of each ``*.metrics.jsonl`` in ``log_dir`` and an ``index.html`` page.

    A curve matplotlib cannot draw (values from -1e308 to 1e308) is named on the page instead.

    Args:
        log_dir: a :class:`FileLogger` directory.
        out_dir: where to write; default ``<log_dir>/plots``.

    Returns:
        The path of the HTML page.

    Raises:
        NoFileLogError: ``log_dir`` does not exist, is a file, or holds no ``*.metrics.jsonl``.
        FileLogValueError: a line of one is not a metric.
        MissingExtraError: matplotlib is not installed (the ``plots`` extra).
    """
    require("matplotlib.figure", who="plotting", distribution="substrax-tracking", extra="plots")
    source = Path(log_dir)
    if not source.is_dir():
        is_file = source.is_file()
        raise NoFileLogError(source, "is a file, not a directory" if is_file else "does not exist")
    files = sorted(source.glob("*.metrics.jsonl"))
    if not files:
        raise NoFileLogError(source)
    target = Path(out_dir) if out_dir is not None else source / "plots"
    target.mkdir(parents=True, exist_ok=True)
    sections: list[str] = []
    for file in files:
        run = file.name.removesuffix(".metrics.jsonl")
        sections.append(f"<h2>{html.escape(run)}</h2>")
        curves = sorted(read_scalars(file).items())
        if not curves:
            sections.append("<p>no scalar logged</p>")
        for metric, points in curves:
            points.sort()
            png = target / f"{safe_name(run)}.{file_part(metric)}.png"
            caption = f"{html.escape(metric)}: {len(points)} points, last {points[-1][1]:.6g}"
            try:
                _draw(f"{run}: {metric}", points, png)
            except (ValueError, OverflowError) as error:  # 1e308 then -1e308: no axis spans it
                _logger.warning("plot: %s of %s is not drawn: %s", metric, file, error)
                sections.append(f"<p>{caption}; not drawn: {html.escape(str(error))}</p>")
                continue
            sections.append(
                f'<figure><img src="{html.escape(png.name)}" alt="{html.escape(metric)}">'
                f"<figcaption>{caption}</figcaption></figure>"
            )
    page, title, heading = target / "index.html", html.escape(source.name), html.escape(str(source))
    write_atomically(page, _PAGE.format(title=title, heading=heading, sections="\n".join(sections)))
    return page
