"""The TOML configuration: one file, validated at load, unknown keys rejected by path.

Every key, its type and default is declared in SCHEMA below; etc/topod.toml documents
them for operators. A reload that fails validation keeps the running Config.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from typing import Any

from topod.alloc.nics import NIC_MODES
from topod.alloc.policy import PolicySettings
from topod.alloc.quota import UNLIMITED, GroupCap
from topod.discover.udev import UdevSettings
from topod.cpulist import parse_cpulist
from topod.errors import ConfigError
from topod.export.labels import parse_cluster_labels
from topod.irq.settings import DEFAULTS as IRQ_DEFAULTS
from topod.irq.settings import IRQBALANCE_CHOICES
from topod.irq.settings import MODES as IRQ_MODES
from topod.irq.settings import IrqSettings
from topod.probe.sampler import SamplerSettings
from topod.textfile import read_text_file

# Each default lives with the code that uses it; the schema takes it from there.
_POLICY = PolicySettings()
_UDEV = UdevSettings()
_SAMPLER = SamplerSettings()

# section -> key -> (type, default). Types: bool, int, float, str, "cpulist", list, dict.
SCHEMA: dict[str, dict[str, tuple[object, object]]] = {
    "daemon": {
        "socket": (str, "/run/topod/topod.sock"),
        "state_dir": (str, "/var/lib/topod"),
        "root": (str, "/"),
        "group": (str, "topod"),
        "socket_mode": (str, "0660"),
        "rescan_interval_seconds": (float, 300.0),
        "sqlite_synchronous": (str, "full"),
    },
    "api": {
        "max_connections": (int, 256),
        "max_connections_per_uid": (int, 64),
        "root_reserved_connections": (int, 16),
        "max_event_streams_per_uid": (int, 8),
        "idle_timeout_seconds": (float, 30.0),
        "max_body_bytes": (int, 1048576),
    },
    "alloc": {
        "reserved_cpus": ("cpulist", ""),
        "reserved_cpus_per_node": (int, 0),
        "housekeeping_cores_per_node": (int, 1),
        "cpus_per_gpu": ("cpus_per_gpu", "auto"),
        "default_level": (str, "good"),
        "aging_seconds": (float, _POLICY.aging_seconds),
        "max_aging_boost": (float, _POLICY.max_aging_boost),
        "preemption_grace_seconds": (float, 300.0),
        "backpressure_tolerance": (float, _POLICY.backpressure_tolerance),
        "backpressure_threshold": (float, _POLICY.backpressure_threshold),
        "low_priority_below": (int, _POLICY.low_priority_below),
        "short_job_seconds": (float, _POLICY.short_job_seconds),
        "low_topology_weight": (float, _POLICY.low_topology_weight),
        "topology_aging_seconds": (float, _POLICY.topology_aging_seconds),
        "search_budget": (int, _POLICY.search_budget),
        "max_wait_seconds": (float, 3600.0),
        "max_queue": (int, 256),
        "renew_max_ttl_seconds": (float, 7 * 24 * 3600.0),
        "max_priority_non_root": (int, 0),
        "unconfirmed_grace_seconds": (float, 300.0),
        "nics": (str, _POLICY.nics),
        # GPU caps (topod.alloc.quota): "unlimited" or a number; group name -> GPUs its
        # members hold together, resolved (gid, listed members) at load.
        "max_gpus_per_uid": ("gpu_cap", UNLIMITED),
        "max_gpus_per_group": ("group_caps", ()),
    },
    "irq": {
        # The balancer's keys take their defaults from topod.irq.settings (one place).
        "mode": (str, IRQ_DEFAULTS["mode"]),
        "interval_seconds": (float, 10.0),
        "allow_in_container": (bool, False),
        "banned_cpus": ("cpulist", IRQ_DEFAULTS["banned_cpus"]),
        "housekeeping_cpus": ("cpulist", IRQ_DEFAULTS["housekeeping_cpus"]),
        "irqbalance": (str, IRQ_DEFAULTS["irqbalance"]),
        "policy": (dict, {}),
        "irq_overrides": (dict, {}),
        "device_overrides": (dict, {}),
        "min_gain": (float, IRQ_DEFAULTS["min_gain"]),
        "cooldown_seconds": (float, IRQ_DEFAULTS["cooldown_seconds"]),
        "retry_base_seconds": (float, IRQ_DEFAULTS["retry_base_seconds"]),
        "retry_max_seconds": (float, IRQ_DEFAULTS["retry_max_seconds"]),
    },
    "probe": {
        "enabled": (bool, True),
        "backend": (str, "host-memory"),
        "min_interval_seconds": (float, _SAMPLER.min_interval_s),
        "max_interval_seconds": (float, _SAMPLER.max_interval_s),
        "budget_share": (float, _SAMPLER.budget_share),
        "probe_leased_gpus": (bool, _SAMPLER.probe_leased_gpus),
        "simulated_table": (str, ""),
    },
    "udev": {
        "enabled": (bool, _UDEV.enabled),
        "source": (str, _UDEV.source),
        "quiet_seconds": (float, _UDEV.quiet_s),
        "max_delay_seconds": (float, _UDEV.max_delay_s),
    },
    "watchdog": {
        "loop_deadline_seconds": (float, 60.0),
    },
    "isolate": {  # keep everything outside leases off leased CPUs: topod.isolate (affinity), topod.slices (cgroup)
        "system": (bool, False),
        "method": (str, "auto"),
        "interval_seconds": (float, 5.0),
    },
    "export": {
        "nccl_topology_file": (str, "/var/run/nvidia-topologyd/virtualTopology.xml"),
        "write_nccl_topology": (bool, False),
        "metrics_tcp": (str, ""),
    },
    "cluster": {},  # free-form locality labels: rack = "r12", leaf = "leaf-3", ...
    "log": {
        "level": (str, "info"),
        "format": (str, "auto"),
    },
}

# Whole numbers where 0 would make the daemon unusable (no connection, no body accepted).
INT_MINIMUM = {("api", "max_connections"): 1, ("api", "max_body_bytes"): 1, ("api", "max_connections_per_uid"): 1,
               ("api", "max_event_streams_per_uid"): 1, ("api", "root_reserved_connections"): 0}
# (low, high, low included): a share of wall time.
FLOAT_RANGE = {("probe", "budget_share"): (0.0, 1.0, False)}
PROBE_BACKENDS = ("host-memory", "cuda", "simulated")
# The lease ledger's PRAGMA synchronous (topod.service.lease_db opens it so; the store says
# what each keeps on power loss). Defined here, below the service that reads it.
SQLITE_SYNCHRONOUS = ("full", "normal")
# Read once at start (the socket is bound, the store opened, the root and logging set up):
# a reload that changes one says so and keeps the running value.
RESTART_KEYS = (("daemon", "root"), ("daemon", "socket"), ("daemon", "state_dir"), ("daemon", "socket_mode"),
                ("daemon", "sqlite_synchronous"), ("export", "metrics_tcp"), ("log", "level"), ("log", "format"))

# Periods and limits where 0 would mean a busy loop or an unusable daemon.
POSITIVE = {("daemon", "rescan_interval_seconds"), ("irq", "interval_seconds"), ("probe", "min_interval_seconds"),
            ("probe", "max_interval_seconds"), ("watchdog", "loop_deadline_seconds"), ("api", "idle_timeout_seconds"),
            ("alloc", "max_wait_seconds"), ("alloc", "renew_max_ttl_seconds"),
            ("alloc", "unconfirmed_grace_seconds"), ("udev", "max_delay_seconds"), ("isolate", "interval_seconds")}

CHOICES = {
    ("alloc", "default_level"): ("best", "good", "any"),
    ("alloc", "nics"): NIC_MODES,
    ("probe", "backend"): PROBE_BACKENDS,
    ("irq", "mode"): IRQ_MODES,
    ("irq", "irqbalance"): IRQBALANCE_CHOICES,
    ("udev", "source"): ("udev", "kernel"),
    ("isolate", "method"): ("auto", "affinity", "cgroup"),
    ("daemon", "sqlite_synchronous"): SQLITE_SYNCHRONOUS,
    ("log", "level"): ("debug", "info", "warning", "error"),
    ("log", "format"): ("auto", "console", "json", "journal"),
}


@dataclass(frozen=True, slots=True)
class Config:
    values: dict[str, dict[str, Any]]
    source: str | None = None
    # [daemon] keys given on the command line (--root, --socket, --state-dir): they win
    # over the file, at start and on every reload.
    overridden: frozenset[str] = frozenset()

    def get(self, section: str, key: str) -> Any:
        return self.values[section][key]

    def section(self, name: str) -> dict[str, Any]:
        return dict(self.values[name])

    def with_overrides(self, **daemon: Any) -> Config:
        values = {name: dict(section) for name, section in self.values.items()}
        overridden = set(self.overridden)
        for key, value in daemon.items():
            if value is not None:
                values["daemon"][key] = value
                overridden.add(key)
        return Config(values, self.source, frozenset(overridden))

    def restart_changes(self, new: Config) -> list[str]:
        """The keys that need a restart (RESTART_KEYS) whose value `new` changes, as
        "section.key"; a [daemon] key set on the command line is not the file's to change."""
        return [f"{section}.{key}" for section, key in RESTART_KEYS
                if not (section == "daemon" and key in self.overridden)
                and new.get(section, key) != self.get(section, key)]

    def keeping(self, running: Config) -> Config:
        """This config with every restart-only key (and the command line's) at `running`'s value."""
        values = {name: dict(section) for name, section in self.values.items()}
        for section, key in RESTART_KEYS:
            values[section][key] = running.get(section, key)
        for key in running.overridden:
            values["daemon"][key] = running.get("daemon", key)
        return Config(values, self.source, running.overridden)


