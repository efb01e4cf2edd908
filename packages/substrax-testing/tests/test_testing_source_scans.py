"""source_scans: Python files, import-time code, environment and logging writes, mesh calls, docs."""

import ast
import pickle
import sys
import textwrap
from pathlib import Path

import pytest

from substrax.testing import run_python
from substrax.testing.source_scans import (
    SourceNotFoundError,
    SourceText,
    configures_logging,
    documented_texts,
    import_time_lines,
    is_main_guard,
    matching_lines,
    python_files,
    unguarded_make_mesh_calls,
    writes_environment,
)


SCANS = Path(__file__).resolve().parents[1] / "src" / "substrax" / "testing"
SCAN_MODULES = [
    "source_scans",
    "_source_files",
    "_source_checks",
    "_names",
    "_mesh_calls",
    "_documented",
]


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


def _matches(code: str, predicate) -> list[int]:
    return sorted({n.lineno for n in ast.walk(ast.parse(code)) if predicate(n)})


def test_python_files_skips_environments_caches_and_build_outputs(tmp_path):
    names = ["a.py", "pkg/b.py", ".venv/c.py", "build/d.py", "pkg/__pycache__/e.py", "f.txt"]
    _write(tmp_path, dict.fromkeys(names, ""))
    found = [p.relative_to(tmp_path).as_posix() for p in python_files(tmp_path)]
    assert found == ["a.py", "pkg/b.py"]
    custom = python_files(tmp_path, excluded={"pkg"}, build_outputs=())  # instead of defaults
    assert [p.relative_to(tmp_path).as_posix() for p in custom] == [
        ".venv/c.py",
        "a.py",
        "build/d.py",
    ]
    assert python_files(tmp_path / "a.py") == [tmp_path / "a.py"]


def test_python_files_scans_a_package_named_build_or_dist_and_skips_build_outputs(tmp_path):
    names = [
        "src/lib/__init__.py",
        "src/lib/dist/__init__.py",  # subpackages: source
        "src/lib/build/__init__.py",
        "src/lib/build/steps.py",
        "dist/__init__.py",  # a flat-layout package named dist, at the root
        "build/lib/lib/__init__.py",  # what setuptools writes: outputs, at any depth
        "packages/member/build/lib/member.py",
        "packages/member/dist/script.py",
        "src/lib/.venv/x.py",  # environments and caches: at any depth, package or not
        "src/lib/__pycache__/__init__.py",
    ]
    _write(tmp_path, dict.fromkeys(names, ""))
    found = [p.relative_to(tmp_path).as_posix() for p in python_files(tmp_path)]
    assert found == [
        "dist/__init__.py",
        "src/lib/__init__.py",
        "src/lib/build/__init__.py",
        "src/lib/build/steps.py",
        "src/lib/dist/__init__.py",
    ]
    everything = python_files(tmp_path, build_outputs=())
    assert len(everything) == len(names) - 2
    with pytest.raises(TypeError, match=r"build_outputs must be .*'dist'"):
        python_files(tmp_path, build_outputs="dist")


def test_python_files_follows_links_to_directories_and_files_and_skips_loops_and_dangling(
    tmp_path,
):
    """Hostile finding: a linked package was skipped, a linked file read, a dangling one listed."""
    names = ["shared/plugins/__init__.py", "shared/plugins/gpu.py", "app/a.py"]
    _write(tmp_path, dict.fromkeys(names, ""))
    app = tmp_path / "app"
    (app / "plugins").symlink_to(tmp_path / "shared" / "plugins")  # imported as app.plugins
    (app / "gpu_link.py").symlink_to(tmp_path / "shared" / "plugins" / "gpu.py")
    (app / "gone.py").symlink_to(tmp_path / "nowhere.py")  # a link to nothing
    (app / "plugins_again").symlink_to(app)  # a loop: app/plugins_again/plugins_again/...
    (app / "self.py").symlink_to(app / "self.py")  # a link to itself
    found = [p.relative_to(app).as_posix() for p in python_files(app)]
    assert found == ["a.py", "gpu_link.py", "plugins/__init__.py", "plugins/gpu.py"]


def test_python_files_refuses_a_missing_root_and_a_bare_string_of_names(tmp_path):
    with pytest.raises(SourceNotFoundError, match=r"root names .*nowhere") as caught:
        python_files(tmp_path / "nowhere")
    assert isinstance(caught.value, FileNotFoundError)
    assert caught.value.path == tmp_path / "nowhere"
    copy = pickle.loads(pickle.dumps(caught.value))  # noqa: S301 - our own bytes
    assert (copy.argument, copy.path, str(copy)) == ("root", caught.value.path, str(caught.value))
    with pytest.raises(TypeError, match="'build'"):
        python_files(tmp_path, excluded="build")


