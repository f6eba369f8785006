"""Shared fixtures: a throwaway PostgreSQL server (session) and the store backends to run on; the
order the test files are handed to the workers in."""

from __future__ import annotations

import os

import pytest

# One OpenMP thread in every test process and every process a test starts (they inherit it; a test
# that wants more asks explicitly): three workers share 2 cores, and OpenMP threads beyond that spin
# for their share (about 5 % more CPU for the export tests).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# the shared helpers assert too (an enrolment answered 201, an error body's one key): rewrite their
# asserts as pytest does a test's, so a failure shows the values
pytest.register_assert_rewrite("tests.helpers")

from tests.postgres import create_database, running_postgres  # noqa: E402

STORE_BACKENDS = ("sqlite", "postgresql")

# The order `make pytest` hands whole files to its workers in (it turns off xdist's own reordering
# by test count, which would start a one-test file that waits on SuperNode heartbeats last, to end
# the run alone). Each worker starts with two files: a waiting file goes with a CPU-heavy one, so
# the waits overlap CPU work, and the longest files start early.
LONGEST_FIRST = (
    "test_flower_deploy_doc.py",  # waits on SuperNodes' polls and heartbeats
    "test_operator_view.py",
    "test_demo_e2e.py",
    "test_bench_runner.py",
    "test_flower_engines.py",  # waits
    "test_export_pipeline.py",
    "test_flower_node_failure.py",  # waits
    "test_flower.py",
    "test_cli.py",
    "test_export_steps.py",
    "test_server_alignment.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    # a stable sort: the other files keep their collection order
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))


@pytest.fixture(scope="session")
def postgres_server():
    """Base URL of a PostgreSQL server started for this test session (tests/postgres.py)."""
    with running_postgres() as base_url:
        yield base_url


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """A SuperLink and 2 SuperNodes as processes, one per test module that uses it
    (tests/helpers/flower_deployment.py)."""
    from tests.helpers.flower_deployment import local_deployment

    with local_deployment(tmp_path_factory.mktemp("deployment")) as running:
        yield running


def database_url_for(backend: str, request: pytest.FixtureRequest) -> str | None:
    """None (SQLite in the data dir) or the URL of a fresh PostgreSQL database."""
    if backend == "sqlite":
        return None
    return create_database(request.getfixturevalue("postgres_server"))


@pytest.fixture(params=STORE_BACKENDS)
def database_url(request) -> str | None:
    """Parametrizes a test over both store backends."""
    return database_url_for(request.param, request)