def defaults() -> Config:
    return Config({section: {k: _copy(d) for k, (_, d) in keys.items()} for section, keys in SCHEMA.items()})


def _copy(value: object) -> object:
    return dict(value) if isinstance(value, dict) else list(value) if isinstance(value, list) else value


def parse_config(text: str, source: str | None = None) -> Config:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source or 'config'}: not valid TOML: {exc}") from exc
    except RecursionError:  # tomllib recurses per nesting level: [[[[...]]]] a few thousand deep
        raise ConfigError(f"{source or 'config'}: not valid TOML: arrays or tables nested too deep") from None
    config = defaults()
    for section, table in document.items():
        if section not in SCHEMA:
            raise ConfigError(f"{section}: unknown section (known: {', '.join(SCHEMA)})")
        if not isinstance(table, dict):
            raise ConfigError(f"{section}: expected a table")
        if section == "cluster":
            # One rule for the labels, the exporters' (they become NRT attribute names).
            config.values["cluster"] = parse_cluster_labels(table)
            continue
        for key, value in table.items():
            config.values[section][key] = _validate(section, key, value)
    _check_ranges(config)
    _check_consumers(config, document)
    return Config(config.values, source)


def _check_ranges(config: Config) -> None:
    """Rules between keys, each named in the message."""
    for section, low, high in (("probe", "min_interval_seconds", "max_interval_seconds"),
                               ("udev", "quiet_seconds", "max_delay_seconds"),
                               ("irq", "retry_base_seconds", "retry_max_seconds")):
        if config.get(section, low) > config.get(section, high):
            raise ConfigError(f"{section}.{low} ({config.get(section, low):g}) must not exceed "
                              f"{section}.{high} ({config.get(section, high):g})")


