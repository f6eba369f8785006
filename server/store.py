"""Durable server state in SQLite (WAL) under the data directory.

Uploads are committed (synchronous=FULL) before the endpoint answers 201, so an acknowledged
upload survives a crash. Only the *sealed* envelope is stored: features and tokens exist in the
clear only inside the alignment worker (docs/PRIVACY.md). One connection behind a lock is plenty
for one server process; the scale-out path is PostgreSQL (DESIGN.md), not a cleverer SQLite.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DB_FILE = "harmony.sqlite3"

SCHEMA = """
CREATE TABLE IF NOT EXISTS devices (
    id          TEXT PRIMARY KEY,
    token_hash  TEXT NOT NULL UNIQUE,
    name        TEXT,
    tier        TEXT,
    created_at  TEXT NOT NULL,
    revoked_at  TEXT
);
CREATE TABLE IF NOT EXISTS uploads (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    device_id        TEXT NOT NULL REFERENCES devices(id),
    message_id       TEXT NOT NULL,
    round_id         INTEGER NOT NULL,
    envelope         BLOB NOT NULL,
    envelope_sha256  TEXT NOT NULL,
    rows             INTEGER NOT NULL,
    tier             TEXT NOT NULL,
    family           TEXT NOT NULL,
    model_version    TEXT NOT NULL,
    clip_norm        REAL,
    noise_multiplier REAL,
    received_at      TEXT NOT NULL,
    UNIQUE (device_id, message_id)
);
CREATE TABLE IF NOT EXISTS alignment_rounds (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    status         TEXT NOT NULL,
    params         TEXT NOT NULL,
    parent_version TEXT,
    new_version    TEXT,
    progress       REAL NOT NULL DEFAULT 0,
    metrics        TEXT NOT NULL DEFAULT '{}',
    error          TEXT,
    created_at     TEXT NOT NULL,
    started_at     TEXT,
    finished_at    TEXT
);
CREATE TABLE IF NOT EXISTS model_versions (
    version    TEXT PRIMARY KEY,
    sha256     TEXT NOT NULL,
    parent     TEXT,
    source     TEXT NOT NULL,
    created_at TEXT NOT NULL,
    metrics    TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS registry_state (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""

INT64_MAX = 2**63 - 1
UNFINISHED_ROUND_STATES = ("queued", "running")


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class DeviceRecord:
    id: str
    name: str | None
    tier: str | None
    created_at: str
    revoked_at: str | None


@dataclass(frozen=True)
class UploadReceipt:
    upload_id: int
    message_id: str
    rows: int
    received_at: str
    envelope_sha256: str


@dataclass(frozen=True)
class NewUpload:
    device_id: str
    message_id: str
    round_id: int
    envelope: bytes
    envelope_sha256: str
    rows: int
    tier: str
    family: str
    model_version: str
    clip_norm: float | None
    noise_multiplier: float | None


@dataclass(frozen=True)
class StoredEnvelope:
    """What the alignment worker reads back: enough to rebuild the AD and open the envelope."""

    upload_id: int
    device_id: str
    message_id: str
    round_id: int
    envelope: bytes


@dataclass(frozen=True)
class RoundRecord:
    id: int
    status: str
    params: dict[str, Any]
    parent_version: str | None
    new_version: str | None
    progress: float
    metrics: dict[str, Any]
    error: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None


@dataclass(frozen=True)
class VersionRecord:
    version: str
    sha256: str
    parent: str | None
    source: str
    created_at: str
    metrics: dict[str, Any]


class Store:
    def __init__(self, data_dir: Path):
        self.path = Path(data_dir) / DB_FILE
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # an acknowledged upload must survive power loss
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _query(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    # ---------------------------------------------------------------- devices

    def add_device(self, device_id: str, token_hash: str, name: str | None, tier: str | None) -> DeviceRecord:
        created = utc_now()
        with self._transaction() as db:
            db.execute(
                "INSERT INTO devices (id, token_hash, name, tier, created_at) VALUES (?, ?, ?, ?, ?)",
                (device_id, token_hash, name, tier, created),
            )
        return DeviceRecord(device_id, name, tier, created, None)

    def device_by_token_hash(self, token_hash: str) -> DeviceRecord | None:
        rows = self._query(
            "SELECT id, name, tier, created_at, revoked_at FROM devices WHERE token_hash = ?", (token_hash,)
        )
        return DeviceRecord(**dict(rows[0])) if rows else None

    def devices(self) -> list[DeviceRecord]:
        rows = self._query("SELECT id, name, tier, created_at, revoked_at FROM devices ORDER BY created_at")
        return [DeviceRecord(**dict(r)) for r in rows]

    def revoke_device(self, device_id: str) -> bool:
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE devices SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?", (utc_now(), device_id)
            )
            return cursor.rowcount == 1

    # ---------------------------------------------------------------- uploads

    def find_upload(self, device_id: str, message_id: str) -> UploadReceipt | None:
        rows = self._query(
            "SELECT id AS upload_id, message_id, rows, received_at, envelope_sha256 FROM uploads "
            "WHERE device_id = ? AND message_id = ?",
            (device_id, message_id),
        )
        return UploadReceipt(**dict(rows[0])) if rows else None

    def add_upload(self, upload: NewUpload) -> tuple[UploadReceipt, bool]:
        """Insert once per (device, message id); returns (receipt, inserted). Committed on return."""
        received = utc_now()
        try:
            with self._transaction() as db:
                cursor = db.execute(
                    "INSERT INTO uploads (device_id, message_id, round_id, envelope, envelope_sha256, rows, tier,"
                    " family, model_version, clip_norm, noise_multiplier, received_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        upload.device_id,
                        upload.message_id,
                        upload.round_id,
                        upload.envelope,
                        upload.envelope_sha256,
                        upload.rows,
                        upload.tier,
                        upload.family,
                        upload.model_version,
                        upload.clip_norm,
                        upload.noise_multiplier,
                        received,
                    ),
                )
                upload_id = cursor.lastrowid
        except sqlite3.IntegrityError:
            # A concurrent replay of the same message id won the race: report the stored one.
            existing = self.find_upload(upload.device_id, upload.message_id)
            if existing is None:
                raise
            return existing, False
        return UploadReceipt(
            upload_id, upload.message_id, upload.rows, received, upload.envelope_sha256
        ), True

    def upload_stats(self) -> dict[str, int]:
        row = self._query("SELECT COUNT(*) AS uploads, COALESCE(SUM(rows), 0) AS rows FROM uploads")[0]
        return {"uploads": row["uploads"], "rows": row["rows"]}

    def envelopes(self, limit_rows: int | None = None) -> list[StoredEnvelope]:
        """Stored envelopes, newest first, until `limit_rows` feature rows are covered (read lazily, so a
        large store is not loaded whole)."""
        result, covered = [], 0
        with self._lock:
            cursor = self._db.execute(
                "SELECT id, device_id, message_id, round_id, envelope, rows FROM uploads ORDER BY id DESC"
            )
            for r in cursor:
                if limit_rows is not None and covered >= limit_rows:
                    break
                result.append(
                    StoredEnvelope(r["id"], r["device_id"], r["message_id"], r["round_id"], r["envelope"])
                )
                covered += r["rows"]
            cursor.close()
        return result

    # ---------------------------------------------------------------- alignment rounds

    def create_round(self, params: dict[str, Any]) -> int:
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO alignment_rounds (status, params, created_at) VALUES ('queued', ?, ?)",
                (json.dumps(params), utc_now()),
            )
            return int(cursor.lastrowid)

    def start_round(self, round_id: int, parent_version: str) -> bool:
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE alignment_rounds SET status = 'running', started_at = ?, parent_version = ?"
                " WHERE id = ? AND status = 'queued'",
                (utc_now(), parent_version, round_id),
            )
            return cursor.rowcount == 1

    def update_round_progress(self, round_id: int, progress: float, metrics: dict[str, Any]) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE alignment_rounds SET progress = ?, metrics = ? WHERE id = ? AND status = 'running'",
                (progress, json.dumps(metrics), round_id),
            )

    def finish_round(
        self,
        round_id: int,
        status: str,
        metrics: dict[str, Any],
        new_version: str | None = None,
        error: str | None = None,
    ) -> bool:
        """Only a round still queued/running can finish: a worker that outlived a restart (which marked
        its round interrupted) must not overwrite that verdict."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE alignment_rounds SET status = ?, metrics = ?, new_version = ?, error = ?, finished_at = ?,"
                " progress = CASE WHEN ? = 'published' OR ? = 'rejected' THEN 1.0 ELSE progress END"
                " WHERE id = ? AND status IN ('queued', 'running')",
                (status, json.dumps(metrics), new_version, error, utc_now(), status, status, round_id),
            )
            return cursor.rowcount == 1

    def interrupt_unfinished_rounds(self) -> int:
        """On start: a round left queued/running belonged to a process that died."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE alignment_rounds SET status = 'interrupted', finished_at = ?,"
                " error = 'the server stopped while this round was queued or running'"
                " WHERE status IN ('queued', 'running')",
                (utc_now(),),
            )
            return cursor.rowcount

    def round(self, round_id: int) -> RoundRecord | None:
        if not 0 <= round_id <= INT64_MAX:  # no such row, and SQLite would raise on binding it
            return None
        rows = self._query("SELECT * FROM alignment_rounds WHERE id = ?", (round_id,))
        return self._round(rows[0]) if rows else None

    def rounds(self, limit: int = 50) -> list[RoundRecord]:
        rows = self._query("SELECT * FROM alignment_rounds ORDER BY id DESC LIMIT ?", (limit,))
        return [self._round(r) for r in rows]

    def round_counts(self) -> dict[str, int]:
        rows = self._query("SELECT status, COUNT(*) AS n FROM alignment_rounds GROUP BY status")
        return {r["status"]: r["n"] for r in rows}

    @staticmethod
    def _round(row: sqlite3.Row) -> RoundRecord:
        data = dict(row)
        data["params"] = json.loads(data["params"])
        data["metrics"] = json.loads(data["metrics"])
        return RoundRecord(**data)

    # ---------------------------------------------------------------- model versions

    def add_version(self, record: VersionRecord, make_default: bool) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO model_versions (version, sha256, parent, source, created_at, metrics)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    record.version,
                    record.sha256,
                    record.parent,
                    record.source,
                    record.created_at,
                    json.dumps(record.metrics),
                ),
            )
            if make_default:
                self._set_default(db, record.version)

    def versions(self) -> list[VersionRecord]:
        rows = self._query("SELECT * FROM model_versions ORDER BY created_at, version")
        return [self._version(r) for r in rows]

    def version(self, version: str) -> VersionRecord | None:
        rows = self._query("SELECT * FROM model_versions WHERE version = ?", (version,))
        return self._version(rows[0]) if rows else None

    def version_by_sha256(self, sha256: str) -> VersionRecord | None:
        rows = self._query(
            "SELECT * FROM model_versions WHERE sha256 = ? ORDER BY created_at LIMIT 1", (sha256,)
        )
        return self._version(rows[0]) if rows else None

    def default_version(self) -> str | None:
        rows = self._query("SELECT value FROM registry_state WHERE key = 'default_version'")
        return rows[0]["value"] if rows else None

    def set_default_version(self, version: str) -> None:
        with self._transaction() as db:
            self._set_default(db, version)

    @staticmethod
    def _set_default(db: sqlite3.Connection, version: str) -> None:
        db.execute(
            "INSERT INTO registry_state (key, value) VALUES ('default_version', ?)"
            " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (version,),
        )

    @staticmethod
    def _version(row: sqlite3.Row) -> VersionRecord:
        data = dict(row)
        data["metrics"] = json.loads(data["metrics"])
        return VersionRecord(**data)