def test_python_files_refuses_a_single_file_that_is_not_python(tmp_path):
    root = _write(tmp_path, {"README.md": "# App\n", "src/app.py": ""})
    with pytest.raises(ValueError, match=r"README\.md is a file but not a \.py file"):
        python_files(root / "README.md")
    with pytest.raises(ValueError, match=r"README\.md is a file but not a \.py file"):
        documented_texts(root, package="README.md")  # its package is read by python_files
    assert python_files(root / "src" / "app.py") == [root / "src" / "app.py"]


def test_a_directory_given_as_a_file_is_refused_naming_the_argument(tmp_path):
    # IsADirectoryError came out of the file read, naming no argument
    root = _write(tmp_path, {"docs/index.md": "# App\n", "src/app.py": ""})
    with pytest.raises(ValueError, match=r"path='.*src' is a directory, not a file"):
        import_time_lines(root / "src", writes_environment)
    with pytest.raises(ValueError, match=r"path='.*src' is a directory"):
        matching_lines(root / "src", writes_environment)
    with pytest.raises(ValueError, match=r"pages='.*docs' is a directory"):
        documented_texts(root, package="src", pages=["docs"])


# the code each check finds, and code like it that the check leaves alone
FOUND_AND_LEFT = {
    writes_environment: (
        [
            "os.environ['A'] = '1'",
            "os.environ['A'] += '1'",
            "del os.environ['A']",
            "environ['A'] = '1'",
            "os.environ.update(A='1')",
            "os.environ.setdefault('A', '1')",
            "os.environ.pop('A', None)",
            "os.environ.clear()",
            "os.putenv('A', '1')",
            "os.unsetenv('A')",
            "os.environ = {}",
            "environ |= {'A': '1'}",
        ],
        [
            "os.environ.get('A')",
            "value = os.environ['A']",
            "env = dict(os.environ); env['A'] = '1'",
            "settings.update(A='1')",
        ],
    ),
    configures_logging: (
        [
            "logging.basicConfig(level=logging.INFO)",
            "basicConfig()",
            "logging.config.dictConfig({})",
            "logging.disable(logging.INFO)",
            "logging.captureWarnings(True)",
            "logging.getLogger().addHandler(handler)",
            "logging.getLogger('root').setLevel(10)",
            "logging.getLogger(None).removeHandler(handler)",
            "logging.root.setLevel(10)",
            "logging.root.handlers = []",
            "logging.getLogger().handlers = []",
            "logging.getLogger().handlers.clear()",
            "logging.getLogger().handlers[:] = []",
            "del logging.root.handlers[0]",
            "logging.getLogger().filters.append(only_errors)",
            "logging.getLogger(name=None).setLevel(10)",
        ],
        [
            "logging.getLogger('substrax').setLevel(10)",
            "logging.getLogger(name='substrax').handlers.clear()",
            "logging.getLogger().handlers[0].setLevel(10)",
            "handlers.clear()",
            "logging.getLogger(__name__).addHandler(logging.NullHandler())",
            "logging.getLogger().getEffectiveLevel()",
            "logger.info('hello')",
        ],
    ),
}


@pytest.mark.parametrize(
    ("check", "code", "expected"),
    [
        pytest.param(check, code, expected, id=f"{check.__name__}: {code}")
        for check, (found, left) in FOUND_AND_LEFT.items()
        for expected, codes in ((True, found), (False, left))
        for code in codes
    ],
)
def test_a_check_finds_what_it_names_and_nothing_else(check, code, expected):
    assert bool(_matches(code, check)) is expected


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ('if __name__ == "__main__":\n    pass', True),
        ("if '__main__' == __name__:\n    pass", True),
        ('if __name__ != "__main__":\n    pass', False),
        ('if __name__ == "__main__" and DEBUG:\n    pass', False),
        ('if name == "__main__":\n    pass', False),
        ('if __name__ in ("__main__",):\n    pass', False),  # this form only
        ("x = 1", False),
    ],
)
def test_is_main_guard(code, expected):
    assert is_main_guard(ast.parse(code).body[0]) is expected


IMPORT_TIME = """\
import os
from typing import TYPE_CHECKING
os.environ["AT_IMPORT"] = "1"
if TYPE_CHECKING:
    os.environ["NEVER"] = "1"
@register(os.environ.setdefault("DECORATOR", "1"))
def main(default=os.environ.pop("DEFAULT", None)):
    os.environ["IN_FUNCTION"] = "1"
    callback = lambda: os.putenv("IN_LAMBDA", "1")
class Settings:
    os.environ["IN_CLASS"] = "1"
    def method(self):
        os.environ["IN_METHOD"] = "1"
if __name__ == "__main__":
    os.environ["GUARDED"] = "1"
else:
    os.environ["IMPORTED"] = "1"
"""


