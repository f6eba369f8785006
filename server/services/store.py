"""Durable server state behind one interface, on SQLAlchemy 2 with two backends:

* embedded SQLite (the default): `<data-dir>/harmony.sqlite3`, WAL, synchronous=FULL, every write
  transaction `BEGIN IMMEDIATE`, so concurrent writers queue instead of failing late;
* PostgreSQL (`--database-url postgresql://...`, psycopg 3): what several server replicas behind a
  load balancer share. Commits wait for the WAL flush (synchronous_commit on, the default).

Alignment rounds carry a lease: the process that runs a round (its `owner`) renews
`lease_expires_at` while the round is queued or running, and any process marks a round whose lease
expired `interrupted`. Lease times are the *database's* clock (`db_epoch_now`), so replicas on
machines whose clocks disagree still agree on which leases expired.

Uploads are committed before the endpoint answers 201, so an acknowledged upload survives a crash.
Only the *sealed* envelope is stored: features and tokens exist in the clear only inside the
alignment worker (docs/PRIVACY.md). Idempotency is the UNIQUE (device_id, message_id) constraint,
so it holds across replicas, not only inside one process.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harmony_mobile.server.core.records import (
    DeviceRecord,
    NewUpload,
    RoundRecord,
    StoredEnvelope,
    UploadReceipt,
    VersionRecord,
)
from harmony_mobile.server.core.settings import database_scheme
from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    func,
    insert,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

DB_FILE = "harmony.sqlite3"
INT64_MAX = 2**63 - 1
UNFINISHED_ROUND_STATES = ("queued", "running")
SCHEMA_LOCK_ID = 0x4841524D  # pg_advisory_xact_lock key: replicas starting together create tables once
ROUND_START_LOCK_ID = 0x48524E44  # pg_advisory_xact_lock key: one round starts at a time across replicas
REGISTRY_LOCK_ID = 0x48524547  # pg_advisory_xact_lock key: an imported file is registered once
INTERRUPTED_ERROR = "the server stopped while this round was queued or running"

# SQLite needs INTEGER (not BIGINT) for an auto-increment primary key; both hold int64.
ID = BigInteger().with_variant(Integer, "sqlite")

metadata = MetaData()
devices = Table(
    "devices",
    metadata,
    Column("id", Text, primary_key=True),
    Column("token_hash", Text, nullable=False, unique=True),
    Column("name", Text),
    Column("tier", Text),
    Column("created_at", Text, nullable=False),
    Column("revoked_at", Text),
)
uploads = Table(
    "uploads",
    metadata,
    Column("id", ID, primary_key=True, autoincrement=True),
    Column("device_id", Text, ForeignKey("devices.id"), nullable=False),
    Column("message_id", Text, nullable=False),
    Column("label_epoch", Text, nullable=False),
    Column("envelope", LargeBinary, nullable=False),
    Column("envelope_sha256", Text, nullable=False),
    Column("rows", Integer, nullable=False),
    Column("tier", Text, nullable=False),
    Column("family", Text, nullable=False),
    Column("model_version", Text, nullable=False),
    Column("clip_norm", Float),
    Column("noise_multiplier", Float),
    Column("label_dp_epsilon", Float),
    Column("received_at", Text, nullable=False),
    UniqueConstraint("device_id", "message_id"),
    sqlite_autoincrement=True,
)
alignment_rounds = Table(
    "alignment_rounds",
    metadata,
    Column("id", ID, primary_key=True, autoincrement=True),
    Column("status", Text, nullable=False),
    Column("params", Text, nullable=False),
    Column("parent_version", Text),
    Column("new_version", Text),
    Column("progress", Float, nullable=False, server_default="0"),
    Column("metrics", Text, nullable=False, server_default="{}"),
    Column("error", Text),
    Column("created_at", Text, nullable=False),
    Column("started_at", Text),
    Column("finished_at", Text),
    Column("owner", Text),  # host:pid:random of the process running the round
    Column("lease_expires_at", Float),  # seconds since the epoch, database clock; NULL = expired
    sqlite_autoincrement=True,
)
LEASE_COLUMNS = ("owner", "lease_expires_at")
model_versions = Table(
    "model_versions",
    metadata,
    Column("version", Text, primary_key=True),
    Column("sha256", Text, nullable=False),
    Column("parent", Text),
    Column("source", Text, nullable=False),
    Column("created_at", Text, nullable=False),
    Column("metrics", Text, nullable=False, server_default="{}"),
)
model_artifacts = Table(
    "model_artifacts",
    metadata,
    Column("sha256", Text, primary_key=True),
    Column("content", LargeBinary, nullable=False),
)
registry_state = Table(
    "registry_state",
    metadata,
    Column("key", Text, primary_key=True),
    Column("value", Text, nullable=False),
)
# every change of the default version, for the status page's history (a store made before this
# table existed starts its history at the first change after the upgrade)
default_history = Table(
    "default_history",
    metadata,
    Column("id", ID, primary_key=True, autoincrement=True),
    Column("version", Text, nullable=False),
    Column("set_at", Text, nullable=False),
)


class db_epoch_now(FunctionElement):
    """The database server's clock in seconds since the epoch (float): lease times come from one clock."""

    type = Float()
    inherit_cache = True


