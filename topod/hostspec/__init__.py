"""Host trees from short, readable specs: the demo host and every test fixture."""

from __future__ import annotations

from topod.hostspec.build import build_host, builtin_spec_names, load_builtin_spec, load_spec

__all__ = ["build_host", "builtin_spec_names", "load_builtin_spec", "load_spec"]
