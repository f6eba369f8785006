"""The store on both backends (SQLite in the data dir, and a throwaway PostgreSQL): durability
across a SIGKILL, idempotency under concurrent replays, alignment round bookkeeping, the registry."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
from harmony_mobile.server.services.store import (
    INT64_MAX,
    LEASE_COLUMNS,
    NewUpload,
    Store,
    VersionRecord,
    database_url,
    utc_now,
)
from sqlalchemy import inspect, text


def new_upload(
    device_id: str, message_id: str, envelope: bytes = b"sealed", label_epoch: str = "e-store-tests"
) -> NewUpload:
    return NewUpload(
        device_id=device_id,
        message_id=message_id,
        label_epoch=label_epoch,
        envelope=envelope,
        envelope_sha256=hashlib.sha256(envelope).hexdigest(),
        rows=3,
        tier="mid-android",
        family="mobilenet",
        model_version="v1",
        clip_norm=None,
        noise_multiplier=0.5,
        label_dp_epsilon=2.0,
    )


@pytest.fixture
def store(tmp_path, database_url):
    store = Store(tmp_path, database_url)
    store.add_device("dev_a", "hash-a", "phone", "mid-android")
    yield store
    store.close()


def test_upload_round_trips_and_a_second_connection_sees_the_commit(store, tmp_path, database_url):
    receipt, inserted = store.add_upload(new_upload("dev_a", str(uuid.uuid4()), b"\x00\xffenvelope"))
    assert inserted and receipt.rows == 3
    other = Store(tmp_path, database_url)
    try:
        [stored] = other.envelopes()
        assert stored.envelope == b"\x00\xffenvelope" and stored.label_epoch == "e-store-tests"
        assert other.upload_stats() == {"uploads": 1, "rows": 3}
    finally:
        other.close()


def test_envelopes_of_one_label_epoch(store):
    store.add_upload(new_upload("dev_a", str(uuid.uuid4()), b"first", label_epoch="e-1"))
    store.add_upload(new_upload("dev_a", str(uuid.uuid4()), b"second", label_epoch="e-2"))
    store.add_upload(new_upload("dev_a", str(uuid.uuid4()), b"third", label_epoch="e-1"))
    assert [s.envelope for s in store.envelopes(label_epoch="e-1")] == [b"third", b"first"]
    assert [s.envelope for s in store.envelopes(label_epoch="e-2")] == [b"second"]
    assert store.envelopes(label_epoch="e-3") == [] and len(store.envelopes()) == 3


def test_concurrent_replays_store_one_upload(store):
    message_id = str(uuid.uuid4())
    results, barrier = [], threading.Barrier(8)

    def replay():
        barrier.wait()
        results.append(store.add_upload(new_upload("dev_a", message_id)))

    threads = [threading.Thread(target=replay) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(inserted for _, inserted in results) == 1
    assert len({receipt.upload_id for receipt, _ in results}) == 1
    assert store.upload_stats()["uploads"] == 1


def test_same_message_id_on_two_devices_is_two_uploads(store):
    store.add_device("dev_b", "hash-b", None, None)
    message_id = str(uuid.uuid4())
    assert store.add_upload(new_upload("dev_a", message_id))[1]
    assert store.add_upload(new_upload("dev_b", message_id))[1]
    assert store.find_upload("dev_b", message_id) is not None


def test_devices_and_revocation(store):
    assert store.device_by_token_hash("hash-a").tier == "mid-android"
    assert store.revoke_device("dev_a") and not store.revoke_device("dev_nobody")
    first = store.device_by_token_hash("hash-a").revoked_at
    assert first is not None and store.revoke_device("dev_a")
    assert store.device_by_token_hash("hash-a").revoked_at == first  # the first revocation time stays


def test_round_bookkeeping(store):
    first = store.create_round({"steps": 1}, "proc-a", 60)
    second = store.create_round({"steps": 2}, "proc-b", 60)
    assert store.start_round(first) and not store.start_round(first)
    store.update_round_progress(first, 0.5, {"loss": 1.0})
    assert store.round(first).progress == 0.5 and store.round(first).metrics == {"loss": 1.0}
    # shutdown interrupts only the rounds this process holds; the other stays queued
    assert store.interrupt_rounds_of("proc-a") == 1
    assert store.round(first).status == "interrupted" and store.round(second).status == "queued"
    assert not store.finish_round(first, "published", {})  # an interrupted round stays interrupted
    assert store.finish_round(second, "rejected", {"why": "x"}) and store.round(second).progress == 1.0
    assert store.round_counts() == {"interrupted": 1, "rejected": 1}
    assert [r.id for r in store.rounds()] == [second, first]
    for outside in (0, -1, INT64_MAX, INT64_MAX + 1, 10**400):
        assert store.round(outside) is None


def let_lease_run_out(store: Store, owner: str) -> None:
    """The database clock passing `owner`'s lease, without the test waiting on a wall clock (a
    short real lease can run out early on a loaded machine)."""
    with store.engine.begin() as db:
        moved = db.execute(
            text("UPDATE alignment_rounds SET lease_expires_at = 1.0 WHERE owner = :owner"), {"owner": owner}
        )
    assert moved.rowcount >= 1, f"{owner} holds no round"


def test_only_rounds_whose_lease_expired_are_interrupted(store):
    """A process starting (or sweeping) beside a live one leaves the live one's round alone; a round
    whose owner stopped renewing is interrupted once its lease is over, whoever sweeps."""
    live = store.create_round({}, "alive", 60)
    dead = store.create_round({}, "dead", 60)
    assert store.start_round(live)
    assert store.interrupt_expired_rounds() == 0  # both leases still run
    let_lease_run_out(store, "dead")
    assert store.renew_round_leases("alive", 60) == {live}  # 'dead' renews nothing
    assert store.interrupt_expired_rounds() == 1
    assert store.round(live).status == "running" and store.round(dead).status == "interrupted"
    assert "stopped while this round" in store.round(dead).error
    assert store.renew_round_leases("dead", 60) == set()  # too late: the round is over
    assert store.finish_round(live, "published", {}, new_version="v1-r1")
    assert store.renew_round_leases("alive", 60) == set()  # a finished round holds no lease


def test_a_round_starts_only_while_no_other_holds_a_live_lease(store):
    """Rounds run one at a time across every process on the store; a dead owner's round does not
    block the next one once its lease has expired."""
    running = store.create_round({}, "proc-a", 60)
    waiting = store.create_round({}, "proc-b", 60)
    assert store.start_round(running)
    assert not store.start_round(waiting) and store.round(waiting).status == "queued"
    let_lease_run_out(store, "proc-a")  # proc-a died without renewing
    assert store.start_round(waiting)
    assert store.interrupt_expired_rounds() == 1 and store.round(running).status == "interrupted"


def test_a_store_from_before_leases_gains_the_columns(tmp_path, database_url):
    """An existing store whose alignment-rounds table has no lease columns is upgraded in place;
    its unfinished rounds have no lease, so they count as expired."""
    Store(tmp_path, database_url).close()
    old = Store(tmp_path, database_url)
    with old.engine.begin() as db:  # the table as it was before leases: the same minus two columns
        for column in LEASE_COLUMNS:
            db.execute(text(f"ALTER TABLE alignment_rounds DROP COLUMN {column}"))
        db.execute(
            text("INSERT INTO alignment_rounds (status, params, created_at) VALUES ('running', '{}', 'x')")
        )
    old.close()
    store = Store(tmp_path, database_url)
    try:
        with store.engine.connect() as db:
            columns = {c["name"] for c in inspect(db).get_columns("alignment_rounds")}
        assert set(LEASE_COLUMNS) <= columns
        assert store.interrupt_expired_rounds() == 1 and store.round(1).status == "interrupted"
        leased = store.create_round({}, "proc-a", 60)  # the new columns work
        assert store.renew_round_leases("proc-a", 60) == {leased}
    finally:
        store.close()


def test_processes_importing_one_file_at_once_register_it_once(tmp_path, database_url):
    """Each worker of `harmony serve --workers N` (and each replica started together) imports the
    model dir's back-end at start: one version, whoever registers first; another file under the
    same name gets its hash as a suffix."""
    stores = [Store(tmp_path, database_url) for _ in range(4)]
    names, barrier = [], threading.Barrier(len(stores))

    def register(store):
        barrier.wait()
        names.append(store.add_imported_version(VersionRecord("v1", "a" * 64, None, "import", utc_now(), {})))

    threads = [threading.Thread(target=register, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert names == ["v1"] * len(stores)
        other = stores[0].add_imported_version(VersionRecord("v1", "b" * 64, None, "import", utc_now(), {}))
        assert other == "v1-bbbbbbbb" and stores[1].default_version() == "v1-bbbbbbbb"
        assert [v.version for v in stores[1].versions()] == ["v1", "v1-bbbbbbbb"]
    finally:
        for store in stores:
            store.close()


def test_versions_and_default(store):
    assert store.default_version() is None
    store.add_version(VersionRecord("v1", "a" * 64, None, "import", utc_now(), {"k": 1}), make_default=True)
    store.add_version(VersionRecord("v1-r1", "b" * 64, "v1", "alignment", utc_now(), {}), make_default=True)
    assert store.default_version() == "v1-r1"
    store.set_default_version("v1")
    assert store.default_version() == "v1" and store.version("v1").metrics == {"k": 1}
    assert store.version_by_sha256("b" * 64).parent == "v1"
    assert [v.version for v in store.versions()] == ["v1", "v1-r1"]


def test_database_urls(tmp_path):
    assert database_url(tmp_path, None) == f"sqlite:///{tmp_path / 'harmony.sqlite3'}"
    assert database_url(tmp_path, "postgresql://u:p@h/db") == "postgresql+psycopg://u:p@h/db"
    with pytest.raises(ValueError, match="unsupported database 'mysql'"):
        database_url(tmp_path, "mysql://h/db")


WRITER = textwrap.dedent(
    """
    import sys, uuid
    from tests.test_server_store import new_upload
    from harmony_mobile.server.services.store import Store
    store = Store(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
    while True:
        message_id = str(uuid.uuid4())
        store.add_upload(new_upload("dev_a", message_id))
        print(message_id, flush=True)  # acknowledged only after the commit returned
    """
)


def test_acknowledged_uploads_survive_sigkill(store, tmp_path, database_url):
    command = [sys.executable, "-c", WRITER, str(tmp_path)] + ([database_url] if database_url else [])
    writer = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    acknowledged = []
    deadline = time.monotonic() + 60
    while len(acknowledged) < 40 and time.monotonic() < deadline:
        acknowledged.append(writer.stdout.readline().strip())
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    assert len(acknowledged) == 40
    stored = {e.message_id for e in store.envelopes()}
    assert set(acknowledged) <= stored
