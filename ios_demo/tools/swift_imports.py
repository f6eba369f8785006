"""Contract check over the Swift sources: every file imports the modules whose symbols it uses.

Swift imports are per file: a test file that calls `Hex.decode` without `import HarmonyKit` (or
`@testable import HarmonyKit`) does not compile, even when every other file of its target imports
the module. There is no Swift toolchain on Linux CI here, so this check reads the sources instead:

* the top-level declarations (types, functions, constants) of each module: HarmonyKit,
  HarmonyKitExecuTorch, the HarmonyDemo app and the test target;
* for each file, the identifiers it uses outside comments and string literals (string
  interpolations count as code);
* a file that uses a symbol of another module must import that module; a symbol that is not
  `public`/`open` needs `@testable import` (test targets) and is invisible to the app.

    .venv/bin/python ios_demo/tools/swift_imports.py     # prints every problem, exit 1 if any

tests/test_ios_contract.py runs it, and also checks that it catches a missing import.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

IOS = Path(__file__).resolve().parents[1]

# module -> (source directory, modules it may import)
MODULES = {
    "HarmonyKit": (IOS / "HarmonyKit" / "Sources" / "HarmonyKit", ()),
    "HarmonyKitTests": (IOS / "HarmonyKit" / "Tests" / "HarmonyKitTests", ("HarmonyKit",)),
    "HarmonyKitExecuTorch": (
        IOS / "HarmonyKitExecuTorch" / "Sources" / "HarmonyKitExecuTorch",
        ("HarmonyKit",),
    ),
    "HarmonyDemo": (IOS / "HarmonyDemo" / "HarmonyDemo", ("HarmonyKit", "HarmonyKitExecuTorch")),
}

# Apple frameworks whose symbols a file cannot use without importing them (Foundation is left out:
# SwiftUI, UIKit and XCTest re-export it).
SYSTEM_SYMBOLS = {
    "CryptoKit": {"SHA256", "HMAC", "HKDF", "SymmetricKey", "Curve25519", "P256", "AES"},
    "XCTest": {
        "XCTestCase",
        "XCTAssertEqual",
        "XCTAssertTrue",
        "XCTAssertThrowsError",
        "XCTUnwrap",
        "XCTSkip",
    },
    "CoreML": {"MLModel", "MLMultiArray", "MLModelConfiguration", "MLFeatureProvider"},
}

DECLARATION = re.compile(
    r"^(?P<access>(?:(?:public|open|internal|fileprivate|private|final|nonisolated|@\w+)\s+)*)"
    r"(?:struct|class|enum|protocol|actor|typealias|func|let|var)\s+(?P<name>[A-Za-z_]\w*)",
    re.M,
)
IMPORT = re.compile(r"^\s*(?P<testable>@testable\s+)?import\s+(?P<module>\w+)", re.M)
IDENTIFIER = re.compile(r"(?<![.\w])[A-Za-z_]\w*")


@dataclass(frozen=True)
class Symbol:
    module: str
    name: str
    public: bool


def code_only(text: str) -> str:
    """`text` with comments and string literal contents blanked out (interpolations kept as code)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif text[i] == '"' or (text[i] == "#" and re.match(r'#+"', text[i:])):
            i = _skip_string(text, i, out)
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _skip_string(text: str, start: int, out: list[str]) -> int:
    """Skips one string literal from `start`, appending its interpolations (as code) to `out`."""
    hashes = len(re.match(r"#*", text[start:]).group(0))
    i = start + hashes
    quote = '"""' if text.startswith('"""', i) else '"'
    i += len(quote)
    closing = quote + "#" * hashes
    escape = "\\" + "#" * hashes
    out.append(" ")
    while i < len(text):
        if text.startswith(closing, i):
            return i + len(closing)
        if text.startswith(escape + "(", i):
            depth, j = 1, i + len(escape) + 1
            while j < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
            out.append(" " + code_only(text[i + len(escape) + 1 : j - 1]) + " ")
            i = j
        elif text.startswith(escape, i):
            i += len(escape) + 1
        else:
            i += 1
    return i


def declarations(module: str, files: dict[Path, str]) -> dict[str, Symbol]:
    """Top-level declarations (column 0) of a module's files."""
    found: dict[str, Symbol] = {}
    for text in files.values():
        for match in DECLARATION.finditer(code_only(text)):
            access = match.group("access").split()
            found[match.group("name")] = Symbol(
                module, match.group("name"), bool({"public", "open"} & set(access))
            )
    return found


def module_files(directory: Path) -> dict[Path, str]:
    return {path: path.read_text(encoding="utf-8") for path in sorted(directory.rglob("*.swift"))}


def problems(sources: dict[str, dict[Path, str]] | None = None) -> list[str]:
    """Every missing or insufficient import; `sources` maps module -> {path: text} (default: the repo)."""
    if sources is None:
        sources = {name: module_files(directory) for name, (directory, _) in MODULES.items()}
    symbols = {name: declarations(name, files) for name, files in sources.items()}
    found = []
    for module, files in sources.items():
        allowed = MODULES[module][1]
        own = symbols[module]
        for path, text in files.items():
            imports = {m.group("module"): bool(m.group("testable")) for m in IMPORT.finditer(text)}
            used = set(IDENTIFIER.findall(code_only(text)))
            for framework, names in SYSTEM_SYMBOLS.items():
                missing = sorted(used & names)
                if missing and framework not in imports:
                    found.append(f"{path}: uses {', '.join(missing)} but does not import {framework}")
            for dependency in allowed:
                needed = sorted(name for name in used & set(symbols.get(dependency, {})) if name not in own)
                found += _check_file(path, module, dependency, needed, symbols[dependency], imports)
    return found


def _check_file(path, module, dependency, needed, exported, imports) -> list[str]:
    if not needed:
        return []
    if dependency not in imports:
        return [f"{path}: uses {', '.join(needed)} from {dependency} but does not import {dependency}"]
    hidden = [name for name in needed if not exported[name].public]
    if hidden and not imports[dependency]:
        testable = module.endswith("Tests")
        fix = f"`@testable import {dependency}`" if testable else "making them public"
        return [f"{path}: uses internal {', '.join(hidden)} of {dependency}; needs {fix}"]
    return []


def main() -> int:
    found = problems()
    for problem in found:
        print(problem)
    print(f"swift imports: {len(found)} problem(s)", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
