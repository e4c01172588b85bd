"""The hot path answers a grant or a release from its commit's callback, with no task
(issue 26): the answer goes out only once the change is on disk, a client that hangs up
before that leaves no lease behind, and a failed commit is answered with its error and
holds nothing. Driven in-process on the real LeaseService and LeaseStore (h800 fixture
host), through a LeanConnection on a recording transport, so each step is exact."""

from __future__ import annotations

import asyncio
import json
import os
import time
from types import SimpleNamespace

import pytest
from cyclic_garbage import garbage_after

from tests.service.lease_store_helpers import _another_writer_takes
from topod.api.leanhttp import LeanConnection
from topod.service.leases import LeaseService

GRANT = json.dumps({"gpus": 1, "level": "any", "cpus_per_gpu": 0}).encode()


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "nothing is written to a closed connection"
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name, default=None):
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Site:
    """What a LeanConnection needs of its GatedSockSite."""

    def __init__(self) -> None:
        self.gate = SimpleNamespace(admit=lambda uid: True, leave=lambda uid: None)
        self.lean_connections: set = set()
        self.idle_sweep = SimpleNamespace(watch=lambda: None)


def _connection(alloc: LeaseService) -> tuple[LeanConnection, RecordingTransport]:
    backend = SimpleNamespace(alloc=alloc, allowed_group=None, lease_text=alloc.store.answer_text,
                              lease_json=alloc.store.json_of)
    connection = LeanConnection(Site(), backend, internal=True)
    transport = RecordingTransport()
    connection.connection_made(transport)
    connection._peer = (os.getpid(), 0, 0)  # root, as SO_PEERCRED would say
    return connection, transport


def _post(body: bytes) -> bytes:
    return (b"POST /v1/leases HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


def _answer(written: bytes) -> tuple[int, dict]:
    head, _, body = written.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


async def _until(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.001)


def test_a_grant_is_answered_once_on_disk_without_a_task(service):
    async def scenario():
        connection, transport = _connection(service)
        connection.data_received(_post(GRANT))
        assert not isinstance(connection._task, asyncio.Task), "a plain grant runs no task"
        assert transport.written == b"", "no answer before the commit"
        (lease,) = service.store.all()
        await _until(lambda: transport.written)
        status, document = _answer(transport.written)
        assert status == 201 and document["id"] == lease.id
        assert connection._task is None
        return lease.id

    lease_id = asyncio.run(scenario())
    service.store.flush()
    assert [row[0] for row in service.store.writer._db.execute("SELECT id FROM leases")] == [lease_id]
    assert service.store.get(lease_id).confirmed, "the written answer confirmed the lease"


def test_a_client_that_hangs_up_before_the_commit_leaves_no_lease(service):
    async def scenario():
        connection, transport = _connection(service)
        connection.data_received(_post(GRANT))
        assert len(service.store.all()) == 1, "granted in the mirror, commit in flight"
        transport.close()
        connection.connection_lost(None)
        await _until(lambda: not service.leased_gpus())  # freed once the delete is on disk
        assert service.store.all() == []

    asyncio.run(scenario())
    service.store.flush()
    assert service.store.all() == []
    assert list(service.store.writer._db.execute("SELECT id FROM leases")) == [], "ended on disk too"
    assert service.leased_gpus() == set()


def test_a_grant_whose_commit_fails_gets_its_error_and_holds_nothing(service):
    async def scenario():
        connection, transport = _connection(service)
        # Every GPU taken on disk behind the mirror's back: the grant's insert must fail.
        _another_writer_takes(service.store, *(gpu.address for gpu in service.topology.gpus))
        connection.data_received(_post(GRANT))
        await _until(lambda: transport.written)
        return _answer(transport.written)

    status, document = asyncio.run(scenario())
    assert status == 409 and document["code"] == "gpu_already_leased"
    assert service.store.all() == [] and service.leased_gpus() == set()


def test_a_release_is_answered_once_its_end_is_on_disk(service):
    async def scenario():
        connection, transport = _connection(service)
        connection.data_received(_post(GRANT))
        await _until(lambda: transport.written)
        _, lease = _answer(transport.written)
        transport.written = b""
        connection.data_received(f"DELETE /v1/leases/{lease['id']} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        assert not isinstance(connection._task, asyncio.Task)
        assert transport.written == b"", "no answer before the delete is on disk"
        await _until(lambda: transport.written)
        return lease, _answer(transport.written)

    lease, (status, document) = asyncio.run(scenario())
    assert status == 200 and document == {"released": lease["id"], "gpus": lease["gpus"]}
    service.store.flush()
    assert list(service.store.writer._db.execute("SELECT id FROM leases")) == []


def test_an_unknown_lease_release_is_refused_at_once(service):
    async def scenario():
        connection, transport = _connection(service)
        connection.data_received(b"DELETE /v1/leases/nosuchlease HTTP/1.1\r\nHost: t\r\n\r\n")
        return _answer(transport.written)

    status, document = asyncio.run(scenario())
    assert status == 404 and document["code"] == "lease_not_found"


def test_a_request_refused_just_before_a_release_is_served_when_it_starts_to_wait(service):
    """The hot path starts a task for a request that must wait: a release that lands
    between the refusal and the wait must not leave it waiting for the next one."""
    from topod.api.peer import Caller
    from topod.service.lease_queue import Queued

    root = Caller(uid=0, gid=0, pid=os.getpid(), may_allocate=True, is_admin=True)

    async def scenario():
        held = await service.allocate({"gpus": 8, "level": "any", "ttl_seconds": 600}, root)
        started = service.start_allocation({"gpus": 2, "level": "any", "wait": 5}, root)
        assert isinstance(started, Queued)
        _, ended = service.start_release(held.id, root)
        await ended  # its GPUs are free now, and no waiter was there to be served
        began = time.monotonic()
        lease = await service.finish_allocation(started, root)
        return lease, time.monotonic() - began

    lease, waited = asyncio.run(scenario())
    assert len(lease.gpus) == 2 and waited < 1.0, waited
    assert service.waiters == []


def test_a_served_connection_is_freed_without_the_cyclic_collector(service):
    """The request's parser holds the connection's callbacks; kept on the connection, the
    pair was a cycle per request, freed only by the collector (issue 26)."""
    async def scenario():
        connection, transport = _connection(service)
        connection.data_received(_post(GRANT))
        await _until(lambda: transport.written)
        lease_id = _answer(transport.written)[1]["id"]
        transport.close()
        connection.connection_lost(None)
        released, released_transport = _connection(service)
        released.data_received(f"DELETE /v1/leases/{lease_id} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        await _until(lambda: released_transport.written)
        assert _answer(released_transport.written)[0] == 200
        released_transport.close()
        released.connection_lost(None)

    _, garbage = garbage_after(lambda: asyncio.run(scenario()))
    left = sorted(set(garbage) & {"LeanConnection", "HttpRequestParser"})
    assert left == []