@pytest.mark.parametrize(
    ("scan", "expected"),
    [
        # only the code that runs on import (not TYPE_CHECKING, a function body, a main guard)
        (import_time_lines, [(3, ""), (6, ""), (7, ""), (11, "Settings"), (17, "")]),
        # every line, named by the function or class around it
        (
            matching_lines,
            [
                (3, ""),
                (5, ""),
                (6, ""),
                (7, ""),
                (8, "main"),
                (9, "main"),
                (11, "Settings"),
                (13, "Settings.method"),
                (15, ""),
                (17, ""),
            ],
        ),
    ],
)
def test_a_scan_names_each_line_and_its_scope(tmp_path, scan, expected):
    path = _write(tmp_path, {"module.py": IMPORT_TIME}) / "module.py"
    found = scan(path, writes_environment)
    assert [(f.line, f.scope) for f in found] == expected
    assert found[0] == SourceText(
        path=str(path), line=3, scope="", text='os.environ["AT_IMPORT"] = "1"'
    )
    in_class = found[expected.index((11, "Settings"))]
    assert str(in_class) == f'{path}:11 (Settings): os.environ["IN_CLASS"] = "1"'


@pytest.mark.parametrize(
    ("check", "code", "lines"),
    [
        (writes_environment, "import os as _os\n_os.environ['A'] = '1'", [2]),
        (writes_environment, "from os import environ as env\nenv['A'] = '1'", [2]),
        (writes_environment, "from os import environ\nenviron.update(A='1')", [2]),
        (writes_environment, "from os import putenv as put\nput('A', '1')", [2]),
        (writes_environment, "from os import environ as E\nE |= {'A': '1'}", [2]),
        (writes_environment, "from os import environ\nenviron |= {'A': '1'}", [2]),
        (writes_environment, "import os\nos.environ |= {'A': '1'}", [2]),
        (writes_environment, "from os import environ\nenvironment |= {'A': '1'}", []),
        (writes_environment, "import os.path\nos.environ['A'] = '1'", [2]),
        (
            writes_environment,
            "import importlib\nos = importlib.import_module('os')\nos.putenv('A', '1')",
            [3],
        ),
        (
            writes_environment,
            "e = __import__('os').environ\nos = __import__('os.path')\nos.environ['A'] = '1'",
            [3],
        ),
        (
            writes_environment,
            "import importlib\nos = importlib.import_module('app.os')\nos.environ['A'] = '1'",
            [],
        ),
        (
            configures_logging,
            "from importlib import import_module\nlc = import_module('logging.config')\nlc.dictConfig({})",
            [3],
        ),
        (writes_environment, "from app.settings import environ\nenviron['A'] = '1'", []),
        (writes_environment, "import app.settings as os\nos.environ['A'] = '1'", []),
        (configures_logging, "import logging as log\nlog.basicConfig(level=10)", [2]),
        (configures_logging, "import logging.config as lc\nlc.dictConfig({})", [2]),
        (configures_logging, "from logging import config\nconfig.fileConfig('x.ini')", [2]),
        (configures_logging, "from logging import getLogger as get\nget().setLevel(10)", [2]),
        (configures_logging, "import logging as log\nlog.root.handlers.clear()", [2]),
        (configures_logging, "from structlog import getLogger\ngetLogger().setLevel(10)", []),
        (
            writes_environment,
            "import os, typing as t\nif t.TYPE_CHECKING:\n    os.environ['A'] = '1'",
            [],
        ),
    ],
)
def test_a_scan_reads_names_through_the_files_imports(tmp_path, check, code, lines):
    path = _write(tmp_path, {"module.py": code}) / "module.py"
    assert [finding.line for finding in import_time_lines(path, check)] == lines
    # outside a scan, a node is read as written again
    assert _matches("os.environ['A'] = '1'", writes_environment) == [1]


OWN_NAMES = """\
environ = {}
environ["A"] = "1"
def app(environ, start_response):
    environ["PATH_INFO"] = "/"
    def inner():
        environ["B"] = "1"
def putenv(key, value):
    pass
putenv("A", "1")
configure = lambda environ: environ.update(A="1")
"""

IMPORTED_AND_OWN = """\
from os import environ, putenv
environ["A"] = "1"
def app(environ, start_response):
    environ["PATH_INFO"] = "/"
    putenv("A", "1")
def configure():
    from os import unsetenv
    unsetenv("A")
class Settings:
    environ = {}
    environ["A"] = "1"
    def method(self):
        environ["A"] = "1"
"""


