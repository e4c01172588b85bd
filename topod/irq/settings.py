"""IRQ policy settings: the [irq] config section, validated (no I/O).

The one place the IRQ modes, the irqbalance choices and the section's defaults are
spelled: topod/config.py and the balancer import them from here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from topod.cpulist import parse_cpulist
from topod.errors import ConfigError
from topod.irq.classify import IRQ_CLASSES
from topod.record import field, record

TYPE_CHECKING = False  # typing stays out of the IRQ worker: annotations are strings here
if TYPE_CHECKING:
    from typing import Any

MODES = ("continuous", "dry-run", "off")  # write | plan and report only | do nothing
IRQBALANCE_CHOICES = ("yield", "ban")
POLICIES = ("spread", "pin-node", "leave")
DEFAULT_POLICY = {"rdma": "spread", "nic": "spread", "nvme": "spread", "gpu": "pin-node", "other": "leave"}
ENOSPC_ALTERNATIVES = 3
# The [irq] keys IrqSettings reads, with their defaults (interval_seconds is the daemon's).
# The built-in mode only plans: a live root is written only when a config says so (the
# packaged etc/topod.toml does, for `make install`).
DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "mode": "dry-run",
    "banned_cpus": "",
    "housekeeping_cpus": "",
    "irqbalance": "yield",
    "min_gain": 0.2,
    "cooldown_seconds": 60.0,
    "retry_base_seconds": 10.0,
    "retry_max_seconds": 600.0,
})


@record
class IrqSettings:
    """The [irq] config section, validated. Overrides map an IRQ (number or vector name)
    or a device (PCI address or a name such as mlx5_0, nvme1, ens1f0) to a policy name or
    to an explicit CPU list such as "4-7"."""

    mode: str = DEFAULTS["mode"]  # one of MODES
    banned_cpus: frozenset[int] = frozenset()
    housekeeping_cpus: frozenset[int] = frozenset()
    irqbalance: str = DEFAULTS["irqbalance"]  # one of IRQBALANCE_CHOICES
    policy: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_POLICY))
    irq_overrides: Mapping[str, str] = field(default_factory=dict)
    device_overrides: Mapping[str, str] = field(default_factory=dict)
    min_gain: float = DEFAULTS["min_gain"]
    cooldown_seconds: float = DEFAULTS["cooldown_seconds"]
    retry_base_seconds: float = DEFAULTS["retry_base_seconds"]
    retry_max_seconds: float = DEFAULTS["retry_max_seconds"]

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> IrqSettings:
        """Build from a config section (unknown keys are the config loader's business)."""
        def get(key: str) -> Any:
            return section.get(key, DEFAULTS[key])

        def cpus(key: str) -> frozenset[int]:
            value = get(key)
            try:
                return frozenset(parse_cpulist(value) if isinstance(value, str) else [int(v) for v in value])
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"irq.{key}: {exc}") from exc

        policy = dict(DEFAULT_POLICY)
        for cls_name, value in dict(section.get("policy") or {}).items():
            if cls_name not in IRQ_CLASSES:
                raise ConfigError(f"irq.policy.{cls_name}: unknown IRQ class (known: {', '.join(IRQ_CLASSES)})")
            if value not in POLICIES:
                raise ConfigError(f"irq.policy.{cls_name}: {value!r} is not one of {', '.join(POLICIES)}")
            policy[cls_name] = value
        overrides = {key: _override_table(section, key) for key in ("irq_overrides", "device_overrides")}
        settings = cls(
            mode=str(get("mode")),
            banned_cpus=cpus("banned_cpus"),
            housekeeping_cpus=cpus("housekeeping_cpus"),
            irqbalance=str(get("irqbalance")),
            policy=policy,
            irq_overrides=overrides["irq_overrides"],
            device_overrides=overrides["device_overrides"],
            min_gain=_number(get, "min_gain"),
            cooldown_seconds=_number(get, "cooldown_seconds"),
            retry_base_seconds=_number(get, "retry_base_seconds"),
            retry_max_seconds=_number(get, "retry_max_seconds"),
        )
        for key, value, choices in (("mode", settings.mode, MODES),
                                    ("irqbalance", settings.irqbalance, IRQBALANCE_CHOICES)):
            if value not in choices:
                raise ConfigError(f"irq.{key}: {value!r} is not one of {', '.join(choices)}")
        if not 0.0 <= settings.min_gain < 1.0:
            raise ConfigError(f"irq.min_gain: {settings.min_gain} must be in [0, 1) (0.2 = a move must cut the load by 20%)")
        return settings


def _number(get: Callable[[str], Any], key: str) -> float:
    try:
        return float(get(key))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"irq.{key}: expected a number, got {get(key)!r}") from exc


def _override_table(section: Mapping[str, Any], key: str) -> dict[str, str]:
    table = section.get(key) or {}
    if not isinstance(table, Mapping):
        raise ConfigError(f"irq.{key}: expected a table")
    out = {}
    for name, value in table.items():
        if not isinstance(value, str) or (value not in POLICIES and not _is_cpulist(value)):
            raise ConfigError(f"irq.{key}.{name}: {value!r} is neither one of {', '.join(POLICIES)} "
                              "nor a CPU list like \"4-7\"")
        out[str(name)] = value
    return out


def _is_cpulist(value: str) -> bool:
    try:
        return bool(parse_cpulist(value))
    except ValueError:
        return False
