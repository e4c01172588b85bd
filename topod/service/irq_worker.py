"""The IRQ balancer in its own process. A full cycle parses every /proc/irq/N and
/proc/interrupts in pure Python (hundreds of milliseconds on 4,096 IRQs); in a thread of
the daemon that work would hold the GIL against the event loop, and every API request
would wait behind it. In a child process it costs the API nothing.

The child (`python -P -c ...`: WORKER_ARGS) keeps the balancer (its snapshots,
cooldowns and failure state) between calls and speaks length-prefixed pickle frames on
its stdin/stdout: no multiprocessing machinery, no semaphores, no resource-tracker
process. The daemon sends the topology only when it changed and gets back what it shows
after each cycle: events, health, STATUS= text and per-CPU interrupt rates. The full plan
(/v1/irqs, thousands of entries on a big host) is fetched only when asked for. A child
that dies is replaced at once and the call is made again on the replacement, which is
sent the topology first (an `irq_worker_replaced` warning names the old pid and how it
ended); only a replacement that dies too fails the call (the supervised loop reports that).
"""

from __future__ import annotations

import pickle
import signal
import struct
import sys
from collections.abc import Callable

from topod.model import Topology
from topod.record import field, record

TYPE_CHECKING = False  # typing stays out of the worker (~0.5 MiB): annotations are strings here
if TYPE_CHECKING:
    import asyncio
    from typing import Any, BinaryIO

# The child imports this module (what it pickles, Outcome, must name it) and the IRQ
# pipeline, nothing else: asyncio and structlog (which brings rich when installed) are
# the daemon side's and imported there, inside its functions. That kept ~10 MiB and
# ~0.3 s of start-up out of the worker (bench/footprint.py). Its value classes are
# topod.record records, not dataclasses: `dataclasses` imports inspect, ast, dis and
# tokenize (~1.5 MiB), which nothing else in the worker needs.
FRAME = struct.Struct("!I")
STOP_SECONDS = 5.0


@record
class Outcome:
    """What one cycle or re-plan tells the daemon."""

    kind: str  # "cycle" | "replan"
    events: tuple[dict[str, Any], ...]
    moves: int
    rediscover: bool
    health: dict[str, Any]
    status: str
    moves_total: int
    cpu_rates: dict[int, float] = field(default_factory=dict)


def outcome_of(balancer, report) -> Outcome:  # noqa: ANN001 - IrqBalancer, CycleReport
    rates: dict[int, float] = {}
    load = balancer.last_load
    if load is not None:
        for per_cpu in load.irq_cpu_rate.values():
            for cpu, rate in per_cpu.items():
                rates[cpu] = rates.get(cpu, 0.0) + rate
    return Outcome(kind=getattr(report, "kind", "cycle"), events=tuple(report.events), moves=report.moves,
                   rediscover=report.rediscover, health=balancer.health(), status=balancer.status_text(),
                   moves_total=balancer.moves_total, cpu_rates=rates)


# -- the child ------------------------------------------------------------------------
class _Child:
    def __init__(self, root: str, section: dict[str, Any]) -> None:
        from topod.host import HostRoot
        from topod.irq.cycle import IrqBalancer
        from topod.irq.settings import IrqSettings

        self.balancer = IrqBalancer(HostRoot(root), IrqSettings.from_section(section))
        self.topology: Topology | None = None

    def handle(self, request: tuple) -> Any:
        verb = request[0]
        if verb == "configure":
            from topod.irq.settings import IrqSettings

            self.balancer.configure(IrqSettings.from_section(request[1]))
            return None
        if verb == "run":
            _, full, topology, leased = request
            if topology is not None:
                self.topology = topology
            if self.topology is None:
                raise RuntimeError("the IRQ worker has no topology yet")
            step = self.balancer.cycle if full else self.balancer.replan
            return outcome_of(self.balancer, step(self.topology, leased))
        if verb == "report":
            return self.balancer.report()
        raise ValueError(f"unknown IRQ worker request {verb!r}")


def _read_frame(stream: BinaryIO) -> Any:
    header = stream.read(FRAME.size)
    if len(header) < FRAME.size:
        return None  # the daemon closed our stdin: stop
    size = FRAME.unpack(header)[0]
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