@pytest.mark.parametrize(
    ("code", "lines", "at_import"),
    [
        (OWN_NAMES, [], []),  # a dict, a WSGI parameter, a function of the file's own: not os's
        (IMPORTED_AND_OWN, [2, 5, 8, 13], [2]),  # a method sees the module's name, not the class's
        ("from .settings import environ\nenviron['A'] = '1'", [], []),
        ("from app.settings import *\nenviron['A'] = '1'", [], []),
        ("from os import *\nenviron['A'] = '1'\nputenv('A', '1')", [2, 3], [2, 3]),
        ("def f(os):\n    os.environ['A'] = '1'", [], []),
        # a parameter whose default is os's is os's (761997c caught these; a review found them lost)
        ("import os\ndef f(environ=os.environ):\n    environ['A'] = '1'", [3], []),
        ("import os\ng = lambda environ=os.environ: environ.update(A='1')", [2], []),
        ("import os\ndef f(*, os=os):\n    os.environ['A'] = '1'", [3], []),
        # a comprehension's loop variables are its own; its first iterable is the scope's
        ("from os import environ\n[environ.update(d) for environ in dicts]", [], []),
        ("from os import environ\n{k: environ.pop(k) for environ in ds for k in environ}", [], []),
        ("from os import environ\nlist(environ.update(d) for environ in ds)", [], []),
        ("from os import environ\n[d for d in environ.pop('A')]", [2], [2]),
        ("from os import environ\n[d for d in x if environ.pop(d)]", [2], [2]),
        (
            "from os import environ\ndef f(ds):\n    [environ for environ in ds]\n    environ.clear()",
            [4],
            [],
        ),
        (
            "import os\nclass C:\n    os = None\n    xs = [os.environ.update(d) for d in ds]",
            [4],
            [4],
        ),
        # a name a scope both imports and binds otherwise keeps the import (order is not read)
        (
            "try:\n    import os\nexcept ImportError:\n    os = None\nos.environ['A'] = '1'",
            [5],
            [5],
        ),
    ],
)
def test_a_name_the_file_binds_itself_is_not_the_one_in_os(tmp_path, code, lines, at_import):
    path = _write(tmp_path, {"module.py": code}) / "module.py"
    assert [finding.line for finding in matching_lines(path, writes_environment)] == lines
    assert [finding.line for finding in import_time_lines(path, writes_environment)] == at_import


def test_a_name_the_file_binds_itself_is_not_logging_either(tmp_path):
    code = "def basicConfig():\n    pass\nbasicConfig()\nfrom logging import getLogger\ngetLogger().setLevel(10)"
    path = _write(tmp_path, {"module.py": code}) / "module.py"
    assert [finding.line for finding in matching_lines(path, configures_logging)] == [5]


@pytest.mark.parametrize(
    ("code", "lines"),
    [
        ('if __name__ == "__main__" and DEBUG:\n    A\nelse:\n    B', [4]),
        ('if DEBUG and __name__ == "__main__":\n    A', []),
        ('if __name__ == "__main__" or DEBUG:\n    A\nelse:\n    B', [2, 4]),
        ('if __name__ in ("__main__",):\n    A\nelse:\n    B', [4]),
        ('if __name__ in ["__main__"]:\n    A', []),
        ('if __name__ not in {"__main__"}:\n    A\nelse:\n    B', [2]),
        ('if __name__ in ("__main__", "app"):\n    A', [2]),
        ('if __name__ in "__main__":\n    A', [2]),  # a substring test: "main" is in it
        ('if __name__ != "__main__":\n    A\nelse:\n    B', [2]),
        ('if not __name__ == "__main__":\n    A\nelse:\n    B', [2]),
        ('match __name__:\n    case "__main__":\n        A\n    case _:\n        B', [5]),
        ('match __name__:\n    case "__main__" | "app":\n        A', [3]),
        ('match name:\n    case "__main__":\n        A', [3]),
        ("if not TYPE_CHECKING:\n    A\nelse:\n    B", [2]),
        ("TYPE_CHECKING = False\nif TYPE_CHECKING:\n    A", []),
    ],
)
def test_import_time_skips_every_branch_that_cannot_run_on_import(tmp_path, code, lines):
    path = _write(tmp_path, {"module.py": code}) / "module.py"
    found = import_time_lines(
        path, lambda node: isinstance(node, ast.Name) and node.id in {"A", "B"}
    )
    assert [finding.line for finding in found] == lines


