"""The kubelet's Topology Manager settings, read from its config file.

The NodeResourceTopology object must publish the policy and scope the kubelet really uses,
or the scheduler plugin places pods the kubelet then rejects (TopologyAffinityError).
They live in the KubeletConfiguration file (default /var/lib/kubelet/config.yaml) as
top-level `topologyManagerPolicy` and `topologyManagerScope`; absent keys mean the
kubelet's defaults (none, container). PyYAML is only a test dependency, so the file is
read with a small parser of top-level `key: value` lines (and JSON, which the kubelet also
accepts). Command-line flags given to the kubelet are not in the file: pass them to
`topoctl export nrt --policy/--scope`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from topod.host import HostRoot
from topod.model import HostWarning

DEFAULT_KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
DEFAULT_POLICY = "none"
DEFAULT_SCOPE = "container"
POLICY_KEY = "topologyManagerPolicy"
SCOPE_KEY = "topologyManagerScope"
MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class TopologyManager:
    policy: str
    scope: str
    source: str  # kubelet-config | default | option
    warnings: tuple[HostWarning, ...] = field(default=())


def parse_kubelet_config(text: str) -> dict[str, str]:
    """Top-level scalar keys of a KubeletConfiguration (YAML block mapping or JSON).

    Nested mappings, lists and block scalars under a key are skipped; comments, document
    markers and quotes are handled. Raises ValueError for text that is not a mapping."""
    if "\x00" in text:
        raise ValueError("binary content, not YAML")
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"not JSON: {str(exc)[:80]}") from exc
        if not isinstance(data, dict):
            raise ValueError("expected a mapping")
        return {str(k): v for k, v in data.items() if isinstance(v, str)}
    found: dict[str, str] = {}
    documents = 0
    open_key = False
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _strip_comment(raw).rstrip()
        if not line.strip():
            continue
        if line.startswith(("---", "...")):
            documents += 1
            if documents > 1 and found:
                break  # the kubelet reads one document
            continue
        if line[0] in " \t" or (line.startswith("-") and open_key):
            continue  # belongs to the key above (nested mapping, list, block scalar)
        key, sep, value = line.partition(":")
        if not sep or not key.strip() or key.startswith(("-", "[", "{", "%")) or (value and value[0] not in " \t"):
            raise ValueError(f"line {number}: {raw.strip()[:60]!r} is not a top-level `key: value`")
        found[_unquote(key.strip())] = _unquote(value.strip())
        open_key = not value.strip()  # a list may follow at the key's own indentation
    if not found:
        raise ValueError("no `key: value` lines")
    return found


def _strip_comment(line: str) -> str:
    """Drop a '#' comment that is not inside quotes."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def topology_manager_from_text(text: str, path: str, policies: tuple[str, ...],
                               scopes: tuple[str, ...]) -> TopologyManager:
    """Policy and scope from the config's text; on garbage the kubelet defaults and a warning."""
    try:
        keys = parse_kubelet_config(text)
    except ValueError as exc:
        return _defaults(HostWarning("kubelet_config_invalid", path,
                                     f"{exc}; topologyManagerPolicy none and scope container assumed "
                                     "(pass --policy and --scope)"))
    kind = keys.get("kind")
    if kind is not None and kind != "KubeletConfiguration":
        return _defaults(HostWarning("kubelet_config_invalid", path,
                                     f"kind {kind!r} is not KubeletConfiguration; policy none assumed "
                                     "(pass --kubelet-config or --policy/--scope)"))
    warnings = []
    policy = keys.get(POLICY_KEY, DEFAULT_POLICY)
    if policy not in policies:
        warnings.append(HostWarning("kubelet_config_invalid", path,
                                    f"{POLICY_KEY} {policy[:40]!r} is not one of {', '.join(policies)}; none assumed"))
        policy = DEFAULT_POLICY
    scope = keys.get(SCOPE_KEY, DEFAULT_SCOPE)
    if scope not in scopes:
        warnings.append(HostWarning("kubelet_config_invalid", path,
                                    f"{SCOPE_KEY} {scope[:40]!r} is not one of {', '.join(scopes)}; container assumed"))
        scope = DEFAULT_SCOPE
    return TopologyManager(policy, scope, "kubelet-config", tuple(warnings))


def _defaults(warning: HostWarning) -> TopologyManager:
    return TopologyManager(DEFAULT_POLICY, DEFAULT_SCOPE, "default", (warning,))


def read_topology_manager(host: HostRoot, path: str, policies: tuple[str, ...],
                          scopes: tuple[str, ...]) -> TopologyManager:
    """The kubelet config at path (absolute paths are taken under the host root)."""
    rel = path.lstrip("/")
    text = host.read(rel, limit=MAX_CONFIG_BYTES) if rel else None
    if text is None:
        return _defaults(HostWarning("kubelet_config_missing", path,
                                     "no kubelet config file (or unreadable): topologyManagerPolicy none and scope "
                                     "container assumed; pass --kubelet-config, or --policy and --scope"))
    return topology_manager_from_text(text, path, policies, scopes)


def resolve_topology_manager(host: HostRoot, path: str, policy: str | None, scope: str | None,
                             policies: tuple[str, ...], scopes: tuple[str, ...]) -> TopologyManager:
    """--policy/--scope win; 'auto' (or None) takes each from the kubelet config."""
    policy = None if policy in (None, "auto") else policy
    scope = None if scope in (None, "auto") else scope
    if policy is not None and scope is not None:
        return TopologyManager(policy, scope, "option")
    found = read_topology_manager(host, path, policies, scopes)
    source = found.source if policy is None and scope is None else "option+" + found.source
    return TopologyManager(policy or found.policy, scope or found.scope, source, found.warnings)