def _check_consumers(config: Config, document: dict[str, Any]) -> None:
    """What each loop would refuse when it starts is refused here, at load, by the same
    code: `--check-config`, start and reload agree, and a bad value never reaches a loop
    (where it would fail later, with the daemon degraded and the old config gone)."""
    IrqSettings.from_section(config.section("irq"))  # policies and overrides, by name
    probe = config.section("probe")
    try:
        SamplerSettings(min_interval_s=probe["min_interval_seconds"], max_interval_s=probe["max_interval_seconds"],
                        budget_share=probe["budget_share"], probe_leased_gpus=probe["probe_leased_gpus"])
    except ValueError as exc:
        raise ConfigError(f"probe: {exc}") from exc
    if probe["backend"] == "simulated" and probe["enabled"]:
        if not probe["simulated_table"]:
            raise ConfigError('probe.simulated_table: backend = "simulated" needs a ground-truth table file')
        from topod.probe.simulated import load_table

        try:
            load_table(probe["simulated_table"])
        except ConfigError as exc:
            raise ConfigError(f"probe.simulated_table: {exc}") from exc
    group = document.get("daemon", {}).get("group")
    # The packaged group ("topod", made by sysusers) may be absent: then only root and the
    # daemon's user allocate. Any other name was chosen by the operator and must exist.
    if group and group != SCHEMA["daemon"]["group"][1]:
        import grp

        try:
            grp.getgrnam(group)
        except KeyError:
            raise ConfigError(f"daemon.group: no group {group!r} on this host (create it, name one that exists, "
                              "or set group = \"\" for root and the daemon's user only)") from None