@pytest.mark.parametrize(
    ("code", "lines"),
    [
        ("TYPE_CHECKING = True\nif TYPE_CHECKING:\n    A", [3]),
        ("from mylib.flags import TYPE_CHECKING\nif TYPE_CHECKING:\n    A", [3]),
        ("def TYPE_CHECKING():\n    pass\nif TYPE_CHECKING:\n    A", [4]),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    A", []),
        ("import typing as t\nif t.TYPE_CHECKING:\n    A", []),
        ("from typing_extensions import TYPE_CHECKING as TC\nif TC:\n    A", []),
        ("TYPE_CHECKING: bool = False\nif TYPE_CHECKING:\n    A", [3]),  # annotated: not read
        # a later binding (hostile finding: the first won): bound otherwise too, not typing's
        ("TYPE_CHECKING = False\nTYPE_CHECKING = True\nif TYPE_CHECKING:\n    A", [4]),
        ("from typing import TYPE_CHECKING\nTYPE_CHECKING = True\nif TYPE_CHECKING:\n    A", [4]),
        ("TYPE_CHECKING = False\nfrom config import TYPE_CHECKING\nif TYPE_CHECKING:\n    A", [4]),
        (
            "from typing import TYPE_CHECKING\nfrom typing_extensions import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    A",
            [],
        ),
    ],
)
def test_only_typings_type_checking_hides_a_branch(tmp_path, code, lines):
    path = _write(tmp_path, {"module.py": code}) / "module.py"
    found = import_time_lines(path, lambda node: isinstance(node, ast.Name) and node.id == "A")
    assert [finding.line for finding in found] == lines


@pytest.mark.parametrize(
    ("check", "code", "lines"),
    [
        (writes_environment, "import os\n(e := os.environ)['A'] = '1'", [2]),
        (writes_environment, "import os\n(e := os).putenv('A', '1')", [2]),
        (writes_environment, "__import__('os').environ['A'] = '1'", [1]),
        (writes_environment, "__import__('os.path').environ.pop('A')", [1]),
        (
            writes_environment,
            "import importlib\nimportlib.import_module('os').environ['A'] = '1'",
            [2],
        ),
        (
            writes_environment,
            "from importlib import import_module as im\nim('os').putenv('A', '1')",
            [2],
        ),
        (writes_environment, "importlib.import_module('os').putenv('A', '1')", [1]),  # unbound
        (writes_environment, "__import__(name).environ['A'] = '1'", []),  # not a literal
        (
            writes_environment,
            "def __import__(m):\n    pass\n__import__('os').environ['A'] = '1'",
            [],
        ),
        (configures_logging, "import logging\nlogging.Logger.root.setLevel(10)", [2]),
        (configures_logging, "import logging\nlogging.Logger.manager.root.addHandler(h)", [2]),
        (configures_logging, "import logging\nlogging.RootLogger.manager.root.handlers = []", [2]),
        (configures_logging, "import logging as lg\n(r := lg.getLogger()).setLevel(10)", [2]),
        (
            configures_logging,
            "import logging\nlogging.Logger.manager.getLogger('x').setLevel(1)",
            [],
        ),
    ],
)
def test_a_scan_reads_a_walrus_and_an_import_by_a_call(tmp_path, check, code, lines):
    path = _write(tmp_path, {"module.py": code}) / "module.py"
    assert [finding.line for finding in import_time_lines(path, check)] == lines


@pytest.mark.parametrize(
    "source",
    [
        "import os\n\x0c\ndef f():\n    pass\nos.environ['A'] = '1'\n",  # a form feed
        "import os\nDOC = 'a\u2028b\x1cc\x85d'\nX = 1\n\nos.environ['A'] = '1'\n",
        "import os\r\nX = 1\rY = 2\n\nos.environ['A'] = '1'\r\n",  # CR, CRLF and LF ends
    ],
)
def test_a_finding_shows_the_line_python_numbers(tmp_path, source):
    path = tmp_path / "module.py"
    path.write_bytes(source.encode())
    found = matching_lines(path, writes_environment)
    assert [(f.line, f.text) for f in found] == [(5, "os.environ['A'] = '1'")]
    code = source.replace("os.environ['A'] = '1'", "mesh = jax.make_mesh((8,), ('data',))")
    found = unguarded_make_mesh_calls(code)
    assert [(f.line, f.text) for f in found] == [(5, "mesh = jax.make_mesh((8,), ('data',))")]


