"""The [cluster] table: keys checked as DNS labels, values as plain strings."""

from __future__ import annotations

import pytest

from topod.errors import ConfigError
from topod.export.labels import parse_cluster_labels


def test_valid_table_comes_back_sorted():
    labels = parse_cluster_labels({"rack": "r12", "leaf": "leaf-3", "row-2b": "B"})
    assert labels == {"leaf": "leaf-3", "rack": "r12", "row-2b": "B"}
    assert list(labels) == ["leaf", "rack", "row-2b"]


def test_missing_table_means_no_labels():
    assert parse_cluster_labels(None) == {}
    assert parse_cluster_labels({}) == {}


@pytest.mark.parametrize("key", ["Rack", "rack_id", "-rack", "rack-", "", "a" * 64, "rack.zone", "ra ck"])
def test_bad_key_is_rejected_naming_the_key(key):
    with pytest.raises(ConfigError) as err:
        parse_cluster_labels({key: "x"})
    assert f"cluster.{key}" in str(err.value)
    assert "lowercase" in str(err.value)


def test_63_character_key_is_the_longest_allowed():
    assert parse_cluster_labels({"a" * 63: "x"}) == {"a" * 63: "x"}


@pytest.mark.parametrize("value,fragment", [
    (12, "expected a string, got int"),
    (True, "expected a string, got bool"),
    (["a"], "expected a string, got list"),
    ("", "empty value"),
    ("x" * 257, "at most 256"),
    ("r1\nr2", "control characters"),
])
def test_bad_value_is_rejected_naming_the_key(value, fragment):
    with pytest.raises(ConfigError, match=fragment) as err:
        parse_cluster_labels({"rack": value})
    assert "cluster.rack" in str(err.value)


def test_non_table_is_rejected():
    with pytest.raises(ConfigError, match="expected a table"):
        parse_cluster_labels(["rack=r1"])  # type: ignore[arg-type]


def test_section_name_is_used_in_messages():
    with pytest.raises(ConfigError, match=r"--label\.Rack"):
        parse_cluster_labels({"Rack": "r1"}, section="--label")
