"""Write a host tree (sys/, proc/, dev/, nvml.json) from a spec.

A spec is a small TOML document; see topod/hostspec/hosts/*.toml. The tree it writes is
what discovery, the IRQ balancer and doctor read, in the kernel's own formats.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from importlib import resources
from pathlib import Path

from topod.cpulist import format_cpulist
from topod.errors import ConfigError
from topod.hostspec.cpus import CpuLayout, layout_from_spec, write_cpu_tree
from topod.hostspec.memnodes import gpu_memory_nodes, write_memory_nodes
from topod.hostspec.kfd import write_kfd_tree
from topod.hostspec.pci import AMD_VENDOR, Function, PciBuilder, irq_names

SPEC_PACKAGE = "topod.hostspec"
PORT_STATE_NUMBERS = {"NOP": 0, "DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}


def builtin_spec_names() -> list[str]:
    folder = resources.files(SPEC_PACKAGE) / "hosts"
    return sorted(entry.name[:-5] for entry in folder.iterdir() if entry.name.endswith(".toml"))


def load_builtin_spec(name: str) -> dict:
    path = resources.files(SPEC_PACKAGE) / "hosts" / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(f"no built-in host spec {name!r}; known: {', '.join(builtin_spec_names())}")
    return tomllib.loads(path.read_text())


def load_spec(path: str | os.PathLike[str]) -> dict:
    try:
        return tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"host spec {path}: {exc}") from exc


class _Writer:
    def __init__(self, root: Path) -> None:
        self.root = root

    def __call__(self, rel: str, text: str) -> None:
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def link(self, rel: str, target: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink() or path.exists():
            path.unlink()
        os.symlink(target, path)


def build_host(spec: dict, root: str | os.PathLike[str]) -> Path:
    """Write the host tree for spec under root; returns root."""
    out = Path(root)
    out.mkdir(parents=True, exist_ok=True)
    write = _Writer(out)
    layout = layout_from_spec(spec)
    write_cpu_tree(write, layout)
    write_memory_nodes(write, spec, layout)
    if spec.get("hostname"):
        write("proc/sys/kernel/hostname", f"{spec['hostname']}\n")
    node_cpus = {n: [c for c in layout.node_cpus(n) if c not in layout.offline] for n in range(layout.node_count)}
    pci = PciBuilder(node_cpus=node_cpus, default_gen=int(spec.get("pcie_gen", 4)))
    for index, rc in enumerate(spec.get("root_complex", [])):
        pci.add_root_complex(index, rc)
    for detached in spec.get("detached_function", []):
        pci.add_detached(detached)
    _assign_irqs(pci.functions, pci)
    for function in pci.functions:
        _write_function(write, function, layout)
    _write_proc(write, layout, pci.functions, spec)
    amd_gpus = [f for f in pci.functions if f.kind == "gpu" and f.vendor == AMD_VENDOR]
    write_kfd_tree(write, write.link, spec, amd_gpus, node_cpus, layout.distances)
    gpus = [f for f in pci.functions if f.kind == "gpu" and f.vendor != AMD_VENDOR]  # NVML's
    minors = gpu_minors(spec, len(gpus))
    write_gpu_driver_files(write, spec, gpus, minors)
    write_hugepages(write, spec, len(layout.distances))
    if spec.get("nvml", {}).get("present", bool(gpus)) and gpus:
        document = _nvml_document(spec, gpus, pci.functions)
        if spec.get("driver", {}).get("nvml_minor_number", True):
            for entry, minor in zip(document["gpus"], minors):
                entry["minor_number"] = minor
        write("nvml.json", json.dumps(document, indent=2) + "\n")
    write("topod-fixture.json", json.dumps(_fixture_facts(spec, pci.functions), indent=2) + "\n")
    return out


def gpu_minors(spec: dict, count: int) -> list[int]:
    """[driver] minors: "reversed", a list (one per GPU in NVML order), or identity (default)."""
    given = spec.get("driver", {}).get("minors", "identity")
    if given == "reversed":
        return list(reversed(range(count)))
    if isinstance(given, list):
        if len(given) != count or len(set(given)) != count:
            raise ConfigError(f"[driver] minors: {count} distinct numbers expected, got {given}")
        return [int(m) for m in given]
    return list(range(count))


def write_gpu_driver_files(write: _Writer, spec: dict, gpus: list[Function], minors: list[int]) -> None:
    """/dev/nvidiaN by device minor, and the driver's /proc/driver/nvidia/gpus/<bdf>/information
    (NVIDIA GPUs only; [driver] information = false leaves them out, as on a captured tree)."""
    model = spec.get("nvml", {}).get("model", "NVIDIA H800")
    for index, (gpu, minor) in enumerate(zip(gpus, minors)):
        write(f"dev/nvidia{minor}", "")
        if gpu.vendor != 0x10DE or not spec.get("driver", {}).get("information", True):
            continue
        irq = gpu.irqs[0] if gpu.irqs else 0
        write(f"proc/driver/nvidia/gpus/{gpu.address}/information", (
            f"Model: \t\t {gpu.name or model}\nIRQ:   \t\t {irq}\nGPU UUID: \t {_uuid(str(spec.get('name')), index)}\n"
            "Video BIOS: \t 96.00.74.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n"
            f"Bus Location: \t {gpu.address}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n"))


def write_hugepages(write: _Writer, spec: dict, nodes: int) -> None:
    """nodeN/hugepages/hugepages-<kB>kB/{nr,free}_hugepages. [hugepages] maps a size in kB to
    one entry per node, each a page count (all free) or [total, free]; sizes not given
    (of 2048 and 1048576, what x86 offers) get empty pools."""
    table = {"2048": [0] * nodes, "1048576": [0] * nodes, **spec.get("hugepages", {})}
    for size, per_node in table.items():
        for node in range(nodes):
            entry = per_node[node] if node < len(per_node) else 0
            total, free = (entry, entry) if isinstance(entry, int) else (int(entry[0]), int(entry[1]))
            base = f"sys/devices/system/node/node{node}/hugepages/hugepages-{int(size)}kB"
            write(f"{base}/nr_hugepages", f"{total}\n")
            write(f"{base}/free_hugepages", f"{free}\n")
            write(f"{base}/surplus_hugepages", "0\n")


def _assign_irqs(functions: list[Function], pci: PciBuilder) -> None:
    for function in functions:
        count = len(irq_names(function))
        function.irqs = list(range(pci.next_irq, pci.next_irq + count))
        pci.next_irq += count


def _write_function(write: _Writer, f: Function, layout: CpuLayout) -> None:
    base = f.path
    write(f"{base}/vendor", f"0x{f.vendor:04x}\n")
    write(f"{base}/device", f"0x{f.device:04x}\n")
    # A reference board's subsystem ids are its chip's (NCCL's XML carries them, and its
    # ranks must agree on every attribute of a shared switch).
    write(f"{base}/subsystem_vendor", f"0x{f.vendor:04x}\n")
    write(f"{base}/subsystem_device", f"0x{f.device:04x}\n")
    write(f"{base}/class", f"0x{f.class_code:06x}\n")
    write(f"{base}/numa_node", f"{f.numa_node}\n")
    write(f"{base}/local_cpulist", format_cpulist(f.local_cpus) + "\n")
    write(f"{base}/local_cpus", _cpumask(f.local_cpus, layout.cpu_count) + "\n")
    write(f"{base}/current_link_speed", f"{f.speed}\n")
    write(f"{base}/current_link_width", f"{f.width}\n")
    write(f"{base}/max_link_speed", f"{f.max_speed}\n")
    write(f"{base}/max_link_width", f"{f.max_width}\n")
    for irq in f.irqs:
        write(f"{base}/msi_irqs/{irq}", "msix\n")
    for cls, name in f.names.items():  # cls may be nested: virtio0/net
        write(f"{base}/{cls}/{name}/uevent", f"DEVNAME={name}\n")
        top = cls.rsplit("/", 1)[-1]
        write.link(f"sys/class/{top}/{name}", os.path.relpath(f"{base}/{cls}/{name}", f"sys/class/{top}"))
    for index, state in enumerate(f.port_states, start=1):  # RDMA ports, as ib_core writes them
        port = f"{base}/infiniband/{f.names.get('infiniband', 'mlx5_0')}/ports/{index}"
        write(f"{port}/state", f"{PORT_STATE_NUMBERS.get(state, 1)}: {state}\n")
        write(f"{port}/phys_state", "5: LinkUp\n" if state == "ACTIVE" else "3: Disabled\n")
        write(f"{port}/link_layer", f"{f.link_layer}\n")
    if f.driver:
        write(f"sys/bus/pci/drivers/{f.driver}/.keep", "")
        write.link(f"{base}/driver", os.path.relpath(f"sys/bus/pci/drivers/{f.driver}", base))
    if base != f"sys/bus/pci/devices/{f.address}":  # a detached function is a plain directory there
        write.link(f"sys/bus/pci/devices/{f.address}", os.path.relpath(base, "sys/bus/pci/devices"))


def _cpumask(cpus: list[int], count: int) -> str:
    value = sum(1 << cpu for cpu in cpus)
    words = max(1, (count + 31) // 32)
    return ",".join(f"{(value >> (32 * i)) & 0xFFFFFFFF:08x}" for i in reversed(range(words)))


# /proc/cpuinfo's identity lines per [cpu] identity (as the kernel prints them): NCCL's
# topology needs a CPU's arch, and on x86 its vendor, family and model (topod.export.nccl).
CPU_IDENTITIES = {
    "intel": "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
             "model name\t: Intel(R) Xeon(R) Platinum 8480+\n",
    "amd": "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
           "model name\t: AMD EPYC 9654 96-Core Processor\n",
    "grace": "BogoMIPS\t: 2000.00\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\n"
             "CPU part\t: 0xd4f\nCPU revision\t: 0\n",
    "none": "",  # a tree whose cpuinfo says nothing of the CPU
}


def _write_proc(write: _Writer, layout: CpuLayout, functions: list[Function], spec: dict) -> None:
    online = layout.online()
    name = spec.get("cpu", {}).get("identity", "intel")
    if name not in CPU_IDENTITIES:
        raise ConfigError(f"host spec: [cpu] identity {name!r} is not one of {', '.join(CPU_IDENTITIES)}")
    identity = CPU_IDENTITIES[name]
    write("proc/cpuinfo", "".join(
        f"processor\t: {c}\n{identity}physical id\t: {layout.socket_of(c)}\ncore id\t\t: "
        f"{layout.core_of(c) % layout.cores_per_socket}\n\n" for c in online))
    total_kib = layout.memory_gib_per_node * 1024 * 1024 * len(layout.distances)
    write("proc/meminfo", f"MemTotal:       {total_kib} kB\nMemFree:        {total_kib // 2} kB\n")
    write("proc/stat", "cpu  100 0 100 1000 0 0 0 0 0 0\n" + "".join(
        f"cpu{c} 10 0 10 100 0 0 0 0 0 0\n" for c in online))
    write("proc/softirqs", "                    " + "".join(f"CPU{c:<11}" for c in online) + "\n"
          + "".join(f"{name:>9}:" + "".join(f"{0:>11}" for _ in online) + "\n"
                    for name in ("HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED",
                                 "HRTIMER", "RCU")))
    start = spec.get("irq", {}).get("initial_affinity", "0")
    header = "     " + "".join(f"{'CPU' + str(c):>11}" for c in online) + "\n"
    lines = [header, f"{0:>4}:" + "".join(f"{0:>11}" for _ in online) + "   IO-APIC    2-edge      timer\n"]
    write("proc/irq/0/smp_affinity_list", format_cpulist(online) + "\n")
    write("proc/irq/0/effective_affinity_list", "0\n")
    write("proc/irq/0/node", "0\n")
    for f in functions:
        for irq, name in zip(f.irqs, irq_names(f)):
            chip = f"IR-PCI-MSIX-{f.address}"
            hwirq = f"{irq - f.irqs[0]}-edge"
            lines.append(f"{irq:>4}:" + "".join(f"{0:>11}" for _ in online) + f"  {chip:<24} {hwirq:<10}  {name}\n")
            write(f"proc/irq/{irq}/smp_affinity_list", f"{start}\n")
            write(f"proc/irq/{irq}/effective_affinity_list", f"{start.split(',')[0].split('-')[0]}\n")
            write(f"proc/irq/{irq}/node", f"{max(f.numa_node, 0) if f.numa_node >= 0 else -1}\n")
    lines.append("NMI:" + "".join(f"{0:>11}" for _ in online) + "   Non-maskable interrupts\n")
    lines.append("LOC:" + "".join(f"{0:>11}" for _ in online) + "   Local timer interrupts\n")
    lines.append("ERR:          0\n")
    write("proc/interrupts", "".join(lines))
    write("proc/cmdline", spec.get("cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1") + "\n")


def _nvml_document(spec: dict, gpus: list[Function], functions: list[Function]) -> dict:
    nvml = spec.get("nvml", {})
    switches = [f for f in functions if f.kind == "nvswitch"]
    fabric = nvml.get("fabric", "none")
    per_gpu_links = int(nvml.get("links_per_gpu", 18))
    pairs = {(int(a), int(b)): int(n) for a, b, n in nvml.get("pairs", [])}
    documents = []
    memory_nodes = gpu_memory_nodes(spec)
    domain = nvml.get("nvlink_domain")
    external = [f"00000000:F{k // 16:01X}:{k % 16:02X}.0" for k in range(int(nvml.get("external_switches", 0)))]
    for index, gpu in enumerate(gpus):
        links = []
        if fabric == "nvswitch" and external and not switches:  # NVL72: switch trays outside the host
            for link in range(per_gpu_links):
                links.append({"link": link, "active": True, "remote_pci_bus_id": external[link % len(external)],
                              "remote_device_type": "switch"})
        elif fabric == "nvswitch" and switches:
            for link in range(per_gpu_links):
                remote = switches[link % len(switches)]
                links.append({"link": link, "active": True, "remote_pci_bus_id": _nvml_bus_id(remote.address),
                              "remote_device_type": "switch"})
        elif fabric == "pairs":
            for (a, b), count in sorted(pairs.items()):
                if index in (a, b):
                    peer = gpus[b if index == a else a]
                    for _ in range(count):
                        links.append({"link": len(links), "active": True,
                                      "remote_pci_bus_id": _nvml_bus_id(peer.address), "remote_device_type": "gpu"})
        documents.append({
            "index": index,
            "pci_bus_id": _nvml_bus_id(gpu.address),
            "uuid": _uuid(str(spec.get("name")), index),
            "name": gpu.name or nvml.get("model", "NVIDIA H800"),
            "memory_total_mib": int(nvml.get("memory_mib", 81559)),
            "compute_capability": list(nvml.get("compute_capability", [9, 0])),
            "nvlinks": links,
            **_modern_fields(nvml, memory_nodes.get(index), domain),
        })
    return {"driver_version": nvml.get("driver_version", "535.129.03"), "gpus": documents}


def _modern_fields(nvml: dict, memory_node: int | None, domain: dict | None) -> dict:
    """memory_numa_node, c2c and fabric, only when the spec has them (older trees lack them)."""
    fields: dict[str, object] = {}
    if memory_node is not None:
        fields["memory_numa_node"] = memory_node
    if "c2c_gbps" in nvml:
        fields["c2c"] = {"bandwidth_gbps": float(nvml["c2c_gbps"])}
    if domain:
        fields["fabric"] = {"cluster_uuid": domain["cluster_uuid"], "clique_id": int(domain["clique_id"]),
                            "state": domain.get("state", "completed"), "health": domain.get("health", "ok")}
    return fields


def _uuid(host: str, index: int) -> str:
    digest = hashlib.sha1(f"{host}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _nvml_bus_id(address: str) -> str:
    domain, rest = address.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


def _fixture_facts(spec: dict, functions: list[Function]) -> dict:
    """What the builder knows that no kernel file says: used by tests, never by topod."""
    return {
        "name": spec.get("name"),
        "managed_irqs": [irq for f in functions if f.kind == "nvme" and spec.get("irq", {}).get("nvme_managed")
                         for irq in f.irqs],
        "devices": {f.address: {"kind": f.kind, "irqs": f.irqs, "names": f.names} for f in functions},
    }
