"""A transient systemd scope per lease: `topod-lease-<id>.scope`.

`topoctl run` forks the job, asks systemd (org.freedesktop.systemd1.Manager.
StartTransientUnit on the system bus, mode "fail") to start a scope holding the job's pid
with the lease's CPUs (AllowedCPUs=), memory nodes (AllowedMemoryNodes=) and GPUs
(DevicePolicy=closed + DeviceAllow= for the leased /dev/nvidiaN and the NVIDIA control
nodes present), waits for the start job to finish, and only then lets the job exec. What
systemd can enforce with those properties depends on the host (topod.enforce): with cgroup
v2 and cpuset, the CPUs and memory nodes; on hybrid or v1 hosts they are recorded on the
unit and have no effect.

Two halves: the properties are built by pure functions (`scope_properties`, tested
without a bus), and the bus I/O (`start_scope`, `stop_scope`) is the only D-Bus client in
topod, through jeepney (pure Python: no libdbus or GLib to load into the daemon or to
install on the node).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from topod.errors import TopodError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from topod.host import HostRoot

SCOPE_PREFIX = "topod-lease-"
# Lease scopes live in their own slice, beside system.slice and user.slice: live isolation
# (topod.slices) narrows those to the housekeeping CPUs, and on cgroup v2 a child's cpuset
# is bounded by its parent's, so a scope under system.slice would lose its leased CPUs.
SCOPE_SLICE = "topod.slice"
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")  # under /dev, when present
CAPS_DIR = "nvidia-caps"  # /dev/nvidia-caps/*: MIG and other capability nodes
AMD_CONTROL_NODES = ("kfd",)  # /dev/kfd: every ROCm process opens it, beside its GPUs' render nodes
DEVICE_ACCESS = "rw"
SYSTEMD = "org.freedesktop.systemd1"
MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
BUS_TIMEOUT_SECONDS = 10.0
_UNIT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:_.-")


class ScopeError(TopodError):
    """No scope: the reason says why (no system bus, no systemd on it, refused, failed)."""

    code = "scope_unavailable"


# --- pure: names and properties ------------------------------------------------------

def unit_name(lease_id: str) -> str:
    """topod-lease-<id>.scope; characters a unit name may not hold are escaped as
    systemd-escape does (\\xNN), so any id gives one valid, distinct name."""
    escaped = "".join(c if c in _UNIT_CHARS else "".join(f"\\x{b:02x}" for b in c.encode()) for c in lease_id)
    return f"{SCOPE_PREFIX}{escaped}.scope"



def lease_of_unit(name: str) -> str | None:
    """The lease id a topod-lease-<id>.scope name stands for (unit_name's inverse); None
    for any other unit."""
    if not (name.startswith(SCOPE_PREFIX) and name.endswith(".scope")):
        return None
    return _unescape(name[len(SCOPE_PREFIX):-len(".scope")], "\\x", 4) or None


def unit_of_path(path: str) -> str | None:
    """The unit name of a systemd unit object path (/org/freedesktop/systemd1/unit/<label>,
    the label escaped as sd-bus does: each byte but [A-Za-z0-9] as _xx); None otherwise."""
    prefix = f"{MANAGER_PATH}/unit/"
    return _unescape(path[len(prefix):], "_", 3) if path.startswith(prefix) else None


def _unescape(text: str, mark: str, width: int) -> str:
    """Undo `mark`+two hex digits escapes (width: the escape's length)."""
    raw = bytearray()
    i = 0
    while i < len(text):
        if text.startswith(mark, i) and len(text) >= i + width:
            try:
                raw.append(int(text[i + width - 2:i + width], 16))
                i += width
                continue
            except ValueError:
                pass
        raw += text[i].encode()
        i += 1
    return raw.decode("utf-8", "replace")

def bitmask(ids: Iterable[int]) -> bytes:
    """CPU or NUMA node ids as systemd's AllowedCPUs=/AllowedMemoryNodes= D-Bus value (ay):
    id n is bit n % 8 of byte n // 8 (least significant bit first); no trailing zero bytes."""
    ids = sorted(set(ids))
    if ids and ids[0] < 0:
        raise ValueError(f"negative CPU or node id {ids[0]}")
    mask = bytearray(ids[-1] // 8 + 1 if ids else 0)
    for n in ids:
        mask[n // 8] |= 1 << (n % 8)
    return bytes(mask)


def control_nodes(host: HostRoot) -> list[str]:
    """The GPU control nodes this host has, as /dev paths: nvidiactl, nvidia-uvm,
    nvidia-uvm-tools, nvidia-caps/*, and AMD's /dev/kfd (read through the host root; absent
    ones are left out)."""
    nodes = [f"/dev/{name}" for name in CONTROL_NODES if host.exists(f"dev/{name}")]
    nodes += [f"/dev/{CAPS_DIR}/{name}" for name in host.listdir(f"dev/{CAPS_DIR}")]
    nodes += [f"/dev/{name}" for name in AMD_CONTROL_NODES if host.exists(f"dev/{name}")]
    return nodes


def device_allow(gpu_numbers: Iterable[int | str], controls: Sequence[str]) -> list[tuple[str, str]]:
    """DeviceAllow= entries (a(ss)): each leased GPU's /dev/nvidiaN (a number) or device
    node (a path: an AMD GPU's /dev/dri/renderDN), then the control nodes."""
    given = set(gpu_numbers)
    numbers = sorted(n for n in given if isinstance(n, int))
    gpus = [f"/dev/nvidia{n}" for n in numbers] + sorted(str(p) for p in given if not isinstance(p, int))
    return [(path, DEVICE_ACCESS) for path in gpus + [c for c in controls if c not in gpus]]


@dataclass(frozen=True, slots=True)
class ScopeSpec:
    lease_id: str
    pid: int
    cpus: tuple[int, ...]
    memory_nodes: tuple[int, ...]
    gpu_numbers: tuple[int | str, ...]  # N of each leased /dev/nvidiaN, or the GPU's device path
    controls: tuple[str, ...]  # control node paths present on this host
    job: str | None = None

    @property
    def name(self) -> str:
        return unit_name(self.lease_id)


def scope_properties(spec: ScopeSpec) -> list[tuple[str, tuple[str, object]]]:
    """StartTransientUnit's a(sv) properties, each value as (D-Bus signature, value).
    No AllowedCPUs=/AllowedMemoryNodes= when the lease has none (an empty mask means "no
    restriction" to systemd, never "nothing")."""
    description = f"topod lease {spec.lease_id}" + (f" ({spec.job})" if spec.job else "")
    props: list[tuple[str, tuple[str, object]]] = [
        ("Description", ("s", description)),
        ("PIDs", ("au", [spec.pid])),
        ("Slice", ("s", SCOPE_SLICE)),
        ("CollectMode", ("s", "inactive-or-failed")),
    ]
    if spec.cpus:
        props.append(("AllowedCPUs", ("ay", bitmask(spec.cpus))))
    if spec.memory_nodes:
        props.append(("AllowedMemoryNodes", ("ay", bitmask(spec.memory_nodes))))
    props.append(("DevicePolicy", ("s", "closed")))
    props.append(("DeviceAllow", ("a(ss)", device_allow(spec.gpu_numbers, spec.controls))))
    return props


# --- bus I/O (jeepney): the only D-Bus client --------------------------------------------

def _connect():
    try:
        from jeepney.io.blocking import open_dbus_connection
    except ImportError as exc:  # a broken install: the dependency is declared
        raise ScopeError(f"the D-Bus client (jeepney) is not installed: {exc}") from exc
    try:
        return open_dbus_connection(bus="SYSTEM", auth_timeout=2.0)
    except (OSError, ValueError, KeyError) as exc:
        raise ScopeError(f"no system bus to reach systemd ({exc.__class__.__name__}: {exc})") from exc


def _explain(exc: Exception) -> str:
    name = getattr(exc, "name", None)
    data = getattr(exc, "data", None)
    text = data[0] if isinstance(data, tuple) and data and isinstance(data[0], str) else str(exc)
    if name in ("org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner"):
        return f"systemd is not on the system bus ({text})"
    if name in ("org.freedesktop.DBus.Error.AccessDenied", "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired"):
        return f"systemd refused to start a unit for this user ({text}); run as root or allow it by polkit"
    return f"systemd refused the scope: {name or exc.__class__.__name__}: {text}"


def _call(conn, method: str, signature: str | None = None, body: tuple = (), timeout: float = BUS_TIMEOUT_SECONDS):
    from jeepney import DBusAddress, new_method_call
    from jeepney.wrappers import DBusErrorResponse, unwrap_msg

    address = DBusAddress(MANAGER_PATH, bus_name=SYSTEMD, interface=MANAGER)
    try:
        return unwrap_msg(conn.send_and_get_reply(new_method_call(address, method, signature, body), timeout=timeout))
    except DBusErrorResponse as exc:
        raise ScopeError(_explain(exc)) from exc
    except (OSError, TimeoutError) as exc:
        raise ScopeError(f"systemd did not answer {method} ({exc.__class__.__name__}: {exc})") from exc


def _run_job(method: str, signature: str, body: tuple, timeout: float) -> str:
    """Call a Manager method that queues a job and wait for the job's JobRemoved signal:
    the job's result (done, failed, canceled, timeout, dependency, skipped)."""
    from jeepney import MatchRule, message_bus
    from jeepney.wrappers import unwrap_msg

    # The bus matches a sender by its well-known name; signals arrive carrying systemd's
    # unique name, so the local filter matches on path, interface and member only.
    bus_rule = MatchRule(type="signal", sender=SYSTEMD, interface=MANAGER, member="JobRemoved", path=MANAGER_PATH)
    rule = MatchRule(type="signal", interface=MANAGER, member="JobRemoved", path=MANAGER_PATH)
    deadline = time.monotonic() + timeout
    with _connect() as conn:
        try:
            unwrap_msg(conn.send_and_get_reply(message_bus.AddMatch(bus_rule), timeout=timeout))
        except Exception as exc:  # noqa: BLE001 - any failure here is "no usable bus"
            raise ScopeError(f"the system bus refused a signal match ({exc})") from exc
        with conn.filter(rule, bufsize=64) as queue:
            _call(conn, "Subscribe", timeout=timeout)  # signals to this client (systemd sends none to nobody)
            job = _call(conn, method, signature, body, timeout)[0]
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ScopeError(f"systemd did not finish the {method} job {job} within {timeout:.0f} s")
                try:
                    signal = conn.recv_until_filtered(queue, timeout=left)
                except (OSError, TimeoutError) as exc:
                    raise ScopeError(f"no word from systemd on the {method} job {job} "
                                     f"({exc.__class__.__name__}: {exc})") from exc
                _id, path, _unit, result = signal.body
                if path == job:
                    return result


def start_scope(spec: ScopeSpec, timeout: float = BUS_TIMEOUT_SECONDS) -> str:
    """Start the lease's scope with spec.pid in it; returns the unit name once systemd's
    start job is done (the pid is in the scope's cgroup by then). ScopeError otherwise."""
    body = (spec.name, "fail", scope_properties(spec), [])
    result = _run_job("StartTransientUnit", "ssa(sv)a(sa(sv))", body, timeout)
    if result != "done":
        raise ScopeError(f"systemd's start job for {spec.name} ended '{result}' (journalctl -u {spec.name})")
    return spec.name


def place_pid(spec: ScopeSpec, timeout: float = BUS_TIMEOUT_SECONDS) -> bool:
    """Put spec.pid in the lease's scope: a new scope (True) or, when the lease has one
    already (another of its processes), into that one (False: AttachProcessesToUnit, whose
    properties were set by whoever started it). ScopeError otherwise."""
    try:
        start_scope(spec, timeout)
        return True
    except ScopeError as exc:
        if "UnitExists" not in str(exc):
            raise
    with _connect() as conn:
        _call(conn, "AttachProcessesToUnit", "ssau", (spec.name, "", [spec.pid]), timeout)
    return False


def scope_state(name: str, timeout: float = BUS_TIMEOUT_SECONDS) -> str | None:
    """The scope's ActiveState, None when systemd has no such unit loaded."""
    from jeepney import DBusAddress, Properties
    from jeepney.wrappers import DBusErrorResponse, unwrap_msg

    with _connect() as conn:
        try:
            path = _call(conn, "GetUnit", "s", (name,), timeout)[0]
        except ScopeError as exc:
            if "NoSuchUnit" in str(exc):
                return None
            raise
        unit = DBusAddress(path, bus_name=SYSTEMD, interface="org.freedesktop.systemd1.Unit")
        try:
            return unwrap_msg(conn.send_and_get_reply(Properties(unit).get("ActiveState"), timeout=timeout))[0][1]
        except DBusErrorResponse as exc:
            raise ScopeError(_explain(exc)) from exc


def stop_scope(name: str, timeout: float = BUS_TIMEOUT_SECONDS) -> bool:
    """Stop a scope (SIGTERM to what is left in it, then its TimeoutStopSec); False when
    there was no such unit loaded (already gone). ScopeError when systemd refused."""
    try:
        result = _run_job("StopUnit", "ss", (name, "replace"), timeout)
    except ScopeError as exc:
        if "NoSuchUnit" in str(exc):
            return False
        raise
    return result == "done"


# --- a unit's AllowedCPUs= (topod.slices: live isolation on cgroup v2) -----------------------

def cpus_of_mask(mask: bytes) -> tuple[int, ...]:
    """bitmask's inverse: the ids set in an AllowedCPUs= D-Bus value."""
    return tuple(byte * 8 + bit for byte, value in enumerate(mask) for bit in range(8) if value >> bit & 1)


def _unit_interface(name: str) -> str:
    kind = name.rsplit(".", 1)[-1]
    return f"org.freedesktop.systemd1.{kind.capitalize()}"


def unit_allowed_cpus(name: str, timeout: float = BUS_TIMEOUT_SECONDS) -> tuple[int, ...]:
    """The unit's AllowedCPUs= (() when it has none: no restriction)."""
    from jeepney import DBusAddress, Properties
    from jeepney.wrappers import DBusErrorResponse, unwrap_msg

    with _connect() as conn:
        path = _call(conn, "LoadUnit", "s", (name,), timeout)[0]
        unit = DBusAddress(path, bus_name=SYSTEMD, interface=_unit_interface(name))
        try:
            signature, value = unwrap_msg(conn.send_and_get_reply(Properties(unit).get("AllowedCPUs"),
                                                                  timeout=timeout))[0]
        except DBusErrorResponse as exc:
            raise ScopeError(_explain(exc)) from exc
    return cpus_of_mask(bytes(value))


def set_allowed_cpus(name: str, cpus: Iterable[int], timeout: float = BUS_TIMEOUT_SECONDS) -> None:
    """AllowedCPUs= of a unit as a runtime property (SetUnitProperties, runtime=true: under
    /run, gone at reboot); no CPUs resets it (no restriction)."""
    with _connect() as conn:
        _call(conn, "SetUnitProperties", "sba(sv)", (name, True, [("AllowedCPUs", ("ay", bitmask(cpus)))]), timeout)
