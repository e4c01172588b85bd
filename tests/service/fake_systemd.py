"""A stand-in for systemd on a private D-Bus bus, for the daemon's scope code on hosts
without systemd: a real dbus-daemon (this machine's /usr/bin/dbus-daemon) and, on it,
org.freedesktop.systemd1 answering the Manager calls topod makes (Subscribe,
StartTransientUnit, AttachProcessesToUnit, StopUnit, GetUnit) with systemd's signals
(JobRemoved, PropertiesChanged of ActiveState, UnitRemoved). It records what it was asked;
it does not move processes (the systemd tier does that for real). The daemon under test
is pointed at it with DBUS_SYSTEM_BUS_ADDRESS."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import threading
import time
from pathlib import Path

from topod.scope import bitmask, cpus_of_mask

CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={path}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"""
SYSTEMD = "org.freedesktop.systemd1"
MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"


def unit_path(name: str) -> str:
    return f"{MANAGER_PATH}/unit/" + "".join(c if c.isascii() and c.isalnum() else f"_{ord(c):02x}" for c in name)


class FakeSystemd:
    def __init__(self, work: Path) -> None:
        if shutil.which("dbus-daemon") is None:
            raise RuntimeError("no dbus-daemon on this machine")
        self.socket = work / "system_bus_socket"
        config = work / "bus.conf"
        config.write_text(CONFIG.format(path=self.socket))
        self.bus = subprocess.Popen(["dbus-daemon", f"--config-file={config}", "--nofork", "--nopidfile"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self.socket.exists():
            if time.monotonic() > deadline or self.bus.poll() is not None:
                raise RuntimeError("dbus-daemon did not start")
            time.sleep(0.02)
        self.address = f"unix:path={self.socket}"
        self.units: dict[str, dict] = {}  # name -> {"properties": {...}, "pids": [...], "state": ...}
        self.calls: list[tuple[str, tuple]] = []
        # The slices' AllowedCPUs= (topod.slices), () = no restriction, and each runtime set.
        self.allowed: dict[str, tuple[int, ...]] = {"system.slice": (), "user.slice": (), "init.scope": ()}
        self.set_calls: list[tuple[str, tuple[int, ...]]] = []
        self.refuse: dict[str, tuple[str, str]] = {}  # method -> (error name, message)
        self._jobs = itertools.count(1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._conn = self._open()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _open(self):
        from jeepney.bus_messages import message_bus
        from jeepney.io.blocking import open_dbus_connection
        from jeepney.wrappers import unwrap_msg

        conn = open_dbus_connection(bus=self.address)
        unwrap_msg(conn.send_and_get_reply(message_bus.RequestName(SYSTEMD), timeout=5))
        return conn

    # -- serving --------------------------------------------------------------------
    def _send(self, message) -> None:
        with self._lock:
            self._conn.send(message)

    def _serve(self) -> None:
        from jeepney import MessageType

        while not self._stop.is_set():
            try:
                message = self._conn.receive(timeout=0.2)
            except TimeoutError:
                continue
            except (OSError, EOFError, ValueError):
                return
            if message.header.message_type == MessageType.method_call:
                self._answer(message)

    def _answer(self, message) -> None:
        from jeepney import HeaderFields, new_error, new_method_return

        member = message.header.fields.get(HeaderFields.member)
        self.calls.append((member, message.body))
        if member in self.refuse:
            name, text = self.refuse[member]
            self._send(new_error(message, name, "s", (text,)))
            return
        handler = getattr(self, f"_do_{member}", None)
        if handler is None:
            self._send(new_error(message, "org.freedesktop.DBus.Error.UnknownMethod", "s", (member,)))
            return
        outcome = handler(message.header.fields.get(HeaderFields.path), *message.body) if member == "Get" \
            else handler(*message.body)
        if isinstance(outcome, tuple) and outcome and outcome[0] == "error":
            self._send(new_error(message, outcome[1], "s", (outcome[2],)))
            return
        signature, body, after = outcome
        self._send(new_method_return(message, signature, body))
        for signal in after:
            self._send(signal)

    def _job_done(self, job: str, unit: str):
        from jeepney import DBusAddress, new_signal

        job_id = int(job.rsplit("/", 1)[1])
        return new_signal(DBusAddress(MANAGER_PATH, interface=MANAGER), "JobRemoved", "uoss",
                          (job_id, job, unit, "done"))

    def _ended_signals(self, name: str, state: str = "inactive"):
        from jeepney import DBusAddress, new_signal

        self.units.pop(name, None)
        path = unit_path(name)
        return [new_signal(DBusAddress(path, interface="org.freedesktop.DBus.Properties"), "PropertiesChanged",
                           "sa{sv}as", ("org.freedesktop.systemd1.Unit", {"ActiveState": ("s", state)}, [])),
                new_signal(DBusAddress(MANAGER_PATH, interface=MANAGER), "UnitRemoved", "so", (name, path))]

    def _do_Subscribe(self):
        return None, (), []

    def _do_StartTransientUnit(self, name, mode, properties, aux):
        if name in self.units:
            return ("error", "org.freedesktop.systemd1.UnitExists", f"Unit {name} already loaded")
        props = dict(properties)
        self.units[name] = {"properties": props, "pids": list(props.get("PIDs", ("au", []))[1]), "state": "active"}
        job = f"{MANAGER_PATH}/job/{next(self._jobs)}"
        return "o", (job,), [self._job_done(job, name)]

    def _do_AttachProcessesToUnit(self, name, subcgroup, pids):
        if name not in self.units:
            return ("error", "org.freedesktop.systemd1.NoSuchUnit", f"Unit {name} not loaded.")
        self.units[name]["pids"] += list(pids)
        return None, (), []

    def _do_StopUnit(self, name, mode):
        if name not in self.units:
            return ("error", "org.freedesktop.systemd1.NoSuchUnit", f"Unit {name} not loaded.")
        job = f"{MANAGER_PATH}/job/{next(self._jobs)}"
        return "o", (job,), [*self._ended_signals(name), self._job_done(job, name)]

    def _do_LoadUnit(self, name):
        return "o", (unit_path(name),), []

    def _do_Get(self, path, interface, prop):
        """Properties.Get of a unit's AllowedCPUs= (the one property topod reads this way)."""
        name = next((n for n in self.allowed if unit_path(n) == path), None)
        if prop != "AllowedCPUs" or name is None:
            return ("error", "org.freedesktop.DBus.Error.UnknownProperty", f"{path} {interface}.{prop}")
        return "v", (("ay", bitmask(self.allowed[name])),), []

    def _do_SetUnitProperties(self, name, runtime, properties):
        props = dict(properties)
        if not runtime or set(props) != {"AllowedCPUs"}:
            return ("error", "org.freedesktop.DBus.Error.InvalidArgs", "only runtime AllowedCPUs= here")
        self.allowed[name] = cpus_of_mask(bytes(props["AllowedCPUs"][1]))
        self.set_calls.append((name, self.allowed[name]))
        return None, (), []

    def _do_GetUnit(self, name):
        if name not in self.units:
            return ("error", "org.freedesktop.systemd1.NoSuchUnit", f"Unit {name} not loaded.")
        return "o", (unit_path(name),), []

    # -- the test's hands ------------------------------------------------------------------
    def announce(self, name: str, state: str) -> None:
        """A PropertiesChanged of ActiveState alone (systemd sends one as a unit is being
        created, "inactive", before its start job makes it active)."""
        kept = self.units.get(name)
        self._send(self._ended_signals(name, state)[0])
        if kept is not None:
            self.units[name] = kept

    def end(self, name: str, state: str = "inactive") -> None:
        """The scope's last process exits: systemd's signals, as it sends them."""
        for signal in self._ended_signals(name, state):
            self._send(signal)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self._conn.close()
        finally:
            self.bus.terminate()
            self.bus.wait(timeout=5)
