import re
from pathlib import Path

import pytest

from topod.config import SCHEMA, defaults, load_config, parse_config
from topod.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_shipped_config_is_valid_and_documents_every_key():
    config = load_config(str(REPO / "etc" / "topod.toml"))
    text = (REPO / "etc" / "topod.toml").read_text()
    for section, keys in SCHEMA.items():
        assert f"[{section}]" in text
        for key in keys:
            if key not in ("policy", "irq_overrides", "device_overrides"):
                assert f"\n{key} =" in text, f"{section}.{key} undocumented"
    assert defaults().get("irq", "mode") == "dry-run", "a hand start writes no /proc/irq unless a config says so"
    assert config.get("irq", "mode") == "continuous", "the packaged config (make install) balances"
    config.values["irq"]["mode"] = "dry-run"
    assert config.values == {**defaults().values, "cluster": {}}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[nope]\n", "nope: unknown section"),
        ("[irq]\nmodee = 'off'\n", "irq.modee: unknown key"),
        ("[irq]\nmode = 'sometimes'\n", "irq.mode: 'sometimes' is not one of"),
        ("[irq]\ninterval_seconds = 'ten'\n", "irq.interval_seconds: expected a number"),
        ("[irq]\ninterval_seconds = -1\n", "irq.interval_seconds: must not be negative"),
        ("[alloc]\nreserved_cpus = '0-x'\n", "alloc.reserved_cpus"),
        ("[alloc]\nmax_queue = true\n", "alloc.max_queue: expected an integer"),
        ("[daemon]\nsocket_mode = '0999'\n", "daemon.socket_mode: expected an octal mode"),
        ("[cluster]\nrack = 12\n", "cluster.rack: expected a string"),
        ("[cluster]\n'bad key!' = 'x'\n", "cluster.bad key!"),
        # the exporters' rule: a newline would add a line to topology.conf, an upper-case
        # key is no NRT attribute name
        ("[cluster]\nleaf = \"a\\nSwitchName=x\"\n", "cluster.leaf: value contains control characters"),
        ("[cluster]\nRack = 'r1'\n", "cluster.Rack: bad key 'Rack'"),
        ("[cluster]\nrack = ''\n", "cluster.rack: empty value"),
        ("this is not toml", "not valid TOML"),
        ("[irq]\ninterval_seconds = nan\n", "irq.interval_seconds: must be a finite number"),
        ("[daemon]\nrescan_interval_seconds = inf\n", "daemon.rescan_interval_seconds: must be a finite number"),
        ("[irq]\ninterval_seconds = 0\n", "irq.interval_seconds: must be greater than 0"),
        ("[probe]\nmin_interval_seconds = 100\nmax_interval_seconds = 10\n",
         "probe.min_interval_seconds (100) must not exceed probe.max_interval_seconds (10)"),
        ("[udev]\nsource = 'netlink'\n", "udev.source: 'netlink' is not one of udev, kernel"),
        ("[udev]\nquiet = 1\n", "udev.quiet: unknown key"),
    ],
)
def test_bad_config_names_the_key_and_reason(text, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(text)


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(tmp_path / "none.toml"))


def test_values_override_defaults_and_leave_the_rest():
    config = parse_config("[irq]\nmode = 'off'\n[cluster]\nrack = 'r12'\n")
    assert config.get("irq", "mode") == "off"
    assert config.get("irq", "interval_seconds") == 10.0
    assert config.section("cluster") == {"rack": "r12"}


def test_defaults_come_from_the_code_that_uses_them():
    from topod.alloc.policy import PolicySettings
    from topod.discover.udev import UdevSettings
    from topod.irq.settings import DEFAULTS, MODES

    config = parse_config("")
    assert config.get("alloc", "aging_seconds") == PolicySettings().aging_seconds
    assert config.get("udev", "quiet_seconds") == UdevSettings().quiet_s
    assert config.get("irq", "min_gain") == DEFAULTS["min_gain"]
    with pytest.raises(ConfigError, match=", ".join(MODES)):
        parse_config("[irq]\nmode = 'x'\n")


def test_a_fifo_directory_or_device_as_the_config_is_refused_without_blocking(tmp_path):
    """A FIFO would block the start or a reload for ever; /dev/zero never ends."""
    import os

    from timebox import within

    fifo = tmp_path / "topod.toml"
    os.mkfifo(fifo)
    cases = [(str(fifo), "not a regular file (a FIFO)"), (str(tmp_path), "not a regular file (a directory)"),
             ("/dev/zero", "not a regular file (a character device)")]
    for path, words in cases:
        with within(5), pytest.raises(ConfigError, match=re.escape(words)):
            load_config(path)


def test_dev_null_is_an_empty_config_and_a_symlink_to_a_file_is_followed(tmp_path):
    assert load_config("/dev/null").values == defaults().values
    target = tmp_path / "real.toml"
    target.write_text('[irq]\nmode = "off"\n')
    (tmp_path / "link.toml").symlink_to(target)
    assert load_config(str(tmp_path / "link.toml")).get("irq", "mode") == "off"


def test_an_oversized_or_non_utf8_config_is_refused_with_its_reason(tmp_path):
    from topod.config import MAX_CONFIG_BYTES

    big = tmp_path / "big.toml"
    with open(big, "wb") as handle:
        handle.truncate(MAX_CONFIG_BYTES + 1)
    with pytest.raises(ConfigError, match=f"{MAX_CONFIG_BYTES + 1} bytes, over the {MAX_CONFIG_BYTES}-byte limit"):
        load_config(str(big))
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'[irq]\nmode = "d\xe9"\n')
    with pytest.raises(ConfigError, match="not UTF-8: invalid byte 0xe9 at offset 15"):
        load_config(str(latin))
    utf8 = tmp_path / "utf8.toml"
    utf8.write_bytes('[cluster]\nrack = "r\u00e9-12"\n'.encode())
    assert load_config(str(utf8)).get("cluster", "rack") == "r\u00e9-12"


def test_a_config_nested_too_deep_for_the_parser_is_a_config_error(tmp_path):
    deep = tmp_path / "deep.toml"
    deep.write_text("[irq]\nx = " + "[" * 100000 + "]" * 100000 + "\n")
    with pytest.raises(ConfigError, match="nested too deep"):
        load_config(str(deep))
