"""GET /v1/topology is encoded once per topology version, in a worker thread, and every
reader of that version gets the same bytes (issue 25, row 10: it was built on the event
loop for each reader, ~40 ms on 64 GPUs and seconds on 1,024)."""

from __future__ import annotations

import asyncio
import json
import threading

from aiohttp.test_utils import TestClient, TestServer

from topod import topojson
from topod.api.server import routes
from topod.config import parse_config
from topod.distance import DistanceModel
from topod.hostspec import build_host, load_builtin_spec
from topod.service.daemon import Daemon


def _daemon(tmp_path) -> Daemon:
    root = build_host(load_builtin_spec("h800-8gpu"), tmp_path / "host")
    config = parse_config('[irq]\nmode = "off"\n[probe]\nenabled = false\n[cluster]\nrack = "r7"\n').with_overrides(
        root=str(root), socket=str(tmp_path / "topod.sock"), state_dir=str(tmp_path / "state"))
    return Daemon(config)


def test_topology_is_built_once_per_version_off_the_loop_and_readers_share_the_bytes(tmp_path, monkeypatch):
    daemon = _daemon(tmp_path)
    builds: list[int] = []  # the thread of each build of the distance matrix
    real = topojson.distance_matrix

    def counted(*args, **kwargs):
        builds.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(topojson, "distance_matrix", counted)

    async def drive() -> None:
        loop_thread = threading.get_ident()
        async with TestClient(TestServer(routes(daemon))) as client:
            async def read() -> bytes:
                response = await client.get("/v1/topology")
                assert response.status == 200 and response.content_type == "application/json"
                return await response.read()

            bodies = await asyncio.gather(*(read() for _ in range(20)))
            assert len(set(bodies)) == 1, "every reader of one version gets the same bytes"
            assert len(builds) == 1, f"built {len(builds)} times for one version"
            assert loop_thread not in builds, "built on the event loop"
            doc = json.loads(bodies[0])
            expected = topojson.topology_to_json(daemon.state.topology, daemon.state.distances)
            assert {k: v for k, v in doc.items() if k not in ("cluster", "leased_gpus")} == expected
            assert doc["cluster"] == {"rack": "r7"} and doc["leased_gpus"] == []
            builds.clear()

            # a grant changes the leased GPUs, not the version: spliced in, nothing rebuilt
            monkeypatch.setattr(daemon.alloc, "leased_gpus", lambda: {5, 3})
            assert json.loads(await read())["leased_gpus"] == [3, 5]
            assert builds == []

            # a new version (HostState replaces its distance model on a change): built again, once
            daemon.state.distances = DistanceModel(daemon.state.topology, corrections={})
            again = await asyncio.gather(*(read() for _ in range(5)))
            assert len(set(again)) == 1 and len(builds) == 1 and loop_thread not in builds

    asyncio.run(drive())
