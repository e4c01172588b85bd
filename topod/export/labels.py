"""The `[cluster]` table: where this host sits beyond itself (rack, leaf switch, ...).

The seed's roadmap puts inter-node topology in the same graph; topod does not schedule
across hosts, but it publishes these labels (in NodeResourceTopology attributes) so a
cluster scheduler can. Keys become attribute names, so they must be DNS-label-like.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from topod.errors import ConfigError

# RFC 1123 label: lowercase letters, digits and '-', starting and ending alphanumeric.
_KEY = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
MAX_VALUE_LENGTH = 256


def parse_cluster_labels(table: Mapping[str, object] | None, section: str = "cluster") -> dict[str, str]:
    """Validate a parsed `[cluster]` TOML table into {key: value}, keys sorted.

    Every bad entry raises ConfigError naming `section.key` and saying what to change.
    """
    if table is None:
        return {}
    if not isinstance(table, Mapping):
        raise ConfigError(f"{section}: expected a table of key = \"value\" strings, got {type(table).__name__}")
    labels: dict[str, str] = {}
    for key in sorted(table, key=str):
        value = table[key]
        where = f"{section}.{key}"
        if not isinstance(key, str) or not _KEY.match(key):
            raise ConfigError(
                f"{where}: bad key {key!r}: use lowercase letters, digits and '-', "
                "starting and ending with a letter or digit, at most 63 characters (e.g. rack, leaf)"
            )
        labels[key] = _check_value(where, value)
    return labels


def _check_value(where: str, value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, str):
        shown = type(value).__name__
        raise ConfigError(f"{where}: expected a string, got {shown} (quote it: {where.split('.')[-1]} = \"{value}\")")
    if not value:
        raise ConfigError(f"{where}: empty value; remove the key or give it a value")
    if len(value) > MAX_VALUE_LENGTH:
        raise ConfigError(f"{where}: value is {len(value)} characters, at most {MAX_VALUE_LENGTH} allowed")
    if any(not ch.isprintable() for ch in value):
        raise ConfigError(f"{where}: value contains control characters")
    return value
