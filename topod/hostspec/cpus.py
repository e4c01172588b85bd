"""The CPU side of a host spec: sockets, cores, threads, NUMA nodes, caches."""

from __future__ import annotations

from dataclasses import dataclass

from topod.cpulist import format_cpulist, parse_cpulist


@dataclass(frozen=True, slots=True)
class CpuLayout:
    sockets: int
    cores_per_socket: int
    threads_per_core: int
    numa_per_socket: int
    offline: frozenset[int]
    isolated: tuple[int, ...]
    nohz_full: tuple[int, ...]
    memory_gib_per_node: int
    distances: tuple[tuple[int, ...], ...]
    memory_only_nodes: int = 0

    @property
    def total_cores(self) -> int:
        return self.sockets * self.cores_per_socket

    @property
    def cpu_count(self) -> int:
        return self.total_cores * self.threads_per_core

    @property
    def node_count(self) -> int:
        return self.sockets * self.numa_per_socket

    def cpu_of(self, core: int, thread: int) -> int:
        """Linux numbers first threads of every core, then their siblings."""
        return thread * self.total_cores + core

    def core_of(self, cpu: int) -> int:
        return cpu % self.total_cores

    def socket_of(self, cpu: int) -> int:
        return self.core_of(cpu) // self.cores_per_socket

    def node_of(self, cpu: int) -> int:
        core = self.core_of(cpu)
        per_node = self.cores_per_socket // self.numa_per_socket
        return self.socket_of(cpu) * self.numa_per_socket + (core % self.cores_per_socket) // per_node

    def siblings(self, cpu: int) -> list[int]:
        return [self.cpu_of(self.core_of(cpu), t) for t in range(self.threads_per_core)]

    def node_cpus(self, node: int) -> list[int]:
        return [cpu for cpu in range(self.cpu_count) if self.node_of(cpu) == node]

    def online(self) -> list[int]:
        return [cpu for cpu in range(self.cpu_count) if cpu not in self.offline]


def default_distances(sockets: int, numa_per_socket: int) -> tuple[tuple[int, ...], ...]:
    nodes = sockets * numa_per_socket
    rows = []
    for a in range(nodes):
        row = []
        for b in range(nodes):
            if a == b:
                row.append(10)
            elif a // numa_per_socket == b // numa_per_socket:
                row.append(12)
            else:
                row.append(32 if numa_per_socket > 1 else 21)
        rows.append(tuple(row))
    return tuple(rows)


def layout_from_spec(spec: dict) -> CpuLayout:
    cpu = spec.get("cpu", {})
    sockets = int(cpu.get("sockets", 1))
    numa = int(cpu.get("numa_per_socket", 1))
    memory_only = int(cpu.get("memory_only_nodes", 0))
    distances = cpu.get("distances")
    rows = tuple(tuple(int(v) for v in row) for row in distances) if distances else default_distances(sockets, numa)
    if memory_only and not distances:
        rows = _with_memory_only_nodes(rows, memory_only)
    return CpuLayout(
        sockets=sockets,
        cores_per_socket=int(cpu.get("cores_per_socket", 4)),
        threads_per_core=int(cpu.get("threads_per_core", 1)),
        numa_per_socket=numa,
        offline=frozenset(parse_cpulist(str(cpu.get("offline", "")))),
        isolated=tuple(parse_cpulist(str(cpu.get("isolated", "")))),
        nohz_full=tuple(parse_cpulist(str(cpu.get("nohz_full", "")))),
        memory_gib_per_node=int(cpu.get("memory_gib_per_node", 16)),
        distances=rows,
        memory_only_nodes=memory_only,
    )


def _with_memory_only_nodes(rows: tuple[tuple[int, ...], ...], extra: int) -> tuple[tuple[int, ...], ...]:
    """Memory-only nodes (CXL-style) each close to CPU node i % nodes."""
    base = len(rows)
    total = base + extra
    out = []
    for a in range(total):
        row = []
        for b in range(total):
            if a == b:
                row.append(10)
            elif a < base and b < base:
                row.append(rows[a][b])
            else:
                home_a = a if a < base else (a - base) % base
                home_b = b if b < base else (b - base) % base
                row.append(14 if home_a == home_b else rows[home_a][home_b] + 4)
        out.append(tuple(row))
    return tuple(out)


def write_cpu_tree(write, layout: CpuLayout) -> None:
    """sys/devices/system/{cpu,node}."""
    online = layout.online()
    base = "sys/devices/system/cpu"
    write(f"{base}/online", format_cpulist(online) + "\n")
    write(f"{base}/possible", f"0-{layout.cpu_count - 1}\n")
    write(f"{base}/present", f"0-{layout.cpu_count - 1}\n")
    write(f"{base}/offline", format_cpulist(sorted(layout.offline)) + "\n")
    write(f"{base}/isolated", format_cpulist(layout.isolated) + "\n")
    write(f"{base}/nohz_full", (format_cpulist(layout.nohz_full) or "(null)") + "\n")
    for cpu in range(layout.cpu_count):
        cdir = f"{base}/cpu{cpu}"
        if cpu != 0:
            write(f"{cdir}/online", "0\n" if cpu in layout.offline else "1\n")
        if cpu in layout.offline:
            continue
        core = layout.core_of(cpu)
        siblings = [s for s in layout.siblings(cpu) if s not in layout.offline]
        write(f"{cdir}/topology/core_id", f"{core % layout.cores_per_socket}\n")
        write(f"{cdir}/topology/physical_package_id", f"{layout.socket_of(cpu)}\n")
        write(f"{cdir}/topology/thread_siblings_list", format_cpulist(siblings) + "\n")
        write(f"{cdir}/topology/core_cpus_list", format_cpulist(siblings) + "\n")
        package_cpus = [c for c in online if layout.socket_of(c) == layout.socket_of(cpu)]
        write(f"{cdir}/topology/package_cpus_list", format_cpulist(package_cpus) + "\n")
        l3 = [c for c in online if layout.node_of(c) == layout.node_of(cpu)]
        for index, (level, kind, shared) in enumerate(
            [(1, "Data", siblings), (1, "Instruction", siblings), (2, "Unified", siblings), (3, "Unified", l3)]
        ):
            cache = f"{cdir}/cache/index{index}"
            write(f"{cache}/level", f"{level}\n")
            write(f"{cache}/type", f"{kind}\n")
            write(f"{cache}/shared_cpu_list", format_cpulist(shared) + "\n")
    total_nodes = len(layout.distances)
    nbase = "sys/devices/system/node"
    write(f"{nbase}/online", f"0-{total_nodes - 1}\n")
    write(f"{nbase}/possible", f"0-{total_nodes - 1}\n")
    for node in range(total_nodes):
        ndir = f"{nbase}/node{node}"
        cpus = layout.node_cpus(node) if node < layout.node_count else []
        write(f"{ndir}/cpulist", format_cpulist(cpus) + "\n")
        write(f"{ndir}/distance", " ".join(str(v) for v in layout.distances[node]) + "\n")
        kib = layout.memory_gib_per_node * 1024 * 1024
        write(f"{ndir}/meminfo", f"Node {node} MemTotal:       {kib} kB\nNode {node} MemFree:        {kib // 2} kB\n")