def test_a_file_python_imports_is_read_as_python_reads_it(tmp_path):
    (tmp_path / "src").mkdir()
    bom = tmp_path / "src" / "bom.py"
    bom.write_bytes(b"\xef\xbb\xbf'The doc.'\nimport os\nos.environ['A'] = '1'\n")
    latin = tmp_path / "src" / "latin.py"
    latin.write_bytes(b"# -*- coding: latin-1 -*-\n'Caf\xe9.'\nos.environ['A'] = '\xe9'\n")
    assert [(f.line, f.text) for f in import_time_lines(bom, writes_environment)] == [
        (3, "os.environ['A'] = '1'")
    ]
    assert [(f.line, f.text) for f in matching_lines(latin, writes_environment)] == [
        (3, "os.environ['A'] = '\xe9'")
    ]
    texts = documented_texts(tmp_path, package="src", script_directories=["src"])
    assert [t.text for t in texts] == [
        "The doc.",
        "Caf\xe9.",
        "'The doc.'\nimport os\nos.environ['A'] = '1'\n",
        "# -*- coding: latin-1 -*-\n'Caf\xe9.'\nos.environ['A'] = '\xe9'\n",
    ]
    empty = tmp_path / "empty.py"
    empty.write_text("")
    assert import_time_lines(empty, lambda node: isinstance(node, ast.Module)) == [
        SourceText(path=str(empty), line=1, scope="", text="")
    ]
    undeclared = tmp_path / "undeclared.py"
    undeclared.write_bytes(b"x = '\xe9'\n")  # not UTF-8, and no coding line says what it is
    with pytest.raises(SyntaxError):
        import_time_lines(undeclared, writes_environment)


def test_a_byte_python_does_not_decode_in_a_comment_is_read_as_python_imports_it(tmp_path):
    """Hostile finding: a latin-1 comment with no coding line was a bare UnicodeDecodeError."""
    legacy = tmp_path / "legacy.py"  # Python 3.12 imports it: a comment's bytes are not decoded
    legacy.write_bytes(b"import os\n# caf\xe9 (latin-1)\nos.environ['A'] = '1'\n")
    assert [(f.line, f.text) for f in import_time_lines(legacy, writes_environment)] == [
        (3, "os.environ['A'] = '1'")
    ]
    assert [f.line for f in matching_lines(legacy, writes_environment)] == [3]
    literal = tmp_path / "literal.py"  # in a string, Python refuses it: a SyntaxError naming it
    literal.write_bytes(b"import os\nos.environ['A'] = 'caf\xe9'\n")
    with pytest.raises(SyntaxError) as info:
        matching_lines(literal, writes_environment)
    assert info.value.filename == str(literal)


def test_a_missing_or_broken_file_is_refused(tmp_path):
    with pytest.raises(SourceNotFoundError, match="path names"):
        import_time_lines(tmp_path / "missing.py", writes_environment)
    (tmp_path / "broken.py").write_text("def (:\n")
    with pytest.raises(SyntaxError):
        matching_lines(tmp_path / "broken.py", writes_environment)


MESH_CALLS = """\
mesh = jax.make_mesh((8,), ("data",))
mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
mesh = jax.make_mesh((2, 4), ("data", "model"), (AxisType.Auto,) * 2, devices=devices)
mesh = jax.make_mesh(
    (2, 4),
    ("data", "model"),
    devices=jax.devices()[:8],
)
def make_mesh(shape, names):
mesh = make_mesh(*arguments)
mesh = make_mesh(shape, names, **options)
mesh = create_mesh((8,), ("data",))
"""


def test_unguarded_make_mesh_calls_finds_calls_that_leave_axis_types_to_jax():
    found = unguarded_make_mesh_calls(MESH_CALLS)
    assert [(f.path, f.line, f.text) for f in found] == [
        ("<text>", 1, 'mesh = jax.make_mesh((8,), ("data",))'),
        ("<text>", 4, "mesh = jax.make_mesh("),
    ]


def test_unguarded_make_mesh_calls_places_findings_in_a_documented_text():
    page = "# Meshes\n\n```python\nmesh = jax.make_mesh((8,), ('data',))\n```\n"
    text = SourceText(path="docs/mesh.md", line=10, scope="", text=page)
    found = unguarded_make_mesh_calls(text)
    assert [str(f) for f in found] == ["docs/mesh.md:13: mesh = jax.make_mesh((8,), ('data',))"]
    assert unguarded_make_mesh_calls("mesh = jax.make_mesh((8,)") != []  # an unclosed call


