"""The PCI side of a host spec: root complexes, switches, endpoints, their IRQ vectors."""

from __future__ import annotations

from dataclasses import dataclass, field

# kind -> (vendor, device, class, driver, default queue vectors)
KIND_DEFAULTS: dict[str, tuple[int, int, int, str | None, int]] = {
    "gpu": (0x10DE, 0x2324, 0x030200, "nvidia", 1),
    "nvswitch": (0x10DE, 0x22A3, 0x068000, "nvidia", 1),
    "rdma": (0x15B3, 0x1021, 0x020700, "mlx5_core", 8),
    "nic": (0x8086, 0x1593, 0x020000, "ice", 4),
    "nvme": (0x144D, 0xA80A, 0x010802, "nvme", 8),
    "other": (0x1A03, 0x2000, 0x030000, "ast", 0),
    "amd-gpu": (0x1002, 0x740C, 0x038000, "amdgpu", 1),
    "instinct": (0x1002, 0x74A1, 0x120000, "amdgpu", 1),  # MI300X OAM: a processing accelerator
    "virtio-net": (0x1AF4, 0x1041, 0x020000, "virtio-pci", 0),
    "virtio-blk": (0x1AF4, 0x1042, 0x010000, "virtio-pci", 0),
    "ahci": (0x8086, 0x2922, 0x010601, "ahci", 0),
}
BRIDGE = (0x8086, 0x352A, 0x060400, "pcieport")
AMD_VENDOR = 0x1002
SWITCH_PORT = (0x1000, 0xC030, 0x060400, "pcieport")  # a Broadcom PEX Gen5 switch
SPEEDS = {3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe"}
# MI300-class parts sit behind their own bridge pair (an upstream and a downstream port of
# the package, lspci's 1002:14a0 / 1002:14a1) wherever they are plugged.
INTERNAL_BRIDGES: dict[str, tuple[tuple[int, int, int, str], tuple[int, int, int, str]]] = {
    "instinct": ((0x1002, 0x14A0, 0x060400, "pcieport"), (0x1002, 0x14A1, 0x060400, "pcieport")),
}
AMD_KINDS = ("amd-gpu", "instinct")


@dataclass(slots=True)
class Function:
    address: str
    path: str  # sys/devices/pciDDDD:BB/.../address
    vendor: int
    device: int
    class_code: int
    driver: str | None
    numa_node: int
    local_cpus: list[int]
    speed: str
    width: int
    max_speed: str
    max_width: int
    kind: str
    queues: int = 0
    name: str | None = None  # device name NVML reports, for GPUs
    names: dict[str, str] = field(default_factory=dict)  # class dir -> name
    irqs: list[int] = field(default_factory=list)
    port_states: list[str] = field(default_factory=list)  # RDMA: one per port, e.g. ["ACTIVE"]
    link_layer: str = "InfiniBand"  # RDMA: InfiniBand | Ethernet (RoCE)
    home_node: int | None = None  # the node it truly sits on, whatever firmware says (KFD's io_link)


@dataclass(slots=True)
class PciBuilder:
    """Lays out buses and addresses the way firmware typically does."""

    node_cpus: dict[int, list[int]]
    default_gen: int
    functions: list[Function] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    next_irq: int = 64
    root_contexts: dict[int, _Context] = field(default_factory=dict)

    def add_detached(self, spec: dict) -> None:
        """A function outside any host bridge: a plain directory in sys/bus/pci/devices
        (captured trees, some hypervisors' pass-through)."""
        node = int(spec.get("node", 0))
        ctx = _Context(self, 0, node, list(self.node_cpus.get(node, [])), self.default_gen)
        address = str(spec["address"])
        ctx.endpoint_at(dict(spec), f"sys/bus/pci/devices/{address}", address)

    def counter(self, kind: str) -> int:
        value = self.counters.get(kind, 0)
        self.counters[kind] = value + 1
        return value

    def add_root_complex(self, index: int, spec: dict) -> None:
        bus = int(spec.get("bus", 0x10 + index * 0x20))
        domain = int(spec.get("domain", 0))
        node = int(spec["node"])
        firmware_node = int(spec.get("firmware_numa_node", node))
        local = list(self.node_cpus.get(node, [])) if spec.get("local_cpus", True) else []
        rc = f"pci{domain:04x}:{bus:02x}"
        ctx = _Context(self, domain, firmware_node, local, spec.get("gen", self.default_gen), node)
        next_bus = [bus + 1]
        port = [1]

        def root_port() -> tuple[str, str]:
            address = f"{domain:04x}:{bus:02x}:{port[0]:02x}.0"
            port[0] += 1
            path = f"sys/devices/{rc}/{address}"
            ctx.bridge(address, path, BRIDGE)
            return address, path

        for switch in spec.get("switches", []):
            _, path = root_port()
            ctx.switch(switch, path, next_bus)
        for device in spec.get("devices", []):
            _, path = root_port()
            ctx.endpoint(device, path, next_bus)
        self.root_contexts[index] = ctx
        for device in spec.get("root_bus_devices", []):
            address = f"{domain:04x}:{bus:02x}:{port[0]:02x}.0"
            port[0] += 1
            ctx.endpoint_at(device, f"sys/devices/{rc}/{address}", address)


@dataclass(slots=True)
class _Context:
    builder: PciBuilder
    domain: int
    numa_node: int
    local_cpus: list[int]
    gen: int
    home_node: int | None = None

    def bridge(self, address: str, path: str, ids: tuple[int, int, int, str]) -> None:
        speed = SPEEDS[self.gen]
        self.builder.functions.append(
            Function(address, path, ids[0], ids[1], ids[2], ids[3], self.numa_node, self.local_cpus,
                     speed, 16, speed, 16, "bridge")
        )

    def switch(self, spec: dict, parent_path: str, next_bus: list[int]) -> None:
        up_bus = next_bus[0]
        next_bus[0] += 1
        upstream = f"{self.domain:04x}:{up_bus:02x}:00.0"
        up_path = f"{parent_path}/{upstream}"
        self.bridge(upstream, up_path, SWITCH_PORT)
        down_bus = next_bus[0]
        next_bus[0] += 1
        slot = 0
        for device in spec.get("devices", []):
            downstream = f"{self.domain:04x}:{down_bus:02x}:{slot:02x}.0"
            slot += 1
            down_path = f"{up_path}/{downstream}"
            self.bridge(downstream, down_path, SWITCH_PORT)
            self.endpoint(device, down_path, next_bus)
        for child in spec.get("switches", []):
            downstream = f"{self.domain:04x}:{down_bus:02x}:{slot:02x}.0"
            slot += 1
            down_path = f"{up_path}/{downstream}"
            self.bridge(downstream, down_path, SWITCH_PORT)
            self.switch(child, down_path, next_bus)

    def endpoint(self, device: str | dict, parent_path: str, next_bus: list[int]) -> None:
        """The device on the next free bus; a part with its own bridge pair takes two more."""
        kind = device if isinstance(device, str) else str(device["kind"])
        for ids in INTERNAL_BRIDGES.get(kind, ()):
            address = f"{self.domain:04x}:{next_bus[0]:02x}:00.0"
            next_bus[0] += 1
            parent_path = f"{parent_path}/{address}"
            self.bridge(address, parent_path, ids)
        address = f"{self.domain:04x}:{next_bus[0]:02x}:00.0"
        next_bus[0] += 1
        self.endpoint_at(device, f"{parent_path}/{address}", address)

    def endpoint_at(self, device: str | dict, path: str, address: str) -> None:
        spec = {"kind": device} if isinstance(device, str) else dict(device)
        kind = spec["kind"]
        vendor, dev_id, class_code, driver, queues = KIND_DEFAULTS[kind]
        speed = SPEEDS[int(spec.get("gen", self.gen))]
        width = int(spec.get("width", 16 if kind in ("gpu", "rdma", *AMD_KINDS) else 4))
        function = Function(
            address=address,
            path=path,
            vendor=int(spec.get("vendor", vendor)),
            device=int(spec.get("device", dev_id)),
            class_code=int(spec.get("class", class_code)),
            driver=spec.get("driver", driver),
            numa_node=int(spec.get("firmware_numa_node", self.numa_node)),
            local_cpus=self.local_cpus,
            speed=SPEEDS[int(spec["trained_gen"])] if "trained_gen" in spec else speed,
            width=int(spec.get("trained_width", width)),
            max_speed=speed,
            max_width=width,
            kind="gpu" if kind in AMD_KINDS else kind,
            queues=int(spec.get("queues", queues)),
            name=spec.get("name"),
            home_node=self.home_node if self.home_node is not None else self.numa_node,
        )
        if function.kind == "rdma":
            # ports = N (all ACTIVE) or port_state = "DOWN" / ["ACTIVE", "DOWN"]: one per port
            states = spec.get("port_state", ["ACTIVE"] * int(spec.get("ports", 1)))
            function.port_states = [str(states)] if isinstance(states, str) else [str(x) for x in states]
            function.link_layer = str(spec.get("link_layer", "InfiniBand"))
        self._name_children(function)
        self.builder.functions.append(function)

    def _name_children(self, function: Function) -> None:
        number = self.builder.counter(function.kind)
        if function.kind == "rdma":
            function.names = {"infiniband": f"mlx5_{number}", "net": f"ibp{number}s0"}
        elif function.kind == "nic":
            function.names = {"net": f"ens{number}f0"}
        elif function.kind == "nvme":
            function.names = {"nvme": f"nvme{number}"}
        elif function.kind == "gpu" and function.vendor == AMD_VENDOR:
            # amdgpu makes 8 DRM minors per MI300-class GPU (the rest belong to its
            # amdgpu_xcp partition devices): its own card steps by 8 (render nodes:
            # topod.hostspec.kfd).
            function.names = {"drm": f"card{1 + 8 * number}"}
        elif function.kind == "gpu":
            function.names = {"drm": f"card{number + 1}"}
        elif function.kind in ("virtio-net", "virtio-blk"):
            virtio = self.builder.counter("virtio")  # virtio devices share one numbering
            function.names = ({f"virtio{virtio}/net": f"eth{number}"} if function.kind == "virtio-net"
                              else {f"virtio{virtio}/block": f"vd{chr(ord('a') + number)}"})


def irq_names(function: Function) -> list[str]:
    """The names the driver gives its vectors in /proc/interrupts."""
    if function.kind == "rdma":
        names = [f"mlx5_async{0}@pci:{function.address}"]
        return names + [f"mlx5_comp{q}@pci:{function.address}" for q in range(function.queues)]
    if function.kind == "nvme":
        controller = function.names.get("nvme", "nvme0")
        return [f"{controller}q{q}" for q in range(function.queues + 1)]
    if function.kind == "nic":
        netdev = function.names.get("net", "eth0")
        return [f"ice-{function.address}:misc"] + [f"ice-{netdev}-TxRx-{q}" for q in range(function.queues)]
    if function.kind in ("gpu", "nvswitch") and function.queues:
        return ["nvidia"]
    return []
