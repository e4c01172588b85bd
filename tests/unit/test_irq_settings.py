"""The [irq] section: one place for the modes and the defaults."""

from __future__ import annotations

import pytest

import topod.irq.cycle as cycle
from topod.errors import ConfigError
from topod.irq.settings import DEFAULTS, IRQBALANCE_CHOICES, MODES, IrqSettings


def test_modes_and_choices_are_spelled_once():
    assert MODES == ("continuous", "dry-run", "off") and IRQBALANCE_CHOICES == ("yield", "ban")
    assert cycle.MODES is MODES


def test_an_empty_section_gives_the_documented_defaults():
    settings = IrqSettings.from_section({})
    assert settings == IrqSettings()
    for key in ("mode", "irqbalance", "min_gain", "cooldown_seconds", "retry_base_seconds", "retry_max_seconds"):
        assert getattr(settings, key) == DEFAULTS[key]
    assert settings.banned_cpus == frozenset() and DEFAULTS["banned_cpus"] == ""
    with pytest.raises(TypeError):
        DEFAULTS["mode"] = "off"  # type: ignore[index]


@pytest.mark.parametrize("section, message", [
    ({"mode": "sometimes"}, "irq.mode: 'sometimes' is not one of continuous, dry-run, off"),
    ({"irqbalance": "fight"}, "irq.irqbalance: 'fight' is not one of yield, ban"),
    ({"cooldown_seconds": "soon"}, "irq.cooldown_seconds: expected a number"),
])
def test_bad_values_say_what_is_allowed(section, message):
    with pytest.raises(ConfigError, match=message):
        IrqSettings.from_section(section)
