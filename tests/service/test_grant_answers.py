"""A grant or a release is answered only once its change is on disk; a client that hangs
up before its grant's commit leaves no lease behind; a commit that fails is answered with
its error and holds nothing. Driven in-process through the API as the daemon serves it
(topod.service.server.serve: the connection gate, aiohttp, handler cancellation) on a
real Unix socket, over the real LeaseService and LeaseStore (h800 fixture host), with the
store's commits held at a gate so each step is exact."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from tests.service.lease_store_helpers import _another_writer_takes
from topod.api.peer import Caller
from topod.config import load_config
from topod.service.lease_queue import Queued
from topod.service.leases import LeaseService
from topod.service.server import serve

GRANT = json.dumps({"gpus": 1, "level": "any", "cpus_per_gpu": 0}).encode()
ROOT = Caller(uid=0, gid=0, pid=os.getpid(), may_allocate=True, is_admin=True)


class CommitGate:
    """Holds the store's writer thread before each commit while closed."""

    def __init__(self, service: LeaseService) -> None:
        self.open_ = threading.Event()
        self.open_.set()
        writer = service.store.writer
        commit = writer._commit

        def gated(batch):
            self.open_.wait(30)
            return commit(batch)

        writer._commit = gated

    def close(self) -> None:
        self.open_.clear()

    def open(self) -> None:
        self.open_.set()


async def _serve(service: LeaseService, directory: Path):
    """The API as the daemon serves it, for `service`, on a socket in `directory`."""
    backend = SimpleNamespace(alloc=service, allowed_group=None, lease_text=service.store.answer_text,
                              lease_json=service.store.json_of, state=SimpleNamespace(topology=service.topology),
                              config=None)
    path = str(directory / "api.sock")
    listen = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listen.bind(path)
    runner = await serve(backend, load_config(None), listen)
    return runner, path


async def _send(path: str, request: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(request)
    await writer.drain()
    return reader, writer


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict]:
    data = await asyncio.wait_for(reader.read(), 10)
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


async def _nothing_yet(reader: asyncio.StreamReader, seconds: float = 0.3) -> bool:
    try:
        await asyncio.wait_for(reader.read(1), seconds)
    except TimeoutError:
        return True
    return False


async def _until(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def _post(body: bytes) -> bytes:
    return (b"POST /v1/leases HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)) + body


def _delete(lease_id: str) -> bytes:
    return f"DELETE /v1/leases/{lease_id} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode()


def _on_disk(service: LeaseService) -> list[str]:
    service.store.flush()
    return [row[0] for row in service.store.writer._db.execute("SELECT id FROM leases")]


def test_a_grant_is_answered_only_once_it_is_on_disk(service, tmp_path):
    gate = CommitGate(service)

    async def scenario():
        runner, path = await _serve(service, tmp_path)
        try:
            gate.close()
            reader, writer = await _send(path, _post(GRANT))
            await _until(lambda: service.store.all())  # granted in the mirror, its commit held
            assert await _nothing_yet(reader), "no answer before the commit"
            gate.open()
            status, document = await _answer(reader)
            writer.close()
            (lease,) = service.store.all()
            assert status == 201 and document["id"] == lease.id
            await _until(lambda: service.store.get(lease.id).confirmed)  # the written answer confirms it
            return lease.id
        finally:
            gate.open()
            await runner.cleanup()

    lease_id = asyncio.run(scenario())
    assert _on_disk(service) == [lease_id]
    assert service.store.get(lease_id).confirmed


def test_a_client_that_hangs_up_before_its_grants_commit_leaves_no_lease(service, tmp_path):
    gate = CommitGate(service)

    async def scenario():
        runner, path = await _serve(service, tmp_path)
        try:
            gate.close()
            reader, writer = await _send(path, _post(GRANT))
            await _until(lambda: service.store.all())  # granted in the mirror, its commit held
            writer.close()  # the client hangs up
            await asyncio.sleep(0.3)  # the server sees it go
            gate.open()
            await _until(lambda: not service.store.all() and not service.leased_gpus())
        finally:
            gate.open()
            await runner.cleanup()

    asyncio.run(scenario())
    assert service.store.all() == [] and service.leased_gpus() == set()
    assert _on_disk(service) == [], "ended on disk too"


def test_a_grant_whose_commit_fails_gets_its_error_and_holds_nothing(service, tmp_path):
    async def scenario():
        runner, path = await _serve(service, tmp_path)
        try:
            # Every GPU taken on disk behind the mirror's back: the grant's insert must fail.
            _another_writer_takes(service.store, *(gpu.address for gpu in service.topology.gpus))
            reader, writer = await _send(path, _post(GRANT))
            answer = await _answer(reader)
            writer.close()
            return answer
        finally:
            await runner.cleanup()

    status, document = asyncio.run(scenario())
    assert status == 409 and document["code"] == "gpu_already_leased"
    assert service.store.all() == [] and service.leased_gpus() == set()


def test_a_release_is_answered_only_once_its_end_is_on_disk(service, tmp_path):
    gate = CommitGate(service)

    async def scenario():
        runner, path = await _serve(service, tmp_path)
        try:
            reader, writer = await _send(path, _post(GRANT))
            _, lease = await _answer(reader)
            writer.close()
            gate.close()
            reader, writer = await _send(path, _delete(lease["id"]))
            await _until(lambda: not service.store.all())  # ended in the mirror, its commit held
            assert await _nothing_yet(reader), "no answer before the delete is on disk"
            gate.open()
            answer = await _answer(reader)
            writer.close()
            return lease, answer
        finally:
            gate.open()
            await runner.cleanup()

    lease, (status, document) = asyncio.run(scenario())
    assert status == 200 and document == {"released": lease["id"], "gpus": lease["gpus"]}
    assert _on_disk(service) == []


def test_an_unknown_lease_release_is_refused(service, tmp_path):
    async def scenario():
        runner, path = await _serve(service, tmp_path)
        try:
            reader, writer = await _send(path, _delete("nosuchlease"))
            answer = await _answer(reader)
            writer.close()
            return answer
        finally:
            await runner.cleanup()

    status, document = asyncio.run(scenario())
    assert status == 404 and document["code"] == "lease_not_found"


def test_a_request_refused_just_before_a_release_is_served_when_it_starts_to_wait(service):
    """A request that must wait is refused first, then starts waiting: a release that lands
    between the two must not leave it waiting for the next one."""

    async def scenario():
        held = await service.allocate({"gpus": 8, "level": "any", "ttl_seconds": 600}, ROOT)
        started = service.start_allocation({"gpus": 2, "level": "any", "wait": 5}, ROOT)
        assert isinstance(started, Queued)
        _, ended = service.start_release(held.id, ROOT)
        await ended  # its GPUs are free now, and no waiter was there to be served
        began = time.monotonic()
        lease = await service.finish_allocation(started, ROOT)
        return lease, time.monotonic() - began

    lease, waited = asyncio.run(scenario())
    assert len(lease.gpus) == 2 and waited < 1.0, waited
    assert service.waiters == []
