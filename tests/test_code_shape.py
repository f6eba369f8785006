"""No function of the product code is longer than MAX_LINES lines unless its docstring says why.

A function is counted from its `def` line to its last line (decorators excluded, nested functions
counted on their own as well). A docstring line that begins `Long because:` states the reason and
exempts the function; anything else over the limit is listed by the failing test, with its file,
line and length, so it can be split into one function per stage or concern.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 60
REASON_PREFIX = "Long because:"
# Every folder of Python we write and ship or run (tests/ is not product code); those that do not
# exist in a checkout are skipped.
SOURCE_DIRS = (
    "harmony_mobile",
    "export",
    "server",
    "benchmarks",
    "flower_app",
    "scripts",
    "android_demo/tools",
    "ios_demo/tools",
)


def long_functions(source: str, filename: str = "<source>") -> list[str]:
    """`file:line name (N lines)` for every function in `source` over MAX_LINES lines whose docstring
    has no line beginning REASON_PREFIX."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = node.end_lineno - node.lineno + 1
        docstring = ast.get_docstring(node) or ""
        has_reason = any(line.strip().startswith(REASON_PREFIX) for line in docstring.splitlines())
        if length > MAX_LINES and not has_reason:
            found.append(f"{filename}:{node.lineno} {node.name} ({length} lines)")
    return found


def source_files() -> list[Path]:
    return sorted(
        path for folder in SOURCE_DIRS if (ROOT / folder).is_dir() for path in (ROOT / folder).rglob("*.py")
    )


def test_no_function_is_over_the_limit_without_a_stated_reason():
    files = source_files()
    assert len(files) > 50, f"found only {len(files)} source files under {SOURCE_DIRS}: is ROOT right?"
    too_long = []
    for path in files:
        too_long += long_functions(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
    assert not too_long, (
        f"functions over {MAX_LINES} lines (split them into one function per stage, or start a docstring "
        f"line with {REASON_PREFIX!r}):\n  " + "\n  ".join(too_long)
    )


def _function(body_lines: int, docstring: str) -> str:
    """Source of a function `def` + docstring + assignments: 2 + body_lines lines long."""
    body = "\n".join(f"    x{i} = {i}" for i in range(body_lines))
    return f'def stage():\n    """{docstring}"""\n{body}\n'


def test_the_checker_finds_a_long_function_and_accepts_a_stated_reason():
    at_limit = _function(MAX_LINES - 2, "One stage.")
    over = _function(MAX_LINES - 1, "One stage.")
    assert len(at_limit.splitlines()) == MAX_LINES and len(over.splitlines()) == MAX_LINES + 1
    assert long_functions(at_limit) == []
    assert long_functions(over) == [f"<source>:1 stage ({MAX_LINES + 1} lines)"]

    reasoned = over.replace('"""One stage."""', '"""One stage.\n\n    Long because: a table of cases."""')
    assert long_functions(reasoned) == []
    # the reason must begin a line: mentioning it mid-sentence exempts nothing
    mentioned = over.replace('"""One stage."""', '"""Not Long because: hidden."""')
    assert long_functions(mentioned) == [f"<source>:1 stage ({MAX_LINES + 1} lines)"]


def test_the_checker_counts_methods_and_nested_functions():
    nested = "class Phone:\n    def run(self):\n        def inner():\n" + textwrap.indent(
        "\n".join(f"x{i} = {i}" for i in range(MAX_LINES)), " " * 12
    )
    found = long_functions(nested)
    assert [entry.split(" ")[1] for entry in found] == ["run", "inner"]