@pytest.mark.parametrize(
    ("code", "unguarded"),
    [
        ("jax.make_mesh(\n    (8,),  # data, model\n    ('data',),\n)", True),
        ("jax.make_mesh((8,), 'data,', devices=devices)", True),
        ("jax.make_mesh((8,), ('data',), axis_types=None)", True),
        ("jax.make_mesh((8,), ('data',), None, devices=devices)", True),
        ("jax.make_mesh((8,), ('data',), axis_types=None, **options)", True),
        ("jax.make_mesh((8,), ('data',), devices=sorted(d, key=lambda d: ')'))", True),
        (">>> mesh = jax.make_mesh(\n...     (8,),\n...     ('data',),\n... )", True),
        ("Call `make_mesh(` first, then, later, more.", True),  # unclosed: cannot be read
        (">>> jax.make_mesh(\n...     (8,),\n...     ('data',),\n...     (Auto,),\n... )", False),
        (
            "jax.make_mesh(\n    (8,),  # (the shape\n    ('data',),\n    axis_types=types,\n)",
            False,
        ),
        ("jax.make_mesh((8,), ('data',), (Auto,))  # data, model", False),
    ],
)
def test_unguarded_make_mesh_calls_reads_arguments_as_python_does(code, unguarded):
    assert bool(unguarded_make_mesh_calls(code)) is unguarded


PACKAGE = {
    "src/app/__init__.py": '"""The app."""\n',
    "src/app/_core.py": """\
        '''Core.'''
        class Trainer:
            '''Trains.'''
            def fit(self):
                '''Fits.'''
                def inner():
                    '''Not API.'''
            def _step(self):
                '''Private.'''
        def _helper():
            '''Private.'''
        def undocumented():
            pass
        """,
    "src/.venv/lib.py": '"""Not ours."""\n',
    "README.md": "# App\n",
    "docs/index.md": "Index\n",
    "docs/api/ref.rst": "Reference\n",
    "docs/notes.txt": "Not a page\n",
    "docs/guide.md/intro.md": "Intro\n",  # a directory named like a page is not one
    "examples/train.py": "print('train')\n",
}


def test_documented_texts_gathers_public_docstrings_pages_and_scripts(tmp_path):
    root = _write(tmp_path, PACKAGE)
    texts = documented_texts(
        root,
        package="src",
        pages=["README.md"],
        page_directories=["docs"],
        script_directories=[root / "examples"],
    )
    assert [(t.path, t.line, t.scope, t.text) for t in texts] == [
        ("src/app/__init__.py", 1, "", "The app."),
        ("src/app/_core.py", 1, "", "Core."),
        ("src/app/_core.py", 3, "Trainer", "Trains."),
        ("src/app/_core.py", 5, "Trainer.fit", "Fits."),
        ("README.md", 1, "", "# App\n"),
        ("docs/api/ref.rst", 1, "", "Reference\n"),
        ("docs/guide.md/intro.md", 1, "", "Intro\n"),
        ("docs/index.md", 1, "", "Index\n"),
        ("examples/train.py", 1, "", "print('train')\n"),
    ]


def test_documented_texts_gives_a_page_given_twice_once(tmp_path):
    """A review: a page in ``pages`` and under a page directory too was read twice."""
    root = _write(tmp_path, PACKAGE)
    texts = documented_texts(
        root, package="src", pages=["docs/index.md"], page_directories=["docs", "docs/api"]
    )
    assert [t.path for t in texts if not t.path.startswith("src")] == [
        "docs/index.md",
        "docs/api/ref.rst",
        "docs/guide.md/intro.md",
    ]


MESH_MODULE = """\
    'Mesh helpers.'
    import sys
    DEFAULT_MESH = None
    'Build it with ``jax.make_mesh((8,), ("data",))``.'
    _PRIVATE = 1
    'Not API.'
    if sys.version_info >= (3, 11):
        def make():
            'Make it.'
    else:
        def make():
            'Make it the old way.'
    try:
        import jax
    except ImportError:
        class Fallback:
            'Without jax.'
            size: int = 8
            'Mesh size.'
            shape: tuple[int, ...]
            'Mesh shape.'
    with suppress(ImportError):
        type Axes = tuple[str, ...]
        'Axis names.'
    x = 1
    y = 2
    """


def test_documented_texts_reads_attribute_docstrings_and_definitions_in_blocks(tmp_path):
    root = _write(tmp_path, {"src/mesh.py": MESH_MODULE})
    texts = documented_texts(root, package="src")
    assert [(t.line, t.scope, t.text) for t in texts] == [
        (1, "", "Mesh helpers."),
        (4, "DEFAULT_MESH", 'Build it with ``jax.make_mesh((8,), ("data",))``.'),
        (9, "make", "Make it."),
        (12, "make", "Make it the old way."),
        (17, "Fallback", "Without jax."),
        (19, "Fallback.size", "Mesh size."),
        (21, "Fallback.shape", "Mesh shape."),
        (24, "Axes", "Axis names."),
    ]
    found = [str(hit) for text in texts for hit in unguarded_make_mesh_calls(text)]
    assert found == [
        'src/mesh.py:4 (DEFAULT_MESH): Build it with ``jax.make_mesh((8,), ("data",))``.'
    ]


