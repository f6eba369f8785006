"""One wording for pydantic's validation errors, wherever a bad input is turned away: the CLI's
settings files, the server's requests and the sealed uploads' metadata all say it alike."""

from __future__ import annotations

from collections.abc import Iterable


def validation_problems(errors: Iterable[dict], whole: str = "") -> str:
    """Each error as `field.path: message`, joined by "; ". `whole` names the input when the error
    is about all of it (a model-wide check has no field); pydantic's "Value error, " prefix is dropped
    because the field and message already say what is wrong."""
    problems = []
    for item in errors:
        where = ".".join(str(part) for part in item["loc"]) or whole
        message = item["msg"].removeprefix("Value error, ")
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)
