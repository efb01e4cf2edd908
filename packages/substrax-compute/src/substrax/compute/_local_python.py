"""The local backend's ``python`` setting: the interpreter it names, refused when it cannot serve.

A relative path in it is taken from the project's directory, as a relative ``state_dir`` is (not
the working directory's, where ``run`` was typed); a bare name (``python3``) is looked up on
``PATH``, as a shell does.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

from ._errors import ComputeConfigError
from ._toml import ROOT_PATH


_SETTING = f"{ROOT_PATH}.backends.local.python"


def _resolved(setting: str | None, project: Path) -> str | None:
    if setting and "/" in setting and not Path(setting).expanduser().is_absolute():
        return str(project / setting)
    return setting


def local_python(setting: str | None, project: Path) -> str:
    """The interpreter of a job without extras: ``setting``, else the project's .venv python.

    Without either, this process's interpreter.

    Example:
        >>> from pathlib import Path
        >>> from substrax.compute._local_python import local_python
        >>> local_python("venv/bin/python", Path("/work/p"))
        '/work/p/venv/bin/python'
    """
    if python := _resolved(setting, project):
        return python
    venv = project / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def check_python(setting: str | None, project: Path) -> None:
    """Refuse a ``python`` setting that names no program here (0.1.22 took a command line).

    An interpreter that cannot import ``substrax.compute`` (``python3`` outside the
    project's environment) is refused too: its worker would fail at once.

    Raises:
        ComputeConfigError: It names no program, or one that cannot run the worker.
    """
    python = _resolved(setting, project)
    if not setting or not python:
        return
    if shutil.which(python):
        _check_imports(python)
        return
    what = (
        "is a command line, but the setting names one interpreter"
        if len(setting.split()) > 1
        else "is no executable on this machine"
    )
    where = f" ({python}: relative to the project's directory)" if python != setting else ""
    why = (
        f"{setting!r}{where} {what}; write an interpreter's path, absolute or relative to the "
        f"project's directory (e.g. {json.dumps(str(project / '.venv' / 'bin' / 'python'))}), "
        "or leave python out to use the project's .venv python"
    )
    raise ComputeConfigError([(_SETTING, why)])


def _check_imports(python: str) -> None:
    """Refuse ``python`` when it cannot import ``substrax.compute``."""
    argv = [python, "-c", "import substrax.compute"]
    try:
        checked = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=300)
        why = [f"exit status {checked.returncode}", *checked.stderr.strip().splitlines()][-1]
    except (OSError, subprocess.TimeoutExpired) as error:
        checked, why = None, str(error)
    if checked is None or checked.returncode:
        why = (
            f"{python!r} cannot run the worker: `{python} -c 'import substrax.compute'` failed "
            f"({why}); name the interpreter of an environment with substrax-compute installed, "
            "or leave python out to use the project's .venv python"
        )
        raise ComputeConfigError([(_SETTING, why)])
