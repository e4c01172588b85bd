"""The lease database file: opening it, its schema, reading its leases back.

The file is leases.sqlite3 in the state dir, the only allocation state that survives a
restart. Leases name users and jobs, so the directory and each file of the database are
private, made so through descriptors (see open_database).

The database is opened in EXCLUSIVE locking mode: the writer's connection holds the
file's lock for the daemon's life (a second topod, or any other writer, is refused with a
clear message rather than racing it), and SQLite keeps the WAL index in heap memory
instead of a mapped -shm file. A mapping is what turned an I/O fault (a file made
immutable, a page the disk could not back) into SIGBUS and the death of the daemon; now it
is an error of that commit, undone and reported. SQLite's automatic checkpoints are off:
the writer thread checkpoints between batches (topod.service.lease_writer).

A database that is not SQLite, is damaged, or holds a row that does not read back is left
exactly as it is and stops the start: topod will not guess which GPUs it held.

The files at the path are what the next start reads, so the writer checks them against
the ones it opened (ledger_files) around every commit. When they differ (the database or
its WAL deleted, replaced, or a journal planted beside them), the leases the writer's
connection holds are copied into memory (rescue) and written as a complete new database
at the path (rebuild_at: a temporary file, fsync, the stale WAL and journal removed,
rename, fsync of the directory).
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path

from topod.cappedread import file_kind
from topod.config import SQLITE_SYNCHRONOUS
from topod.errors import TopodError
from topod.service.lease import Lease

SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
    id TEXT PRIMARY KEY,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS lease_devices (
    address TEXT PRIMARY KEY,
    lease_id TEXT NOT NULL REFERENCES leases(id) ON DELETE CASCADE
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
SCHEMA_VERSION = "2"  # 1: lease_gpus keyed by GPU index, decision as an untyped dict
BUSY_TIMEOUT_MS = 5000  # sqlite3.connect's default, made explicit


# The store's errors live here, in the lowest of its modules: opening the file raises
# LeaseStoreError, the writer both; topod.service.lease_store re-exports them.
class LeaseConflictError(TopodError):
    code = "gpu_already_leased"


class LeaseStoreError(TopodError):
    """The lease database could not be written: the change was undone."""

    code = "state_write_failed"


class LeaseStoreFullError(LeaseStoreError):
    """The state dir's disk is (nearly) full: grants are refused so that releases, which
    need less room, still go through."""

    code = "state_disk_full"
    retryable = True


def open_database(state_dir: str | Path, synchronous: str) -> tuple[Path, sqlite3.Connection]:
    """(the database's path, a connection to it for the writer thread), its schema current.
    synchronous: one of SQLITE_SYNCHRONOUS (LeaseStore says what each keeps on power loss)."""
    if synchronous not in SQLITE_SYNCHRONOUS:
        raise ValueError(f"synchronous must be one of {', '.join(SQLITE_SYNCHRONOUS)}, got {synchronous!r}")
    directory = Path(state_dir)
    _private_directory(directory)
    path = directory / "leases.sqlite3"
    # Each file of the database is a regular file of its own, made private through its
    # descriptor: a link planted in its place is refused, never followed (a chmod by
    # path would change whatever it names: /dev/zero, another daemon's state).
    for suffix in ("-wal", "-shm", ""):
        _private_file(Path(f"{path}{suffix}"), create=not suffix)
    db: sqlite3.Connection | None = None
    try:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000)
        # Before the first access in WAL mode: no -shm mapping, the lock held for life.
        db.execute("PRAGMA locking_mode=EXCLUSIVE")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={synchronous.upper()}")
        db.execute("PRAGMA foreign_keys=ON")
        db.execute("PRAGMA wal_autocheckpoint=0")  # see lease_writer.CHECKPOINT_EVERY_COMMITS
        _migrate(db, path)
    except BaseException as exc:
        close_quietly(db)
        if isinstance(exc, sqlite3.OperationalError):
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise LeaseStoreError(f"lease database {path}: {exc}") from None
            raise LeaseStoreError(f"lease database {path} is held by another process (a second topod on "
                                  "this state dir?); topod does not share it: stop the other one") from None
        if isinstance(exc, sqlite3.DatabaseError):  # not SQLite, or damaged: left exactly as it is
            raise LeaseStoreError(f"lease database {path}: {exc}. topod leaves it untouched and will not "
                                  "guess which GPUs it held: repair it, or move it away to start with no "
                                  "leases") from None
        raise
    for suffix in ("-wal", "-shm"):  # SQLite has just made them, with the umask's mode
        _private_file(Path(f"{path}{suffix}"), create=False)
    return path, db


# SQLite appends each commit's frames to the WAL until a checkpoint lets it write the file
# from its start again, and an append makes fdatasync write the file's new size as well:
# 0.27 against 0.15 ms a commit on this VM's disk, the fsync floor 0.10. The writer
# checkpoints every CHECKPOINT_EVERY_COMMITS (lease_writer) commits, so a node that grants a
# few leases an hour would append for days after each start. The WAL is given this much of
# zeros once (reserve_wal): SQLite reads frames only up to the first that fails its salt and
# checksum, so the zeros are not frames, and commits overwrite blocks the file already has.
# 200 commits of 4-9 pages each (one lease change each, or a batch under load) fit.
WAL_RESERVE_BYTES = 8 << 20


def reserve_wal(path: Path, size: int | None = None) -> str | None:
    """Extend the database's WAL with zeros up to `size` bytes (WAL_RESERVE_BYTES), made
    durable; None when done (or not needed), else why not. Only while nothing else writes
    the database (the writer holds its lock): the zeros go past the file's end, which
    SQLite writes only in a commit. A failed write gives the space back (a full disk keeps
    its last blocks)."""
    size = WAL_RESERVE_BYTES if size is None else size
    try:
        fd = os.open(f"{path}-wal", os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return f"{path}-wal: {exc.strerror or exc}"
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            return f"{path}-wal: {file_kind(found.st_mode)}, not a regular file"
        end = offset = found.st_size
        zeros = memoryview(bytes(min(1 << 20, max(0, size - end))))  # sliced without a copy
        try:
            while offset < size:
                offset += os.pwrite(fd, zeros[:size - offset], offset)
            if offset > end:
                os.fdatasync(fd)
        except OSError as exc:
            try:
                os.ftruncate(fd, end)
            except OSError:
                pass
            return f"{path}-wal: {exc.strerror or exc}"
        return None
    finally:
        os.close(fd)


def close_quietly(db: sqlite3.Connection | None) -> None:
    """A store that failed to open lets go of the file (and its lock) at once: a repaired
    file can be opened again, by this process too."""
    if db is not None:
        try:
            db.close()
        except sqlite3.Error:
            pass


def _migrate(db: sqlite3.Connection, path: Path) -> None:
    db.executescript(SCHEMA)
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    version = row[0] if row else None
    if version == "1":
        db.execute("BEGIN IMMEDIATE")
        try:
            for lease_id, body in db.execute("SELECT id, body FROM leases").fetchall():
                lease = Lease.from_json(json.loads(body))
                db.execute("UPDATE leases SET body = ? WHERE id = ?", (json.dumps(lease.to_json()), lease_id))
                db.executemany("INSERT INTO lease_devices VALUES (?, ?)",
                               [(address, lease.id) for address in lease.addresses])
            db.execute("DROP TABLE IF EXISTS lease_gpus")
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    elif version is None:
        db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
    elif version != SCHEMA_VERSION:
        raise TopodError(f"{path}: lease database schema {version} is newer than this topod "
                         f"({SCHEMA_VERSION}); upgrade topod or move the file away")


def load_leases(db: sqlite3.Connection, path: Path) -> list[Lease]:
    """Every lease in the database, in the order they were written."""
    rows = db.execute("SELECT id, body FROM leases ORDER BY rowid").fetchall()
    leases = []
    for lease_id, body in rows:
        try:
            leases.append(Lease.from_json(json.loads(body)))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # Dropping it would free GPUs a job may still hold: refuse, say which row.
            raise TopodError(f"{path}: lease {lease_id!r} is unreadable ({type(exc).__name__}: {exc}); "
                             "topod will not guess what it held. Release its GPUs by hand and delete "
                             "the row, or move the database away") from exc
    return leases


# What the next start reads: the database, its WAL, and a rollback journal (never ours in WAL
# mode; one planted beside the database would be rolled back into it at the next open).
LEDGER_SUFFIXES = {"database": "", "wal": "-wal", "journal": "-journal"}


def ledger_files(path: Path) -> dict[str, tuple[int, int] | None]:
    """The identity of the state dir and of each ledger file at `path` now."""
    found = {"directory": file_identity(path.parent)}
    for name, suffix in LEDGER_SUFFIXES.items():
        found[name] = file_identity(Path(f"{path}{suffix}"))
    return found


def ledger_difference(expected: dict[str, tuple[int, int] | None],
                      found: dict[str, tuple[int, int] | None]) -> str | None:
    """How the files found at the path differ from those the writer opened, or None."""
    for name, identity in expected.items():
        now = found.get(name)
        if now == identity:
            continue
        if identity is None:
            return f"a {name} file appeared beside it"
        return f"its {name} was deleted" if now is None else f"its {name} was replaced by another file"
    return None


def rescue(db: sqlite3.Connection) -> sqlite3.Connection:
    """What `db` holds, every committed change included, copied into memory: the connection
    reads through its own descriptors, so a database or WAL unlinked or replaced at the path
    still reads back as it was written."""
    copy = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    try:
        db.backup(copy)
        copy.execute("SELECT count(*) FROM leases").fetchone()
    except BaseException:
        copy.close()
        raise
    return copy


def rebuild_at(path: Path, source: sqlite3.Connection, synchronous: str,
               release_old: Callable[[], None]) -> sqlite3.Connection:
    """A complete database written at `path` from `source`, atomically, and the writer's
    new connection to it. The WAL and journal at the path are removed just before the
    rename: SQLite applies whatever WAL it finds beside a database, and a stale one would
    write pages of the old file into the new. release_old() closes the old connection once
    the new file is in place and before it is opened: a WAL database's close checkpoints
    into its own file, then deletes the WAL *by path*, which must not yet be the new one's."""
    _private_directory(path.parent)
    temporary = path.with_name(f".{path.name}.rebuild-{os.getpid()}")
    for leftover in (temporary, Path(f"{temporary}-journal")):
        _remove_if_present(leftover)
    copy = sqlite3.connect(temporary, isolation_level=None, check_same_thread=False)
    try:
        source.backup(copy)
    finally:
        copy.close()
    _fsync_file(temporary)
    for suffix in ("-wal", "-journal", "-shm"):
        _remove_if_present(Path(f"{path}{suffix}"))
    os.rename(temporary, path)
    _fsync_file(path.parent)
    release_old()
    return open_database(path.parent, synchronous)[1]


def _remove_if_present(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def io_fault(path: Path) -> str | None:
    """An I/O error the disk gives now reading the ledger's files (EIO hides behind SQLite's
    'disk image is malformed'), named with its errno and file; None when they read."""
    for suffix in ("", "-wal"):
        name = f"{path}{suffix}"
        try:
            fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"{errno.errorcode.get(exc.errno, exc.errno)} opening {name}: {exc.strerror}"
        try:
            os.pread(fd, 4096, 0)
        except OSError as exc:
            return f"{errno.errorcode.get(exc.errno, exc.errno)} reading {name}: {exc.strerror}"
        finally:
            os.close(fd)
    return None


def file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of what `path` names now, None when nothing does."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _private_directory(directory: Path) -> None:
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:  # mkdir's exist_ok covers directories only
        raise LeaseStoreError(f"state directory {directory}: exists and is not a directory") from None
    except OSError as exc:
        raise LeaseStoreError(f"state directory {directory}: cannot create it: {exc.strerror or exc}") from None
    os.chmod(directory, 0o700)  # leases name users and jobs: not for every local user


def _private_file(path: Path, *, create: bool) -> None:
    """Mode 0600 on `path`, a regular file (made when `create`); LeaseStoreError for a
    link, a FIFO, a device or a directory in its place. Nothing but a regular file is
    opened (a device can act when opened)."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        found = None
    except OSError as exc:
        raise LeaseStoreError(f"{path}: cannot inspect it: {exc.strerror or exc}") from None
    if found is None and not create:
        return
    if found is not None and not stat.S_ISREG(found.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(found.st_mode) else file_kind(found.st_mode)
        raise LeaseStoreError(f"{path}: {kind}, not the lease database's own file; topod will not follow or "
                              "open it: move it away")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        raise LeaseStoreError(f"{path}: cannot open it: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped between the lstat and the open
            raise LeaseStoreError(f"{path}: replaced while being opened; move it away")
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