@pytest.mark.parametrize(
    ("argument", "options"),
    [
        ("package", {"package": "lib"}),
        ("pages", {"pages": ["MISSING.md"]}),
        ("page_directories", {"page_directories": ["site"]}),
        ("script_directories", {"script_directories": ["scripts"]}),
    ],
)
def test_documented_texts_names_the_argument_with_a_missing_path(tmp_path, argument, options):
    root = _write(tmp_path, PACKAGE)
    with pytest.raises(SourceNotFoundError, match=f"^{argument} names ") as caught:
        documented_texts(root, **{"package": "src", **options})
    assert caught.value.argument == argument


def test_documented_texts_refuses_a_page_directory_that_is_a_file(tmp_path):
    root = _write(tmp_path, PACKAGE)
    with pytest.raises(ValueError, match=r"page_directories=.*index\.md' is a file.*pages="):
        documented_texts(root, package="src", page_directories=["docs/index.md"])


@pytest.mark.parametrize(
    ("argument", "name"),
    [("page_directories", "docs/latin.md"), ("script_directories", "examples/latin.py")],
)
def test_documented_texts_names_a_file_that_is_not_utf8(tmp_path, argument, name):
    root = _write(tmp_path, PACKAGE)
    (root / name).parent.mkdir(exist_ok=True)
    (root / name).write_bytes(b"x = 1\ny = 2\nz = 'caf\xe9'\n")  # latin-1 after the coding lines
    with pytest.raises(ValueError, match=rf"^{argument}: .*latin\.(md|py) is not text in ") as info:
        documented_texts(root, package="src", **{argument: [name.partition("/")[0]]})
    assert isinstance(info.value.__cause__, UnicodeDecodeError)


@pytest.mark.skipif(sys.platform == "win32", reason="symbolic links need privileges there")
@pytest.mark.parametrize(
    ("argument", "name"),
    [
        ("package", "src/app/gone.py"),
        ("page_directories", "docs/gone.md"),
        ("script_directories", "examples/gone.py"),
    ],
)
def test_documented_texts_names_the_argument_listing_a_link_to_nothing(tmp_path, argument, name):
    root = _write(tmp_path, {**PACKAGE, "examples/run.py": "print(1)\n"})
    (root / name).symlink_to(tmp_path / "nowhere")
    options = {"package": "src", argument: [name.partition("/")[0]]}
    if argument == "package":
        options = {"package": "src"}
    with pytest.raises(SourceNotFoundError, match=f"^{argument} names .*gone") as info:
        documented_texts(root, **options)
    assert info.value.argument == argument


def test_documented_texts_refuses_a_single_path_where_it_wants_several(tmp_path):
    root = _write(tmp_path, PACKAGE)
    with pytest.raises(TypeError, match=r"pages must be a sequence of paths.*'README\.md'"):
        documented_texts(root, package="src", pages="README.md")


@pytest.mark.usefixtures("child_processes")
def test_the_scans_import_only_the_standard_library():
    for name in SCAN_MODULES:
        tree = ast.parse((SCANS / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            outside = [
                module
                for module in modules
                if module.partition(".")[0] not in sys.stdlib_module_names
                and module != "substrax.support"
            ]
            assert outside == [], f"{name}.py imports {outside}"
    program = (
        "import json, sys; import substrax.testing.source_scans; "
        "print(json.dumps(sorted({'jax', 'flax', 'numpy', 'pytest'} & set(sys.modules))))"
    )
    assert run_python(program, timeout=60).check().last_json() == []


def test_every_scan_takes_a_path_as_a_str_too(tmp_path):
    (tmp_path / "src").mkdir()
    module = tmp_path / "src" / "app.py"
    module.write_text("'The app.'\nimport os\nos.environ['A'] = '1'\n")
    assert python_files(str(tmp_path)) == [module]
    assert [t.line for t in import_time_lines(str(module), writes_environment)] == [3]
    assert [t.line for t in matching_lines(str(module), writes_environment)] == [3]
    texts = documented_texts(str(tmp_path), package="src")
    assert [t.text for t in texts] == ["The app."]
    with pytest.raises(SourceNotFoundError, match="root"):
        documented_texts(str(tmp_path / "gone"), package="src")
    with pytest.raises(TypeError, match="must be source text"):
        unguarded_make_mesh_calls(None)