def _write_frame(stream: BinaryIO, value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(FRAME.pack(len(data)) + data)
    stream.flush()


# How the daemon starts the worker: `-c`, not `-m`, because `-m` loads runpy and
# importlib.util first (~0.7 MiB of the worker's PSS, for nothing it uses); `-P`, because
# both would otherwise put the working directory first on sys.path, and a hand-started
# daemon's working directory may hold anything named `topod`. The code imports the
# module by its name, so what the child pickles (Outcome) names topod.service.irq_worker.
WORKER_ARGS = ("-P", "-c", "from topod.service.irq_worker import child_main; raise SystemExit(child_main())")


def child_main() -> int:
    # The daemon decides when this process ends (it closes our stdin): a terminal's ^C or
    # systemd's SIGTERM to the whole cgroup must not kill a cycle halfway through.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the pipe
    try:
        start = _read_frame(stdin)
        if start is None:
            return 0
        child = _Child(*start)
        while (request := _read_frame(stdin)) is not None:
            try:
                reply = ("ok", child.handle(request))
            except Exception as exc:  # noqa: BLE001 - reported to the daemon, which supervises
                reply = ("error", f"{type(exc).__name__}: {exc}")
            _write_frame(stdout, reply)
    except (BrokenPipeError, ConnectionError, EOFError, pickle.UnpicklingError):
        return 0  # the daemon is gone (kill -9 included): nothing left to answer
    return 0


# -- the daemon's side -------------------------------------------------------------------
def _log():  # noqa: ANN202 - a structlog logger
    import structlog

    return structlog.get_logger("topod")


async def _reap(process: asyncio.subprocess.Process) -> None:
    """A worker whose pipe broke: wait for its end (killing it if it lingers)."""
    import asyncio

    try:
        async with asyncio.timeout(1.0):
            await process.wait()
    except TimeoutError:
        process.kill()
        await process.wait()


def _exit_text(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


class IrqWorker:
    def __init__(self, root: str, section: dict[str, Any]) -> None:
        self.root = root
        self.section = dict(section)
        self._process: asyncio.subprocess.Process | None = None
        self._sent: Topology | None = None
        self.where = "process"
        self.starts = 0

    async def _ensure(self) -> asyncio.subprocess.Process:
        import asyncio

        previous = self._process
        if previous is not None:
            if previous.returncode is None:
                return previous
            _log().warning("irq_worker_replaced", pid=previous.pid, exit=_exit_text(previous.returncode),
                        reason="the IRQ worker process ended; a new one is sent the topology before it plans")
        self._process = await asyncio.create_subprocess_exec(
            sys.executable, *WORKER_ARGS, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        self._sent = None
        self.starts += 1
        self._send(self._process, (self.root, self.section))
        return self._process

    @staticmethod
    def _send(process: asyncio.subprocess.Process, value: Any) -> None:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        process.stdin.write(FRAME.pack(len(data)) + data)

    async def _call(self, request: Callable[[], tuple]) -> Any:
        """`request` is built after the worker is known to run, so that what it carries
        (the topology, or None when this worker already has it) matches that worker."""
        import asyncio

        for attempt in (1, 2):
            process = await self._ensure()
            try:
                self._send(process, request())
                await process.stdin.drain()
                header = await process.stdout.readexactly(FRAME.size)
                status, value = pickle.loads(await process.stdout.readexactly(FRAME.unpack(header)[0]))
            except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError) as exc:
                await _reap(process)  # _ensure then logs and replaces it
                if attempt == 2:
                    raise RuntimeError(f"the IRQ worker process died ({type(exc).__name__}, "
                                       f"{_exit_text(process.returncode)}) twice in one call; a new one starts on "
                                       "the next cycle") from None
                continue
            if status != "ok":
                raise RuntimeError(f"IRQ worker: {value}")
            return value
        raise AssertionError("unreachable")

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.returncode is None else None

    async def configure(self, section: dict[str, Any]) -> None:
        self.section = dict(section)
        await self._call(lambda: ("configure", self.section))

    async def run(self, full: bool, topology: Topology, leased: frozenset[int]) -> Outcome:
        outcome = await self._call(lambda: ("run", full, None if topology is self._sent else topology, leased))
        self._sent = topology
        return outcome

    async def report(self) -> dict[str, Any]:
        if self._process is None:
            return {}
        return await self._call(lambda: ("report",))

    async def close(self) -> None:
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        import asyncio

        process.stdin.close()
        try:
            async with asyncio.timeout(STOP_SECONDS):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()

