"""Shared fixtures: a throwaway PostgreSQL server (session) and the store backends to run on."""

from __future__ import annotations

import pytest

# the shared helpers assert too (an enrolment answered 201, an error body's one key): rewrite their
# asserts as pytest does a test's, so a failure shows the values
pytest.register_assert_rewrite("tests.helpers")

from tests.postgres import create_database, running_postgres  # noqa: E402

STORE_BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(scope="session")
def postgres_server():
    """Base URL of a PostgreSQL server started for this test session (tests/postgres.py)."""
    with running_postgres() as base_url:
        yield base_url


def database_url_for(backend: str, request: pytest.FixtureRequest) -> str | None:
    """None (SQLite in the data dir) or the URL of a fresh PostgreSQL database."""
    if backend == "sqlite":
        return None
    return create_database(request.getfixturevalue("postgres_server"))


@pytest.fixture(params=STORE_BACKENDS)
def database_url(request) -> str | None:
    """Parametrizes a test over both store backends."""
    return database_url_for(request.param, request)
