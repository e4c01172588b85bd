"""Group membership is cached for a few seconds at most, and a reload (SIGHUP, `topoctl
reload`) forgets it at once: a user removed from the allowed group loses access then,
not a minute later."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from raw_http import exchange, post
from topod.api.peer import GROUP_CACHE_SECONDS, GroupCache, caller_async

MEMBER = 65534
GROUP = 5000
NSS_WRAPPER = Path("/usr/lib/x86_64-linux-gnu/libnss_wrapper.so")
DOCUMENTED_SECONDS = 5.0  # what the operations guide promises: a removal counts within this


# -- the cache, as plain values ---------------------------------------------------------
def test_the_cache_holds_a_membership_for_a_few_seconds_at_most():
    assert GROUP_CACHE_SECONDS <= DOCUMENTED_SECONDS and GroupCache().ttl <= DOCUMENTED_SECONDS


def test_a_removal_from_the_group_takes_effect_when_the_cache_expires():
    groups = {MEMBER: [MEMBER, GROUP]}
    now = [0.0]
    cache = GroupCache(lookup=lambda uid, gid: groups[uid], clock=lambda: now[0])

    async def allowed() -> bool:
        return (await caller_async(None, MEMBER, MEMBER, GROUP, cache)).may_allocate

    async def scenario() -> list[bool]:
        seen = [await allowed()]
        groups[MEMBER] = [MEMBER]  # removed from the group
        now[0] = cache.ttl - 0.1
        seen.append(await allowed())  # still cached: what the documented window allows
        now[0] = DOCUMENTED_SECONDS
        seen.append(await allowed())
        return seen

    assert asyncio.run(scenario()) == [True, True, False]


def test_clear_forgets_memberships_and_a_lookup_in_flight_is_not_kept():
    groups = {MEMBER: [MEMBER, GROUP]}
    release = threading.Event()

    def slow_lookup(uid: int, gid: int) -> list[int]:
        answer = list(groups[uid])  # read before the change below
        release.wait(5)
        return answer

    cache = GroupCache(lookup=slow_lookup)

    async def scenario() -> tuple[frozenset, frozenset | None, frozenset]:
        in_flight = asyncio.ensure_future(cache.groups(MEMBER, MEMBER))
        await asyncio.sleep(0.05)
        groups[MEMBER] = [MEMBER]
        cache.clear()  # a reload while the old answer is on its way
        release.set()
        old = await in_flight
        kept = cache.cached(MEMBER, MEMBER)
        fresh = await cache.groups(MEMBER, MEMBER)
        return old, kept, fresh

    old, kept, fresh = asyncio.run(scenario())
    assert GROUP in old, "the caller that asked before the reload gets its answer"
    assert kept is None, "the answer read before the reload is not cached"
    assert GROUP not in fresh and cache.lookups == 2


# -- the daemon, with its name service in files (nss_wrapper) ----------------------------
needs_nss_wrapper = pytest.mark.skipif(not NSS_WRAPPER.exists() or os.geteuid() != 0,
                                       reason="needs root and nss_wrapper (Debian: libnss-wrapper)")


class NameService:
    """passwd and group files the daemon reads through nss_wrapper; `remove` rewrites the
    group without the member (a new file: nss_wrapper reloads a changed file)."""

    def __init__(self, where: Path) -> None:
        self.passwd = where / "passwd"
        self.group = where / "group"
        self.passwd.write_text("root:x:0:0:root:/root:/bin/sh\n"
                               f"nobody:x:{MEMBER}:{MEMBER}:nobody:/nonexistent:/usr/sbin/nologin\n")
        self._write_group("nobody")

    def _write_group(self, members: str) -> None:
        staged = self.group.with_suffix(".new")
        staged.write_text(f"root:x:0:\nnogroup:x:{MEMBER}:\ngpuusers:x:{GROUP}:{members}\n")
        os.replace(staged, self.group)

    def remove_member(self) -> None:
        self._write_group("")

    def env(self) -> dict:
        return {"LD_PRELOAD": str(NSS_WRAPPER), "NSS_WRAPPER_PASSWD": str(self.passwd),
                "NSS_WRAPPER_GROUP": str(self.group)}


def _allocate_as_member(path: str) -> tuple[int, dict]:
    """POST /v1/leases from a child that is uid/gid 65534 with no supplementary groups:
    only the daemon's group lookup can make it a member."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(MEMBER)
            os.setuid(MEMBER)
            status, _, _, text = exchange(path, post("/v1/leases", b'{"gpus": 1, "level": "any"}'))
            os.write(write_end, json.dumps([status, json.loads(text)]).encode())
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            os.write(write_end, json.dumps([0, {"error": repr(exc)}]).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        status, body = json.loads(pipe.read())
    os.waitpid(pid, 0)
    return status, body


def _member_daemon(daemon_factory, public_socket, tmp_path):
    names = NameService(tmp_path)
    daemon = daemon_factory(config='[irq]\nmode = "off"\n[probe]\nenabled = false\n'
                                   '[daemon]\nsocket_mode = "0666"\ngroup = "gpuusers"\n', env=names.env())
    public_socket(daemon)
    client = daemon.start()
    return daemon, client, names


def _granted(daemon_client, status: int, body: dict) -> None:
    assert status == 201, body
    daemon_client.release(body["id"])


@needs_nss_wrapper
@pytest.mark.parametrize("how", ["topoctl reload", "SIGHUP"])
def test_a_reload_ends_a_removed_members_access_at_once(daemon_factory, public_socket, tmp_path, how):
    daemon, client, names = _member_daemon(daemon_factory, public_socket, tmp_path)
    looked_up = time.monotonic()
    _granted(client, *_allocate_as_member(daemon.socket))  # a member: its groups are now cached
    names.remove_member()
    if how == "SIGHUP":
        reloads = daemon.log().count('"config_reloaded"')
        daemon.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while daemon.log().count('"config_reloaded"') == reloads and time.monotonic() < deadline:
            time.sleep(0.02)
    else:
        assert client.request("POST", "/v1/reload")["applied"] is True
    status, body = _allocate_as_member(daemon.socket)
    assert time.monotonic() - looked_up < GROUP_CACHE_SECONDS, "too slow to tell a flush from the cache expiring"
    assert (status, body.get("code")) == (403, "permission_denied"), body


@needs_nss_wrapper
def test_a_removed_member_loses_access_within_the_cache_lifetime(daemon_factory, public_socket, tmp_path):
    daemon, client, names = _member_daemon(daemon_factory, public_socket, tmp_path)
    _granted(client, *_allocate_as_member(daemon.socket))
    names.remove_member()
    removed = time.monotonic()
    while True:
        status, body = _allocate_as_member(daemon.socket)
        if status != 201:
            break
        client.release(body["id"])
        assert time.monotonic() - removed < DOCUMENTED_SECONDS + 1, "still a member long after its removal"
        time.sleep(0.2)
    assert (status, body.get("code")) == (403, "permission_denied"), body
