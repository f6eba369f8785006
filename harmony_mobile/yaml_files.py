"""Settings files people write by hand (training configs, tiers, benchmark profiles): read as YAML
(JSON is YAML too), with one-line errors that say which file and where it goes wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class YamlFileError(ValueError):
    """A settings file that is missing, not UTF-8 text or not YAML."""


def read_yaml(path: str | Path, what: str = "file") -> Any:
    """The content of the YAML file at `path`; `what` names it in the error ("tiers file")."""
    path = Path(path)
    if not path.is_file():
        raise YamlFileError(f"{what} not found: {path}")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise YamlFileError(
            f"{what} {path} is not UTF-8 text ({error.reason} at byte {error.start})"
        ) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        problem = getattr(error, "problem", None) or " ".join(str(error).split())
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise YamlFileError(f"{what} {path} is not valid YAML: {problem}{where}") from None
