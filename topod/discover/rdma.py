"""RDMA ports of a PCI function: `<function>/infiniband/<device>/ports/<n>/{state,
phys_state,link_layer}` as the kernel's ib_core writes them (`4: ACTIVE`, `5: LinkUp`,
`InfiniBand` or `Ethernet`). Read on every scan (a port goes up and down while the
device stays); the GPU-NIC pairing offers only ACTIVE ports."""

from __future__ import annotations

from topod.discover.notes import Notes
from topod.host import HostRoot
from topod.model import RDMA_PORT_STATES, RdmaPort

MAX_PORTS = 64  # no HCA has more; a longer listing is a broken or hostile tree


def _numbered_name(text: str | None) -> str | None:
    """The name of a sysfs 'N: NAME' value ('4: ACTIVE' -> 'ACTIVE'; a bare name as it is);
    None when missing or when what stands before the colon is not a number."""
    if text is None:
        return None
    value = text.strip()
    if ":" in value:
        number, _, value = value.partition(":")
        if not number.strip().isdigit():
            return None
    return value.strip()


def parse_port_state(text: str | None) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE'; a bare name is accepted; None for anything else."""
    value = _numbered_name(text)
    return value if value in RDMA_PORT_STATES else None


def parse_phys_state(text: str | None) -> str | None:
    """'5: LinkUp' -> 'LinkUp'; None when empty or malformed."""
    value = _numbered_name(text)
    return value if value and value.replace("_", "").isalnum() else None


def parse_link_layer(text: str | None) -> str | None:
    value = (text or "").strip()
    return value if value in ("InfiniBand", "Ethernet") else None


def read_rdma_ports(host: HostRoot, base: str, devices: list[str], notes: Notes) -> list[RdmaPort]:
    """Ports of each infiniband/<device> of the function at `base` (a root-relative path)."""
    ports: list[RdmaPort] = []
    for device in sorted(devices):
        where = f"{base}/infiniband/{device}/ports"
        numbers = sorted(int(name) for name in host.listdir(where) if name.isdigit() and 0 < int(name) <= MAX_PORTS)
        for number in numbers:
            path = f"{where}/{number}"
            raw = host.read(f"{path}/state")
            state = parse_port_state(raw)
            if state is None:
                notes.add("bad_value" if raw is not None else "rdma_port_unreadable", f"{path}/state",
                          "not a port state like '4: ACTIVE'; the port is not offered" if raw is not None
                          else "no state; the port is not offered")
                state = "unknown"
            ports.append(RdmaPort(device=device, port=number, state=state,
                                  link_layer=parse_link_layer(host.read(f"{path}/link_layer")),
                                  phys_state=parse_phys_state(host.read(f"{path}/phys_state"))))
    return ports
