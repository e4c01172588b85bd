"""Between READY and the end of a loop's setup the API already answers: what it says
about that loop must be "starting", never "disabled" (a client that believed it would
give up on a feature the config turned on)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from topod.config import parse_config
from topod.errors import UnavailableError
from topod.hostspec import build_host, load_builtin_spec
from topod.service import probe_task
from topod.service.daemon import Daemon


def _seed_host_config(tmp_path, text: str):
    """The daemon as a user starts it on the seed fixture: its defaults, this config text,
    and only root/socket/state dir overridden."""
    root = build_host(load_builtin_spec("h800-8gpu"), tmp_path / "host")
    return parse_config(text).with_overrides(root=str(root), socket=str(tmp_path / "topod.sock"),
                                             state_dir=str(tmp_path / "state"))


async def until(predicate, running: asyncio.Task, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if running.done():
            running.result()  # the daemon stopped: its error, not a timeout
            raise AssertionError("the daemon stopped on its own")
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out; the daemon is at:\n{_stacks()}")
        await asyncio.sleep(0.02)


def _stacks() -> str:
    import io

    out = io.StringIO()
    for task in asyncio.all_tasks():
        task.print_stack(file=out)
    return out.getvalue()


async def stopped(daemon: Daemon, running: asyncio.Task) -> None:
    daemon.stop()
    done, _ = await asyncio.wait({running}, timeout=30)
    if not done:
        raise AssertionError(f"the daemon did not stop within 30 s; it is at:\n{_stacks()}")
    running.result()


def test_probe_and_irq_report_starting_until_their_setup_ends(tmp_path, monkeypatch):
    config = _seed_host_config(tmp_path, '[irq]\nmode = "dry-run"\n')
    release = threading.Event()
    real = probe_task.ProbeTask

    def slow_setup(*args, **kwargs):
        release.wait(10)  # a probe whose setup takes its time (a slow NVML init, say)
        return real(*args, **kwargs)

    monkeypatch.setattr(probe_task, "ProbeTask", slow_setup)

    async def drive() -> None:
        daemon = Daemon(config)
        running = asyncio.create_task(daemon.run())
        try:
            await until(lambda: "probe" in daemon._loops, running)
            links = daemon.links_report()
            assert links["enabled"] is True and links["starting"] is True and links["links"] == []
            with pytest.raises(UnavailableError, match="starting"):
                daemon.telemetry({"link": "p2p/gpu0/gpu1", "bytes": 268435456, "seconds": 0.011})
            if daemon.irq is None:  # its setup may already be over; if not, it says so
                assert (await daemon.irq_report())["starting"] is True
                assert daemon.health()["irq"]["mode"] == "dry-run"
            release.set()
            await until(lambda: daemon.probe is not None and daemon.irq is not None, running)
            assert "starting" not in daemon.links_report()
            assert daemon.telemetry({"link": "p2p/gpu0/gpu1", "bytes": 268435456, "seconds": 0.011})["folded"]
            assert "starting" not in await daemon.irq_report()
        finally:
            release.set()
            await stopped(daemon, running)

    asyncio.run(drive())


def test_a_loop_the_config_turns_off_is_reported_disabled_not_starting(tmp_path):
    config = _seed_host_config(tmp_path, '[irq]\nmode = "off"\n[probe]\nenabled = false\n')

    async def drive() -> None:
        daemon = Daemon(config)
        running = asyncio.create_task(daemon.run())
        try:
            await until(lambda: daemon.api_address is not None and "reaper" in daemon._loops, running)
            assert daemon.links_report()["enabled"] is False
            # the engine's per-host tables are built at start, not inside the first request
            from topod.alloc.hostview import host_view

            assert "census" in host_view(daemon.alloc.topology, daemon.alloc.distances).cache
            with pytest.raises(UnavailableError, match="disabled"):
                daemon.telemetry({"link": "p2p/gpu0/gpu1", "bytes": 1, "seconds": 1.0})
            assert (await daemon.irq_report())["mode"] == "off"
        finally:
            await stopped(daemon, running)

    asyncio.run(drive())


def test_a_setup_that_keeps_failing_says_why_not_just_starting(tmp_path, monkeypatch):
    config = _seed_host_config(tmp_path, '[irq]\nmode = "off"\n')

    def broken_setup(*args, **kwargs):
        raise RuntimeError("the probe backend would not open")

    monkeypatch.setattr(probe_task, "ProbeTask", broken_setup)

    async def drive() -> None:
        daemon = Daemon(config)
        running = asyncio.create_task(daemon.run())
        try:
            await until(lambda: "probe" in daemon.supervisor.failing(), running)
            links = daemon.links_report()
            assert links["starting"] is True and "would not open" in links["reason"]
            with pytest.raises(UnavailableError, match="probe setup failing, retried with backoff"):
                daemon.telemetry({"link": "p2p/gpu0/gpu1", "bytes": 1, "seconds": 1.0})
            assert daemon.health()["status"] == "degraded"
        finally:
            await stopped(daemon, running)

    asyncio.run(drive())
