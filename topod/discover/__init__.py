"""Discovery: read-only adapters that turn a host tree into a Topology."""

from __future__ import annotations

from topod.discover.scan import discover

__all__ = ["discover"]
