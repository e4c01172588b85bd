"""The body of GET /v1/topology, built once per topology version, off the event loop.

Building it (every device's JSON and the distance matrix) costs ~40 ms on 64 GPUs and
seconds on 1,024: done on the loop for each reader, readers queue behind each other and
every allocation behind them. Here the body is encoded once per version — the Topology
and the DistanceModel HostState holds (each replaced, never mutated, on a change) and the
[cluster] labels — in a worker thread, one build at a time however many readers arrive
at once, and every reader of that version gets the same bytes. Only the list of leased
GPUs, which changes with every grant, is spliced on per answer (microseconds).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from topod.topojson import topology_to_json

# (topology, distances, cluster labels): what a body was built from; compared by identity
# for the first two (HostState replaces them on a change) and by value for the labels.
Version = tuple[Any, Any, dict]


def _encode(value: Any) -> str:
    from topod.api.answers import dumps

    return dumps(value)


class TopologyBody:
    def __init__(self, version: Callable[[], Version]) -> None:
        self._version = version
        self._built: Version | None = None
        self._prefix = b""  # the document up to (not including) its closing brace
        self._building: asyncio.Task | None = None
        self.builds = 0

    def _current(self, version: Version) -> bool:
        built = self._built
        return (built is not None and built[0] is version[0] and built[1] is version[1]
                and built[2] == version[2])

    @staticmethod
    def build(version: Version) -> bytes:
        """The document less leased_gpus, encoded, without its closing brace (blocking)."""
        topology, distances, cluster = version
        doc = topology_to_json(topology, distances)
        doc["cluster"] = dict(cluster)
        text = _encode(doc)
        return text[:-1].encode()

    async def prefix(self) -> bytes:
        """The current version's encoded document, built in a thread when it changed;
        concurrent readers wait for the one build in flight."""
        while True:
            version = self._version()
            if self._current(version):
                return self._prefix
            if self._building is None or self._building.done():
                self._building = asyncio.ensure_future(self._build(version))
                # a build nobody awaits any more (all its readers left) must not warn
                self._building.add_done_callback(lambda t: t.cancelled() or t.exception())
            await asyncio.shield(self._building)

    async def _build(self, version: Version) -> None:
        prefix = await asyncio.to_thread(self.build, version)
        self._built, self._prefix = version, prefix
        self.builds += 1

    async def body(self, leased_gpus: list[int]) -> bytes:
        return await self.prefix() + b', "leased_gpus": ' + json.dumps(sorted(leased_gpus)).encode() + b"}"
