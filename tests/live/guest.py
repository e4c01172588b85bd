"""The live tier's guest: a Debian 12 VM under QEMU TCG with two NUMA nodes, driven
through its guest agent (commands) and QMP (hot-plug, power).

Layout (what the tests rely on):
  CPUs 0-1 on node 0, CPUs 2-3 on node 1; 1 GiB of memory on each node.
  pxb-pcie "pxb0" (numa_node=0): root ports rp0a -> nvme (serial topod-n0), rp0b -> virtio-net (mq)
  pxb-pcie "pxb1" (numa_node=1): root ports rp1a -> nvme (serial topod-n1), rp1b -> virtio-net (mq),
                                 rp1c empty: the hot-plug slot
  pcie.0 (no node): the root disk, the disk carrying the source tree and the wheelhouse,
                    the virtio-serial port of the guest agent.
QEMU's TCG, never KVM: /dev/kvm on these machines is a nested hypervisor on which stock
kernels hang at boot. Timing inside the guest is meaningless; it checks truth, not speed.

The disk is `-drive snapshot=on`: the guest writes into a temporary overlay that lives
as long as the QEMU process, so a reboot inside the guest keeps what was written and
the image stays as built.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOTPLUG_PORT = "rp1c"
NODE_CPUS = {0: (0, 1), 1: (2, 3)}


class GuestError(RuntimeError):
    pass


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


class _Channel:
    """One line-delimited JSON connection to a QEMU Unix socket (QMP or the guest agent)."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.buffer = b""

    def send(self, message: dict) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def receive(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer")
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        # guest-sync-delimited's answer starts with 0xFF, which resets the agent's parser
        line = line.lstrip(b"\xff").strip()
        if not line:
            return self.receive(max(0.1, deadline - time.monotonic()))
        return json.loads(line)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Guest:
    def __init__(self, image: Path, work: Path, src_disk: Path) -> None:
        self.image, self.work, self.src_disk = image, work, src_disk
        self.qmp_path, self.qga_path = work / "qmp.sock", work / "qga.sock"
        self.console = work / "console.log"
        self.process: subprocess.Popen | None = None
        self._qga: _Channel | None = None
        self._qmp: _Channel | None = None
        self._sync = int(time.time()) % 100000
        self.qmp_events: list[dict] = []
        self.attached = False  # a QEMU this object did not start (TOPOD_LIVE_ATTACH=1)

    # --- the machine ---------------------------------------------------------------
    def command(self) -> list[str]:
        disks = {name: self.work / f"{name}.img" for name in ("nvme0", "nvme1", "hotplug")}
        for disk in disks.values():
            if not disk.exists():
                with open(disk, "wb") as f:
                    f.truncate(64 << 20)
        drive = "if=none,format=raw,cache=unsafe,aio=threads"
        return [
            "qemu-system-x86_64", "-machine", "q35,accel=tcg", "-cpu", "max",
            "-smp", "4,sockets=2,cores=2,threads=1", "-m", "2G",
            "-object", "memory-backend-ram,id=mem0,size=1G", "-object", "memory-backend-ram,id=mem1,size=1G",
            "-numa", "node,nodeid=0,cpus=0-1,memdev=mem0", "-numa", "node,nodeid=1,cpus=2-3,memdev=mem1",
            "-nodefaults", "-display", "none", "-no-user-config",
            "-kernel", str(self.image / "vmlinuz"), "-initrd", str(self.image / "initrd.img"),
            "-append", "root=LABEL=topod-live rw console=ttyS0,115200 systemd.unified_cgroup_hierarchy=1 "
                       "net.ifnames=0 mitigations=off nowatchdog tsc=unstable panic=10",
            "-serial", f"file:{self.console}",
            "-qmp", f"unix:{self.qmp_path},server=on,wait=off",
            # pcie.0: the disks and the agent's port, outside both nodes
            "-drive", f"file={self.image / 'root.img'},id=root,snapshot=on,{drive}",
            "-device", "virtio-blk-pci,drive=root,bus=pcie.0,addr=0x3",
            "-drive", f"file={self.src_disk},id=src,snapshot=on,{drive}",
            "-device", "virtio-blk-pci,drive=src,bus=pcie.0,addr=0x4",
            "-device", "virtio-serial-pci,id=vser,bus=pcie.0,addr=0x5",
            "-chardev", f"socket,id=qga,path={self.qga_path},server=on,wait=off",
            "-device", "virtserialport,bus=vser.0,chardev=qga,name=org.qemu.guest_agent.0",
            # node 0's devices
            "-device", "pxb-pcie,id=pxb0,bus_nr=32,numa_node=0,bus=pcie.0,addr=0x10",
            "-device", "pcie-root-port,id=rp0a,bus=pxb0,chassis=10,slot=0,addr=0x0",
            "-device", "pcie-root-port,id=rp0b,bus=pxb0,chassis=11,slot=1,addr=0x1",
            "-drive", f"file={disks['nvme0']},id=nvme0,{drive}",
            "-device", "nvme,drive=nvme0,serial=topod-n0,bus=rp0a",
            "-netdev", "user,id=net0,restrict=on",
            "-device", "virtio-net-pci,netdev=net0,mq=on,vectors=10,bus=rp0b",
            # node 1's devices, and the free hot-plug port
            "-device", "pxb-pcie,id=pxb1,bus_nr=64,numa_node=1,bus=pcie.0,addr=0x11",
            "-device", "pcie-root-port,id=rp1a,bus=pxb1,chassis=20,slot=0,addr=0x0",
            "-device", "pcie-root-port,id=rp1b,bus=pxb1,chassis=21,slot=1,addr=0x1",
            "-device", f"pcie-root-port,id={HOTPLUG_PORT},bus=pxb1,chassis=22,slot=2,addr=0x2",
            "-drive", f"file={disks['nvme1']},id=nvme1,{drive}",
            "-device", "nvme,drive=nvme1,serial=topod-n1,bus=rp1a",
            "-netdev", "user,id=net1,restrict=on",
            "-device", "virtio-net-pci,netdev=net1,mq=on,vectors=10,bus=rp1b",
        ]

    def boot(self, timeout: float = 900) -> float:
        """Start QEMU and wait for the guest agent; the seconds it took."""
        for path in (self.qmp_path, self.qga_path):
            path.unlink(missing_ok=True)
        started = time.monotonic()
        with open(self.work / "qemu.log", "ab") as log:
            self.process = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self.wait_agent(timeout)
        return time.monotonic() - started

    def alive(self) -> bool:
        if self.attached:
            return self.qga_path.exists()
        return self.process is not None and self.process.poll() is None

    def wait_agent(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                raise GuestError(f"QEMU exited ({self.process.returncode if self.process else None}):\n"
                                 f"{self._tail(self.work / 'qemu.log')}\n{self._tail(self.console)}")
            try:
                self._agent(min(20.0, max(1.0, deadline - time.monotonic())))
                self.agent("guest-ping", timeout=20)
                return
            except (OSError, TimeoutError, ConnectionError, GuestError):
                self._drop_agent()
            if time.monotonic() > deadline:
                raise GuestError(f"no guest agent within {timeout:.0f} s; console:\n{self._tail(self.console)}")
            time.sleep(2)

    def wait_booted(self, timeout: float = 600) -> str:
        """After the agent answers: systemd's own verdict on the boot (running/degraded)."""
        result = self.sh("systemctl is-system-running --wait", timeout=timeout)
        return result.stdout.strip()

    def reboot(self, timeout: float = 900) -> float:
        """Reboot from inside (systemd stops the services in order) and wait for the agent
        of the next boot: the boot id differs."""
        before = self.boot_id()
        started = time.monotonic()
        # Fire and forget: the agent is stopped with everything else, often before it
        # could answer guest-exec-status.
        try:
            self.agent("guest-exec", timeout=30, path="/bin/systemctl", arg=["reboot", "--no-block"])
        except (OSError, TimeoutError, ConnectionError, GuestError):
            self._drop_agent()
        deadline = started + timeout
        while True:
            time.sleep(5)
            self._drop_agent()
            try:
                self.wait_agent(max(5.0, deadline - time.monotonic()))
                if self.boot_id() != before:
                    return time.monotonic() - started
            except GuestError:
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise GuestError(f"the guest did not come back within {timeout:.0f} s")

    def boot_id(self) -> str:
        return self.sh("cat /proc/sys/kernel/random/boot_id", check=True, timeout=60).stdout.strip()

    def shutdown(self, timeout: float = 180) -> None:
        if not self.alive():
            return
        try:
            self.qmp("system_powerdown")
            self.process.wait(timeout=timeout)
        except Exception:  # noqa: BLE001 - a guest that does not power down is killed
            try:
                self.qmp("quit")
                self.process.wait(timeout=20)
            except Exception:  # noqa: BLE001
                self.process.kill()
                self.process.wait()
        finally:
            self._drop_agent()
            if self._qmp:
                self._qmp.close()
                self._qmp = None

    @staticmethod
    def _tail(path: Path, size: int = 4000) -> str:
        try:
            return path.read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return ""

    # --- the guest agent -----------------------------------------------------------
    def _agent(self, timeout: float) -> _Channel:
        if self._qga is None:
            channel = _Channel(self.qga_path, timeout)
            # Whatever an earlier connection left unread is skipped up to our sync id.
            self._sync += 1
            channel.send({"execute": "guest-sync-delimited", "arguments": {"id": self._sync}})
            deadline = time.monotonic() + timeout
            while True:
                answer = channel.receive(max(0.1, deadline - time.monotonic()))
                if answer.get("return") == self._sync:
                    break
            self._qga = channel
        return self._qga

    def _drop_agent(self) -> None:
        if self._qga is not None:
            self._qga.close()
            self._qga = None

    def agent(self, command: str, timeout: float = 60, **arguments) -> object:
        channel = self._agent(timeout)
        message: dict = {"execute": command}
        if arguments:
            message["arguments"] = arguments
        try:
            channel.send(message)
            answer = channel.receive(timeout)
        except (OSError, TimeoutError, ConnectionError):
            self._drop_agent()  # the next call syncs a fresh connection
            raise
        if "error" in answer:
            raise GuestError(f"{command}: {answer['error']}")
        return answer.get("return")

    def exec(self, argv: list[str], timeout: float = 300, env: dict[str, str] | None = None,
             stdin: str | None = None) -> Result:
        """Run argv in the guest (as root, through the agent) and wait for it."""
        environment = {"PATH": PATH, "LANG": "C.UTF-8", "HOME": "/root"} | (env or {})
        arguments: dict = {"path": argv[0], "arg": argv[1:], "capture-output": True,
                           "env": [f"{k}={v}" for k, v in environment.items()]}
        if stdin is not None:
            arguments["input-data"] = base64.b64encode(stdin.encode()).decode()
        pid = self.agent("guest-exec", timeout=60, **arguments)["pid"]
        deadline = time.monotonic() + timeout
        pause = 0.05
        while True:
            status = self.agent("guest-exec-status", timeout=60, pid=pid)
            if status.get("exited"):
                break
            if time.monotonic() > deadline:
                self.agent("guest-exec", timeout=60, path="/bin/kill", arg=["-9", str(pid)])
                raise TimeoutError(f"{argv!r} still running after {timeout:.0f} s")
            time.sleep(pause)
            pause = min(1.0, pause * 2)
        code = status.get("exitcode", 128 + status.get("signal", 0))
        return Result(code, _decoded(status.get("out-data")), _decoded(status.get("err-data")))

    def sh(self, script: str, timeout: float = 300, check: bool = False, user: str | None = None) -> Result:
        argv = ["/usr/sbin/runuser", "-u", user, "--", "/bin/sh", "-c", script] if user else ["/bin/sh", "-c", script]
        result = self.exec(argv, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{script!r} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def json(self, script: str, timeout: float = 300) -> object:
        return json.loads(self.sh(script, timeout=timeout, check=True).stdout)

    # --- QMP -----------------------------------------------------------------------
    def qmp(self, command: str, timeout: float = 60, **arguments) -> object:
        if self._qmp is None:
            channel = _Channel(self.qmp_path, timeout)
            channel.receive(timeout)  # the greeting
            channel.send({"execute": "qmp_capabilities"})
            self._until_return(channel, timeout)
            self._qmp = channel
        message: dict = {"execute": command}
        if arguments:
            message["arguments"] = arguments
        self._qmp.send(message)
        return self._until_return(self._qmp, timeout, command)

    def _until_return(self, channel: _Channel, timeout: float, command: str = "qmp_capabilities") -> object:
        deadline = time.monotonic() + timeout
        while True:
            answer = channel.receive(max(0.1, deadline - time.monotonic()))
            if "event" in answer:
                self.qmp_events.append(answer)
                continue
            if "error" in answer:
                raise GuestError(f"QMP {command}: {answer['error']}")
            return answer.get("return")

    def wait_qmp_event(self, name: str, timeout: float) -> dict:
        """The next QMP event called name (e.g. DEVICE_DELETED), seen or waited for."""
        deadline = time.monotonic() + timeout
        while True:
            for index, event in enumerate(self.qmp_events):
                if event["event"] == name:
                    return self.qmp_events.pop(index)
            try:
                self.qmp_events.append(self._qmp.receive(max(0.1, deadline - time.monotonic())))
            except TimeoutError:
                raise GuestError(f"no QMP event {name} within {timeout:.0f} s") from None

    # --- waiting -------------------------------------------------------------------
    @staticmethod
    def wait_until(predicate, what: str, timeout: float = 120, interval: float = 1.0):
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout:.0f} s: {what}")
            time.sleep(interval)


def _decoded(data: str | None) -> str:
    return base64.b64decode(data).decode(errors="replace") if data else ""


def make_disk(stage: Path, image: Path, label: str) -> None:
    """An ext4 image holding stage's files (mkfs.ext4 -d), sized with room to spare."""
    size = sum(f.stat().st_size for f in stage.rglob("*") if f.is_file() and not f.is_symlink())
    megabytes = max(64, size * 2 // (1 << 20) + 32)
    image.unlink(missing_ok=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", label, "-d", str(stage), str(image), f"{megabytes}M"],
                   check=True, capture_output=True)


def stage_source(repo: Path, wheelhouse: Path, stage: Path) -> None:
    """stage/src: the working tree's files (tracked and untracked, not ignored);
    stage/wheelhouse: the wheels. What the guest installs from, offline."""
    files = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "-co", "--exclude-standard"],
                           check=True, capture_output=True).stdout.split(b"\0")
    (stage / "src").mkdir(parents=True)
    present = [f for f in files if f and os.path.lexists(repo / os.fsdecode(f))]
    subprocess.run(["tar", "-C", str(repo), "--null", "-T", "-", "-cf", "-"], input=b"\0".join(present),
                   check=True, stdout=open(stage / "src.tar", "wb"))
    subprocess.run(["tar", "-C", str(stage / "src"), "-xf", str(stage / "src.tar")], check=True)
    (stage / "src.tar").unlink()
    subprocess.run(["cp", "-a", str(wheelhouse), str(stage / "wheelhouse")], check=True)
