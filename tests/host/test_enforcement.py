"""What the host can enforce, read from host trees that model each kind of host."""

from __future__ import annotations

from pathlib import Path

import pytest

from topod.enforce import host_enforcement, lease_mode, parse_mounts
from topod.host import HostRoot

HYBRID_MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,xattr,name=systemd 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
UNIFIED_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n"
LEGACY_MOUNTS = "cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0\n"


def _tree(tmp_path: Path, mounts: str, controllers: str | None = None, systemd: bool = True) -> HostRoot:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/mounts").write_text(mounts)
    if controllers is not None:
        base = tmp_path / ("sys/fs/cgroup" if "cgroup2 /sys/fs/cgroup " in mounts else "sys/fs/cgroup/unified")
        base.mkdir(parents=True)
        (base / "cgroup.controllers").write_text(controllers + "\n")
        (base / "cgroup.subtree_control").write_text(controllers + "\n")
    if systemd:
        (tmp_path / "run/systemd/system").mkdir(parents=True)
    return HostRoot(tmp_path)


def test_unified_hierarchy_with_cpuset_and_systemd_is_cgroup(tmp_path):
    verdict = host_enforcement(_tree(tmp_path, UNIFIED_MOUNTS, "cpuset cpu io memory pids"), live=True)
    assert verdict.mode == "cgroup"
    assert verdict.to_json()["cpuset"] == "v2"
    # topod starts no per-lease scopes: a lease never claims cgroup enforcement
    assert verdict.to_json()["leases"] == "affinity"


def test_hybrid_host_like_these_vms_is_affinity_and_says_why(tmp_path):
    verdict = host_enforcement(_tree(tmp_path, HYBRID_MOUNTS, "hugetlb"), live=True)
    assert verdict.mode == "affinity"
    assert "hybrid" in verdict.reason and "AllowedCPUs= has no effect" in verdict.reason
    assert verdict.to_json()["cpuset"] == "v1"


def test_unified_without_cpuset_controller_is_affinity(tmp_path):
    verdict = host_enforcement(_tree(tmp_path, UNIFIED_MOUNTS, "cpu io memory pids"), live=True)
    assert verdict.mode == "affinity"
    assert "without the cpuset controller" in verdict.reason


def test_unified_with_cpuset_but_no_systemd_is_affinity(tmp_path):
    verdict = host_enforcement(_tree(tmp_path, UNIFIED_MOUNTS, "cpuset cpu", systemd=False), live=True)
    assert verdict.mode == "affinity"
    assert "systemd is not running" in verdict.reason


def test_legacy_v1_host_is_affinity(tmp_path):
    verdict = host_enforcement(_tree(tmp_path, LEGACY_MOUNTS), live=True)
    assert verdict.mode == "affinity"
    assert verdict.facts.layout == "legacy"


def test_captured_tree_enforces_nothing_even_when_it_shows_cgroup_v2(tmp_path):
    verdict = host_enforcement(_tree(tmp_path, UNIFIED_MOUNTS, "cpuset cpu"))
    assert verdict.mode == "none"
    assert "captured host tree" in verdict.reason
    assert verdict.to_json()["leases"] == "none"


def test_lease_without_cpus_is_not_enforced():
    assert lease_mode("affinity", has_cpus=False) == "none"
    assert lease_mode("cgroup", has_cpus=True) == "affinity"
    assert lease_mode("none", has_cpus=True) == "none"


def test_mount_parser_prefers_the_unified_mount_at_sys_fs_cgroup():
    unified, legacy = parse_mounts("cgroup2 /other cgroup2 rw 0 0\n" + UNIFIED_MOUNTS + "garbage\n")
    assert unified == "/sys/fs/cgroup"
    assert legacy == {}
    _, legacy = parse_mounts(HYBRID_MOUNTS)
    assert legacy["/sys/fs/cgroup/cpuset"] == {"cpuset"}
    assert legacy["/sys/fs/cgroup/systemd"] == set()


def test_this_machine_verdict_matches_its_mounts():
    mounts = Path("/proc/self/mounts").read_text()
    unified, legacy = parse_mounts(mounts)
    verdict = host_enforcement(HostRoot("/"))
    if unified != "/sys/fs/cgroup":
        assert verdict.mode == "affinity", verdict.reason
    else:
        assert verdict.mode in ("cgroup", "affinity")
    if any("cpuset" in c for c in legacy.values()):
        assert verdict.mode == "affinity"
        assert verdict.to_json()["cpuset"] == "v1"
    if not Path("/run/systemd/system").is_dir():
        assert verdict.mode != "cgroup"


@pytest.mark.parametrize("mode", ["cgroup", "affinity", "none"])
def test_lease_mode_never_exceeds_host(mode):
    order = ["none", "affinity", "cgroup"]
    assert order.index(lease_mode(mode)) <= order.index(mode)