MAX_CONFIG_BYTES = 1 << 20  # the documented file is ~10 KiB


def load_config(path: str | None) -> Config:
    """Defaults when path is None; ConfigError naming the file and key otherwise."""
    if path is None:
        return defaults()
    return parse_config(read_text_file(path, MAX_CONFIG_BYTES), path)


def _validate(section: str, key: str, value: Any) -> Any:
    where = f"{section}.{key}"
    if key not in SCHEMA[section]:
        raise ConfigError(f"{where}: unknown key (known: {', '.join(SCHEMA[section])})")
    kind, _ = SCHEMA[section][key]
    if kind == "gpu_cap":
        if value != UNLIMITED and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{where}: expected \"{UNLIMITED}\" or a whole number of GPUs >= 1, got {value!r} "
                              "(to keep a user from allocating at all, leave it out of [daemon] group)")
    elif kind == "group_caps":
        value = group_caps(where, value)
    elif kind == "cpus_per_gpu":
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ConfigError(f"{where}: expected \"auto\" or a whole number of CPUs >= 0, got {value!r}")
    elif kind == "cpulist":
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a CPU list string like \"0-3,8\"")
        try:
            parse_cpulist(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {type(value).__name__}")
        if not math.isfinite(value):
            raise ConfigError(f"{where}: must be a finite number, got {value!r}")
        if value < 0:
            raise ConfigError(f"{where}: must not be negative")
        if (section, key) in POSITIVE and value == 0:
            raise ConfigError(f"{where}: must be greater than 0")
        value = float(value)
        bounds = FLOAT_RANGE.get((section, key))
        if bounds is not None:
            low, high, low_included = bounds
            if not (low <= value if low_included else low < value) or value > high:
                raise ConfigError(f"{where}: {value:g} is not in {'[' if low_included else '('}{low:g}, {high:g}]")
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {type(value).__name__}")
        if value < 0:
            raise ConfigError(f"{where}: must not be negative")
        minimum = INT_MINIMUM.get((section, key))
        if minimum is not None and value < minimum:
            raise ConfigError(f"{where}: {value} is below the minimum, {minimum}")
    elif not isinstance(value, kind):  # type: ignore[arg-type]
        raise ConfigError(f"{where}: expected {kind.__name__}, got {type(value).__name__}")  # type: ignore[union-attr]
    choices = CHOICES.get((section, key))
    if choices and value not in choices:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(choices)}")
    if (section, key) == ("daemon", "socket_mode"):
        try:
            int(value, 8)
        except ValueError as exc:
            raise ConfigError(f"{where}: expected an octal mode like \"0660\"") from exc
    if (section, key) == ("export", "metrics_tcp") and value:
        try:
            parse_listen_address(value)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    return value


def group_caps(where: str, table: Any) -> tuple[GroupCap, ...]:
    """[alloc] max_gpus_per_group: group name -> GPUs, each group resolved now through the
    name service (its gid and the uids its member list names), so a decision reads no
    name service. A group that does not exist is an error, as daemon.group's is: a cap
    that silently applies to no one is worse than a refused file. A listed member whose
    name no longer resolves is left out (it has no uid to call with)."""
    import grp
    import pwd

    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table of group name = GPUs, like {{ physics = 8 }}")
    caps = []
    for name, cap in sorted(table.items()):
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise ConfigError(f"{where}.{name}: expected a whole number of GPUs >= 0, got {cap!r}")
        try:
            entry = grp.getgrnam(name)
        except (KeyError, ValueError):  # ValueError: a name with a NUL in it
            raise ConfigError(f"{where}: no group {name!r} on this host (create it, or name one that exists)") from None
        members = set()
        for member in entry.gr_mem:
            try:
                members.add(pwd.getpwnam(member).pw_uid)
            except (KeyError, ValueError):
                continue
        caps.append(GroupCap(name, entry.gr_gid, cap, frozenset(members)))
    return tuple(caps)


def cpus(config: Config, section: str, key: str) -> list[int]:
    return parse_cpulist(config.get(section, key))


def parse_listen_address(spec: str) -> tuple[str, int]:
    """'9464' or ':9464' -> loopback; 'HOST:PORT' as given. ValueError otherwise."""
    host, _, port = spec.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"export.metrics_tcp: {spec!r} is not [HOST:]PORT")
    return (host.strip("[]") or "127.0.0.1"), int(port)