@compiles(db_epoch_now, "postgresql")
def _postgresql_epoch_now(element, compiler, **kw) -> str:
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"


@compiles(db_epoch_now, "sqlite")
def _sqlite_epoch_now(element, compiler, **kw) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def database_url(data_dir: Path, url: str | None) -> str:
    """`postgresql://` means psycopg 3 (SQLAlchemy's default PostgreSQL driver is psycopg2)."""
    if url is None:
        return f"sqlite:///{Path(data_dir) / DB_FILE}"
    database_scheme(url)  # ValueError for another database, before the URL is parsed
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def _sqlite_engine(url: str) -> Engine:
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 5.0})

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy issues BEGIN itself (below)
        for pragma in ("journal_mode=WAL", "synchronous=FULL", "foreign_keys=ON", "busy_timeout=5000"):
            dbapi_connection.execute(f"PRAGMA {pragma}")

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        # A writer takes the write lock up front: a deferred BEGIN that upgrades later can deadlock.
        immediate = connection.get_execution_options().get("write", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def make_engine(data_dir: Path, url: str | None) -> Engine:
    resolved = database_url(data_dir, url)
    if resolved.startswith("sqlite"):
        if url is None:  # owner-only: SQLite gives its journal files the database's mode
            descriptor = os.open(Path(data_dir) / DB_FILE, os.O_WRONLY | os.O_CREAT, 0o600)
            os.fchmod(descriptor, 0o600)  # a store made before with wider permissions
            os.close(descriptor)
        return _sqlite_engine(resolved)
    return create_engine(resolved, pool_pre_ping=True, pool_size=8, max_overflow=8)


class Store:
    def __init__(self, data_dir: Path, database_url: str | None = None):
        self.engine = make_engine(data_dir, database_url)
        self.backend = self.engine.dialect.name  # "sqlite" or "postgresql"
        self.path = Path(data_dir) / DB_FILE if self.backend == "sqlite" else None
        self._writer = self.engine.execution_options(write=True)
        with self._transaction() as db:
            self._serialize_writers(db, SCHEMA_LOCK_ID)
            metadata.create_all(db)
            self._add_lease_columns(db)

    def _add_lease_columns(self, db: Connection) -> None:
        """A store created before rounds had leases gets the two (nullable) columns; its unfinished
        rounds have no lease, so they count as expired."""
        existing = {column["name"] for column in inspect(db).get_columns("alignment_rounds")}
        for name in LEASE_COLUMNS:
            if name not in existing:
                column_type = alignment_rounds.c[name].type.compile(dialect=db.dialect)
                db.execute(text(f"ALTER TABLE alignment_rounds ADD COLUMN {name} {column_type}"))

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        """One write transaction, committed on exit (rolled back on an exception)."""
        with self._writer.begin() as db:
            yield db

    def _serialize_writers(self, db: Connection, lock_id: int) -> None:
        """Within a write transaction, let one process at a time past this point: an advisory lock on
        PostgreSQL, held to the transaction's end; SQLite's BEGIN IMMEDIATE already serializes writers."""
        if self.backend == "postgresql":
            db.execute(select(func.pg_advisory_xact_lock(lock_id)))

    def _rows(self, statement) -> list[dict[str, Any]]:
        with self.engine.connect() as db:
            return [dict(row._mapping) for row in db.execute(statement)]

    # ---------------------------------------------------------------- devices

    def add_device(self, device_id: str, token_hash: str, name: str | None, tier: str | None) -> DeviceRecord:
        created = utc_now()
        with self._transaction() as db:
            db.execute(
                insert(devices).values(
                    id=device_id, token_hash=token_hash, name=name, tier=tier, created_at=created
                )
            )
        return DeviceRecord(device_id, name, tier, created, None)

    _DEVICE_COLUMNS = (
        devices.c.id,
        devices.c.name,
        devices.c.tier,
        devices.c.created_at,
        devices.c.revoked_at,
    )

    def device_by_token_hash(self, token_hash: str) -> DeviceRecord | None:
        rows = self._rows(select(*self._DEVICE_COLUMNS).where(devices.c.token_hash == token_hash))
        return DeviceRecord(**rows[0]) if rows else None

    def devices(self) -> list[DeviceRecord]:
        rows = self._rows(select(*self._DEVICE_COLUMNS).order_by(devices.c.created_at))
        return [DeviceRecord(**r) for r in rows]

    def revoke_device(self, device_id: str) -> bool:
        with self._transaction() as db:
            result = db.execute(
                update(devices)
                .where(devices.c.id == device_id)
                .values(revoked_at=func.coalesce(devices.c.revoked_at, utc_now()))
            )
            return result.rowcount == 1

    # ---------------------------------------------------------------- uploads

    def find_upload(self, device_id: str, message_id: str) -> UploadReceipt | None:
        rows = self._rows(
            select(
                uploads.c.id.label("upload_id"),
                uploads.c.message_id,
                uploads.c.rows,
                uploads.c.received_at,
                uploads.c.envelope_sha256,
            ).where(uploads.c.device_id == device_id, uploads.c.message_id == message_id)
        )
        return UploadReceipt(**rows[0]) if rows else None

    def add_upload(self, upload: NewUpload) -> tuple[UploadReceipt, bool]:
        """Insert once per (device, message id); returns (receipt, inserted). Committed on return."""
        received = utc_now()
        try:
            with self._transaction() as db:
                result = db.execute(insert(uploads).values(**upload.__dict__, received_at=received))
                upload_id = int(result.inserted_primary_key[0])
        except IntegrityError:
            # A concurrent replay of the same message id (here or on another replica) won the race.
            existing = self.find_upload(upload.device_id, upload.message_id)
            if existing is None:
                raise
            return existing, False
        return UploadReceipt(
            upload_id, upload.message_id, upload.rows, received, upload.envelope_sha256
        ), True

    def upload_volume(self, limit: int = 20_000) -> list[tuple[str, int, int]]:
        """(received_at, rows, envelope bytes) of the last `limit` uploads, oldest first."""
        size = func.length(uploads.c.envelope).label("size")
        statement = select(uploads.c.received_at, uploads.c.rows, size).order_by(uploads.c.id.desc())
        rows = self._rows(statement.limit(limit))
        return [(r["received_at"], int(r["rows"]), int(r["size"])) for r in reversed(rows)]

    def upload_stats(self) -> dict[str, int]:
        row = self._rows(select(func.count().label("uploads"), func.coalesce(func.sum(uploads.c.rows), 0)))[0]
        values = list(row.values())
        return {"uploads": int(values[0]), "rows": int(values[1])}

    def envelopes(
        self, limit_rows: int | None = None, label_epoch: str | None = None
    ) -> list[StoredEnvelope]:
        """Stored envelopes (of one label epoch, if given), newest first, until `limit_rows` feature rows
        are covered (streamed, so a large store is not loaded whole)."""
        result, covered = [], 0
        statement = select(
            uploads.c.id,
            uploads.c.device_id,
            uploads.c.message_id,
            uploads.c.label_epoch,
            uploads.c.envelope,
            uploads.c.rows,
        ).order_by(uploads.c.id.desc())
        if label_epoch is not None:
            statement = statement.where(uploads.c.label_epoch == label_epoch)
        with self.engine.connect() as db:
            for r in db.execution_options(stream_results=True, yield_per=256).execute(statement):
                if limit_rows is not None and covered >= limit_rows:
                    break
                result.append(
                    StoredEnvelope(r.id, r.device_id, r.message_id, r.label_epoch, bytes(r.envelope))
                )
                covered += r.rows
        return result

    # ---------------------------------------------------------------- alignment rounds

    def create_round(self, params: dict[str, Any], owner: str, lease_seconds: float) -> int:
        """A queued round leased to `owner` (the process that will run it) for `lease_seconds`."""
        with self._transaction() as db:
            result = db.execute(
                insert(alignment_rounds).values(
                    status="queued",
                    params=json.dumps(params),
                    created_at=utc_now(),
                    owner=owner,
                    lease_expires_at=db_epoch_now() + lease_seconds,
                )
            )
            return int(result.inserted_primary_key[0])

    def start_round(self, round_id: int) -> bool:
        """queued -> running, only while no other round runs under a live lease: rounds run one at a
        time across every process that shares the store. False = still waiting, or no longer queued."""
        with self._transaction() as db:
            self._serialize_writers(db, ROUND_START_LOCK_ID)
            other = alignment_rounds.alias("other")
            another_running = (
                select(other.c.id)
                .where(
                    other.c.status == "running",
                    other.c.id != round_id,
                    other.c.lease_expires_at >= db_epoch_now(),
                )
                .exists()
            )
            result = db.execute(
                update(alignment_rounds)
                .where(
                    alignment_rounds.c.id == round_id, alignment_rounds.c.status == "queued", ~another_running
                )
                .values(status="running", started_at=utc_now())
            )
            return result.rowcount == 1

    def set_round_parent(self, round_id: int, parent_version: str) -> None:
        """The version the running round fine-tunes (read once the round has started)."""
        with self._transaction() as db:
            db.execute(
                update(alignment_rounds)
                .where(alignment_rounds.c.id == round_id)
                .values(parent_version=parent_version)
            )

    def update_round_progress(self, round_id: int, progress: float, metrics: dict[str, Any]) -> None:
        with self._transaction() as db:
            db.execute(
                update(alignment_rounds)
                .where(alignment_rounds.c.id == round_id, alignment_rounds.c.status == "running")
                .values(progress=progress, metrics=json.dumps(metrics))
            )

    def finish_round(
        self,
        round_id: int,
        status: str,
        metrics: dict[str, Any],
        new_version: str | None = None,
        error: str | None = None,
    ) -> bool:
        """Only a round still queued/running can finish: a worker whose lease expired (its round was
        marked interrupted meanwhile) must not overwrite that verdict."""
        values: dict[str, Any] = dict(
            status=status,
            metrics=json.dumps(metrics),
            new_version=new_version,
            error=error,
            finished_at=utc_now(),
            lease_expires_at=None,
        )
        if status in ("published", "rejected"):
            values["progress"] = 1.0
        with self._transaction() as db:
            result = db.execute(
                update(alignment_rounds)
                .where(
                    alignment_rounds.c.id == round_id, alignment_rounds.c.status.in_(UNFINISHED_ROUND_STATES)
                )
                .values(**values)
            )
            return result.rowcount == 1

    def renew_round_leases(self, owner: str, lease_seconds: float) -> set[int]:
        """Extend the lease of every unfinished round `owner` holds; returns their ids (a round of
        `owner` missing from it was marked interrupted by another process: its lease had expired)."""
        with self._transaction() as db:
            result = db.execute(
                update(alignment_rounds)
                .where(
                    alignment_rounds.c.owner == owner,
                    alignment_rounds.c.status.in_(UNFINISHED_ROUND_STATES),
                )
                .values(lease_expires_at=db_epoch_now() + lease_seconds)
                .returning(alignment_rounds.c.id)
            )
            return {int(row.id) for row in result}

    def interrupt_expired_rounds(self) -> int:
        """Mark `interrupted` every unfinished round whose lease expired: its process died or froze
        (a live one renews well before expiry). Safe to call from any process at any time."""
        expired = alignment_rounds.c.lease_expires_at.is_(None) | (
            alignment_rounds.c.lease_expires_at < db_epoch_now()
        )
        return self._interrupt(alignment_rounds.c.status.in_(UNFINISHED_ROUND_STATES) & expired)

    def interrupt_rounds_of(self, owner: str) -> int:
        """On a graceful shutdown: the unfinished rounds this process holds."""
        return self._interrupt(
            alignment_rounds.c.status.in_(UNFINISHED_ROUND_STATES) & (alignment_rounds.c.owner == owner)
        )

    def _interrupt(self, condition) -> int:
        with self._transaction() as db:
            result = db.execute(
                update(alignment_rounds)
                .where(condition)
                .values(
                    status="interrupted",
                    finished_at=utc_now(),
                    error=INTERRUPTED_ERROR,
                    lease_expires_at=None,
                )
            )
            return result.rowcount

    _ROUND_COLUMNS = tuple(c for c in alignment_rounds.c if c.name not in LEASE_COLUMNS)

    def round(self, round_id: int) -> RoundRecord | None:
        if not 0 <= round_id <= INT64_MAX:  # no such row, and the driver would refuse to bind it
            return None
        rows = self._rows(select(*self._ROUND_COLUMNS).where(alignment_rounds.c.id == round_id))
        return self._round(rows[0]) if rows else None

    def rounds(self, limit: int = 50) -> list[RoundRecord]:
        rows = self._rows(select(*self._ROUND_COLUMNS).order_by(alignment_rounds.c.id.desc()).limit(limit))
        return [self._round(r) for r in rows]

    def round_counts(self) -> dict[str, int]:
        statement = select(alignment_rounds.c.status, func.count()).group_by(alignment_rounds.c.status)
        with self.engine.connect() as db:
            return {status: int(n) for status, n in db.execute(statement)}

    @staticmethod
    def _round(data: dict[str, Any]) -> RoundRecord:
        data["params"] = json.loads(data["params"])
        data["metrics"] = json.loads(data["metrics"])
        return RoundRecord(**data)

    # ---------------------------------------------------------------- model versions

    def add_version(self, record: VersionRecord, make_default: bool) -> None:
        with self._transaction() as db:
            self._insert_version(db, record)
            if make_default:
                self._set_default(db, record.version)

    @staticmethod
    def _insert_version(db, record: VersionRecord) -> None:
        db.execute(
            insert(model_versions).values(**{**record.__dict__, "metrics": json.dumps(record.metrics)})
        )

    def add_imported_version(self, record: VersionRecord) -> str:
        """Register an imported back-end file once, however many processes import it at the same time
        (the workers of one `harmony serve --workers N`, replicas started together): in one write
        transaction, a file already registered keeps its version, and a name already taken by another
        file gets the file's hash as a suffix. Returns the version the file is registered under."""
        with self._transaction() as db:
            self._serialize_writers(db, REGISTRY_LOCK_ID)
            by_file = select(model_versions.c.version).where(model_versions.c.sha256 == record.sha256)
            known = db.execute(by_file.order_by(model_versions.c.created_at).limit(1)).scalar()
            if known is not None:
                return known
            name = record.version
            if db.execute(select(model_versions.c.version).where(model_versions.c.version == name)).first():
                name = f"{name}-{record.sha256[:8]}"
            self._insert_version(db, replace(record, version=name))
            self._set_default(db, name)
            return name

    def versions(self) -> list[VersionRecord]:
        rows = self._rows(
            select(model_versions).order_by(model_versions.c.created_at, model_versions.c.version)
        )
        return [self._version(r) for r in rows]

    def version(self, version: str) -> VersionRecord | None:
        rows = self._rows(select(model_versions).where(model_versions.c.version == version))
        return self._version(rows[0]) if rows else None

    def version_by_sha256(self, sha256: str) -> VersionRecord | None:
        rows = self._rows(
            select(model_versions)
            .where(model_versions.c.sha256 == sha256)
            .order_by(model_versions.c.created_at)
            .limit(1)
        )
        return self._version(rows[0]) if rows else None

    def add_artifact(self, sha256: str, content: bytes) -> None:
        """A back-end file by content address, so every replica can load every version (idempotent)."""
        dialect_insert = pg_insert if self.backend == "postgresql" else sqlite_insert
        with self._transaction() as db:
            db.execute(
                dialect_insert(model_artifacts)
                .values(sha256=sha256, content=content)
                .on_conflict_do_nothing()
            )

    def artifact(self, sha256: str) -> bytes | None:
        rows = self._rows(select(model_artifacts.c.content).where(model_artifacts.c.sha256 == sha256))
        return bytes(rows[0]["content"]) if rows else None

    def default_version(self) -> str | None:
        rows = self._rows(select(registry_state.c.value).where(registry_state.c.key == "default_version"))
        return rows[0]["value"] if rows else None

    def set_default_version(self, version: str) -> None:
        with self._transaction() as db:
            self._set_default(db, version)

    def _set_default(self, db: Connection, version: str) -> None:
        current = db.execute(
            select(registry_state.c.value).where(registry_state.c.key == "default_version")
        ).scalar()
        dialect_insert = pg_insert if self.backend == "postgresql" else sqlite_insert
        statement = dialect_insert(registry_state).values(key="default_version", value=version)
        db.execute(statement.on_conflict_do_update(index_elements=["key"], set_={"value": version}))
        if current != version:
            db.execute(insert(default_history).values(version=version, set_at=utc_now()))

    def default_history(self, limit: int = 500) -> list[tuple[str, str]]:
        """(set_at, version) of the last `limit` changes of the default version, oldest first."""
        statement = select(default_history.c.set_at, default_history.c.version)
        rows = self._rows(statement.order_by(default_history.c.id.desc()).limit(limit))
        return [(r["set_at"], r["version"]) for r in reversed(rows)]

    @staticmethod
    def _version(data: dict[str, Any]) -> VersionRecord:
        data["metrics"] = json.loads(data["metrics"])
        return VersionRecord(**data)
