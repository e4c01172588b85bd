"""The daemon's side of per-lease systemd scopes.

- `place`: POST /v1/leases/{id}/scope {"pid": N}. A local scheduler puts a process it
  started in its lease's scope, topod-lease-<id>.scope (created with the lease's
  AllowedCPUs=, AllowedMemoryNodes=, DevicePolicy=closed and DeviceAllow=, or joined when
  it exists). Who may: the lease's owner (or root), for its own process or a descendant
  (root: any but PID 1 and topod), as owner_pid. The D-Bus calls run in a worker thread.
  The answer says what holds the process's CPUs, never more than was done: `cgroup` only
  when the scope exists and the host enforces cpusets (topod.enforce), else `none` with
  the reason. The lease records its scope (and `cgroup`, when that holds it).
- `watch`: an iteration of the supervised "scopes" loop. It subscribes to systemd's
  UnitRemoved signal with jeepney's asyncio router and ends the lease whose scope went
  away: signals, not polling. A scope is made with CollectMode=inactive-or-failed, so
  systemd unloads it (UnitRemoved) as soon as it is inactive or failed. PropertiesChanged
  (ActiveState) is not used: a transient unit announces itself "inactive" while it is
  being created, and that signal can be read after the start job is done (seen under
  systemd 252: it ended a lease just placed). At each
  (re)connection it checks the scopes leases recorded, so one that ended while topod was
  down (or the bus was) ends its lease too. An unreachable bus is said once (log
  `lease_scopes_unreachable`, /v1/health `scopes`), retried quietly, and degrades nothing:
  most hosts without systemd are still hosts topod serves.
- `stop`: a revoked lease's scope is stopped (SIGTERM, then TimeoutStopSec), and so is
  the scope of any lease that ends after topod placed a process in it (what a job leaves
  running ends with its lease, as `topoctl run` does for the scopes it starts itself).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import structlog

from topod.alloc.errors import InvalidRequestError
from topod.alloc.jsonfields import integral
from topod.errors import UnavailableError
from topod.scope import MANAGER, MANAGER_PATH, SYSTEMD, ScopeError, ScopeSpec, lease_of_unit

log = structlog.get_logger("topod")

RETRY_SECONDS = 60.0  # an unreachable bus is tried again this often
IDLE_SECONDS = 30.0  # without a signal this long, the bus connection is checked (and the loop beats)


def pid_of_body(body: Any, pid_max: int) -> int:
    """{"pid": N}, 1 <= N <= pid_max, nothing else."""
    if not isinstance(body, dict):
        raise InvalidRequestError("body", "expected an object {\"pid\": N}")
    extra = sorted(set(body) - {"pid"})
    if extra:
        raise InvalidRequestError(extra[0], "unknown field (only pid)")
    pid = integral(body.get("pid"))  # as JSON Schema's integer: 12.0 is 12
    if pid is None:
        raise InvalidRequestError("pid", "an integer process id is required")
    if not 1 <= pid <= pid_max:
        raise InvalidRequestError("pid", f"must be between 1 and {pid_max} (the kernel's pid_max)")
    return pid


class LeaseScopes:
    def __init__(self, alloc: Any, host_mode: Callable[[], tuple[str, str]],
                 gpu_numbers: Callable[[Any], tuple[int, ...]], publish: Callable[..., None], *, bus: str = "SYSTEM") -> None:
        self.alloc = alloc
        self.host_mode = host_mode  # () -> (cgroup|affinity|none, reason)
        self.gpu_numbers = gpu_numbers  # lease -> N of each /dev/nvidiaN
        self.publish = publish
        self.bus = bus
        self.reachable: bool | None = None  # None: not asked yet
        self.reason: str | None = None
        self._router = None
        self._exit = None
        self._signals: asyncio.Queue | None = None
        self._watching = False  # subscribed to systemd's signals
        self.placed: set[str] = set()  # leases whose scope topod made: stopped when they end

    # -- placing a process ---------------------------------------------------------------
    async def place(self, lease_id: str, body: Any, caller: Any) -> dict:
        from topod.service.lease_rules import PermissionDeniedError
        from topod.service.lease_lifecycle import LeaseNotFoundError
        from topod.service.owner import descends_from, process_exists

        pid = pid_of_body(body, self.alloc.limits.pid_max)
        lease = self.alloc.owned("scope", lease_id, caller)
        if pid in (1, os.getpid()):
            raise PermissionDeniedError(f"pid {pid} is {'init' if pid == 1 else 'topod itself'}: "
                                        "never in a lease's scope")
        if not process_exists(pid):
            raise InvalidRequestError("pid", f"no process {pid}")
        if not caller.is_admin and not descends_from(pid, caller.pid):
            raise PermissionDeniedError(f"pid {pid} is neither the calling process ({caller.pid}) nor one of its "
                                        "descendants; only root may place another process")
        spec = ScopeSpec(lease_id=lease.id, pid=pid, cpus=lease.cpus, memory_nodes=lease.memory_nodes,
                         gpu_numbers=self.gpu_numbers(lease), controls=tuple(await asyncio.to_thread(_controls)),
                         job=lease.job)
        try:
            created = await asyncio.to_thread(_place, spec)
        except ScopeError as exc:
            self._said(exc)
            raise UnavailableError(f"pid {pid} not placed in {spec.name}: {exc}") from None
        mode, why = self.host_mode()
        enforcement = "cgroup" if mode == "cgroup" and lease.cpus else "none"
        if enforcement == "cgroup":
            reason = f"pid {pid} runs in {spec.name}: cgroup v2 cpuset holds its CPUs and memory nodes"
        elif not lease.cpus:
            reason = f"pid {pid} runs in {spec.name}; the lease holds no CPUs"
        else:
            reason = (f"pid {pid} runs in {spec.name}, but its AllowedCPUs=/AllowedMemoryNodes= are only recorded "
                      f"here ({why}); pin it (topoctl bind) to hold its CPUs by affinity")
        recorded = await self.alloc.record_scope(lease.id, spec.name,
                                                 "cgroup" if enforcement == "cgroup" else lease.enforcement)
        if recorded is None:  # the lease ended meanwhile: its scope goes with it
            await self.stop(lease.id, "the lease ended while its scope was made")
            raise LeaseNotFoundError(f"lease {lease_id!r} ended while pid {pid} was placed")
        self.placed.add(lease.id)
        self.publish("lease_scope_placed", lease=lease.id, pid=pid, scope=spec.name, created=created,
                     enforcement=enforcement)
        return {"lease": lease.id, "pid": pid, "scope": spec.name, "created": created, "enforcement": enforcement,
                "reason": reason, "host_enforcement": mode, "lease_enforcement": recorded.enforcement}

    # -- stopping a scope -----------------------------------------------------------------
    async def stop(self, lease_id: str, reason: str) -> None:
        """A revoked lease takes its job with it: its scope is stopped. Best effort, said."""
        from topod.scope import stop_scope, unit_name

        name = unit_name(lease_id)
        try:
            stopped = await asyncio.to_thread(stop_scope, name)
        except ScopeError as exc:
            if not self._said(exc):
                log.warning("lease_scope_not_stopped", lease=lease_id, scope=name, error=str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - the lease is ended; its scope is best effort, said
            log.warning("lease_scope_not_stopped", lease=lease_id, scope=name, error=repr(exc))
            return
        self._reached()
        if stopped:
            self.publish("lease_scope_stopped", lease=lease_id, scope=name, reason=reason)

    # -- watching scopes end ----------------------------------------------------------------
    async def watch(self) -> float | None:
        """One iteration of the "scopes" loop: connect if need be, then handle one signal
        (or, after IDLE_SECONDS without one, check the connection). Returns the delay."""
        if self._router is None:
            try:
                await self._connect()
            except Exception as exc:  # noqa: BLE001 - any failure to reach systemd is "unreachable"
                await self.close()
                self._unreachable(f"no systemd on the system bus ({type(exc).__name__}: {exc})")
                return RETRY_SECONDS
            self._reached()
            await self._reconcile()
        assert self._signals is not None
        try:
            async with asyncio.timeout(IDLE_SECONDS):
                message = await self._signals.get()
        except TimeoutError:
            try:
                await self._ask("GetId", bus_daemon=True)
            except Exception as exc:  # noqa: BLE001 - the bus went away: reconnect
                await self.close()
                self._unreachable(f"the system bus connection broke ({type(exc).__name__}: {exc})")
            return None
        self._handle(message)
        return None

    async def _connect(self) -> None:
        from contextlib import AsyncExitStack

        from jeepney import MatchRule
        from jeepney.io.asyncio import open_dbus_router

        stack = AsyncExitStack()
        try:
            async with asyncio.timeout(10.0):
                self._router = await stack.enter_async_context(open_dbus_router(bus=self.bus))
                self._exit = stack
                self._signals = asyncio.Queue()  # unbounded: a signal is never dropped
                removed = MatchRule(type="signal", interface=MANAGER, member="UnitRemoved", path=MANAGER_PATH)
                stack.enter_context(self._router.filter(removed, queue=self._signals))
                await self._add_match(removed)
                await self._ask("Subscribe")  # systemd sends unit signals only while someone subscribes
            self._watching = True
        except BaseException:
            self._router = None
            await stack.aclose()
            self._exit = None
            raise

    async def _add_match(self, rule) -> None:
        from jeepney import MatchRule, message_bus
        from jeepney.wrappers import unwrap_msg

        # On the bus, match the sender by its well-known name (the bus resolves it); the local
        # filter cannot, as signals carry systemd's unique name.
        bus_rule = MatchRule(type="signal", sender=SYSTEMD, interface=rule.header_fields.get("interface"),
                             member=rule.header_fields.get("member"), path=rule.header_fields.get("path"),
                             path_namespace=rule.path_namespace)
        for argno, (value, kind) in rule.arg_conditions.items():
            bus_rule.add_arg_condition(argno, value, kind)
        unwrap_msg(await self._router.send_and_get_reply(message_bus.AddMatch(bus_rule)))

    async def _ask(self, method: str, signature: str | None = None, body: tuple = (), *, bus_daemon: bool = False):
        from jeepney import DBusAddress, new_method_call
        from jeepney.bus_messages import message_bus
        from jeepney.wrappers import unwrap_msg

        if bus_daemon:
            message = new_method_call(message_bus, method)
        else:
            message = new_method_call(DBusAddress(MANAGER_PATH, bus_name=SYSTEMD, interface=MANAGER), method,
                                      signature, body)
        async with asyncio.timeout(10.0):
            return unwrap_msg(await self._router.send_and_get_reply(message))

    async def _reconcile(self) -> None:
        """Leases whose recorded scope is gone (ended while nobody listened) end now."""
        from jeepney.wrappers import DBusErrorResponse

        for lease in list(self.alloc.leases()):
            if not lease.scope:
                continue
            self.placed.add(lease.id)
            try:
                await self._ask("GetUnit", "s", (lease.scope,))
            except DBusErrorResponse as exc:
                if exc.name == "org.freedesktop.systemd1.NoSuchUnit":
                    self._ended(lease.scope, "gone when topod looked")

    def _handle(self, message) -> None:
        from jeepney import HeaderFields

        if message.header.fields.get(HeaderFields.member) == "UnitRemoved":
            self._ended(message.body[0], "removed")

    def _ended(self, unit: str, how: str) -> None:
        lease_id = lease_of_unit(unit)
        if lease_id is None:
            return
        ended = self.alloc.scope_ended(lease_id, unit)
        if ended is not None:
            log.info("lease_scope_ended", lease=lease_id, scope=unit, how=how)

    async def close(self) -> None:
        exit_stack, self._exit, self._router, self._watching = self._exit, None, None, False
        if exit_stack is not None:
            try:
                await exit_stack.aclose()
            except Exception:  # noqa: BLE001 - a broken connection closes as it can
                pass

    # -- saying whether systemd is there ------------------------------------------------------
    def _said(self, exc: ScopeError) -> bool:
        """A ScopeError that means "no systemd on the bus": said once; True when it was one."""
        text = str(exc)
        if "bus" in text.lower() and ("no system bus" in text or "not on the system bus" in text):
            self._unreachable(text)
            return True
        return False

    def _unreachable(self, reason: str) -> None:
        if self.reachable is not False:
            log.info("lease_scopes_unreachable", reason=reason,
                     effect="no lease scopes: revoked leases' jobs are not stopped by topod, and no lease ends "
                            "with a scope")
        self.reachable = False
        self.reason = reason

    def _reached(self) -> None:
        if self.reachable is False:
            log.info("lease_scopes_reachable")
        self.reachable, self.reason = True, None

    def health(self) -> dict:
        return {"bus": {None: "unknown", True: "reachable", False: "unreachable"}[self.reachable],
                "watching": self._watching, "reason": self.reason}


def _controls() -> list[str]:
    """The NVIDIA control nodes of the machine topod runs on (its cgroups are this one's)."""
    from topod.host import HostRoot
    from topod.scope import control_nodes

    return control_nodes(HostRoot("/"))


def _place(spec: ScopeSpec) -> bool:
    from topod.scope import place_pid

    return place_pid(spec)

