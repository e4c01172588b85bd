"""Is the host root a container? The same evidence `systemd-detect-virt --container` uses,
read through HostRoot: a container may see the host's /proc/irq (a privileged one, or one
whose manager's read-only overmount a service's fresh /proc undid), and rewriting the
host's IRQ affinity from inside a container is never what its owner meant."""

from __future__ import annotations

from topod.host import HostRoot

MARKERS = (".dockerenv", "run/.containerenv")  # docker, podman


def detect_container(host: HostRoot) -> str | None:
    """The container manager's name ('systemd-nspawn', 'docker', 'lxc', ...), or None."""
    name = (host.read_line("run/systemd/container") or "").strip()
    if name:
        return name
    environ = host.read("proc/1/environ")
    if environ:
        for entry in environ.split("\0"):
            if entry.startswith("container="):
                return entry.split("=", 1)[1].strip() or "container"
    for marker in MARKERS:
        if host.exists(marker):
            return "docker" if marker == ".dockerenv" else "podman"
    if host.is_dir("proc/vz") and not host.is_dir("proc/bc"):
        return "openvz"
    return None


def irq_writes_withheld(irq_section: dict, container: str | None) -> str | None:
    """Why continuous IRQ balancing only plans here, or None: in a container the host's
    IRQs are not the container's to move, unless [irq] allow_in_container says so."""
    if irq_section["mode"] != "continuous" or not container or irq_section["allow_in_container"]:
        return None
    return (f"running in a container ({container}): IRQ affinity is planned, not written; "
            "set [irq] allow_in_container = true to write it")
