"""What topod believes about each link, from probes and from jobs' own transfers.

Per link: an EWMA of bandwidth (what the link gives now), a window of healthy samples
(what it gave when well), and a short window of the latest samples. A link turns
*degraded* when its latest `confirm_samples` samples are all low outliers against the
healthy window (more than `outlier_mads` scaled MADs below its median) and their median
is below `degraded_ratio` of the healthy median; it turns *recovered* when the recent
median is back above `recovered_ratio` of it. Requiring several samples and two ratios
(hysteresis) keeps one slow transfer from moving jobs around.

`corrections()` turns degraded p2p links into DistanceModel factors (healthy / now, now =
the lower of the EWMA and the recent median), so
the allocation engine prefers healthy links. Pure: callers pass `now`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from topod.distance import DistanceModel
from topod.errors import TopodError
from topod.model import Topology
from topod.probe.backend import LinkId, LinkSyntaxError, Measurement, ProbeResult, median, node_of, parse_link

MAD_SCALE = 1.4826  # MAD * this estimates sigma for normal noise
TELEMETRY_KEYS = ("link", "bytes", "seconds")


MAX_TELEMETRY_BYTES = 2**63 - 1


class TelemetryError(TopodError):
    """A job's transfer report that cannot be used; the message says which field is wrong."""

    code = "invalid_telemetry"


@dataclass(frozen=True, slots=True)
class LinkStateSettings:
    ewma_alpha: float = 0.3  # weight of the newest sample in the EWMA
    window: int = 16  # healthy samples kept per link for the median/MAD test
    confirm_samples: int = 2  # consecutive low outliers needed to call a link degraded
    min_samples: int = 3  # healthy samples needed before any verdict
    outlier_mads: float = 4.0  # how many scaled MADs below the median makes an outlier
    mad_floor: float = 0.02  # MAD never below this share of the median (quiet links)
    degraded_ratio: float = 0.7  # recent median below this share of healthy -> degraded
    recovered_ratio: float = 0.85  # recent median above this share -> recovered
    stable_tolerance: float = 0.1  # a sample within this share of the EWMA is "stable"
    max_factor: float = 4.0  # cap on a DistanceModel correction
    telemetry_min_bytes: int = 1 << 20  # smaller job transfers say nothing about bandwidth
    max_plausible_gbps: float = 10_000.0  # a report faster than this is a bug, not a link

    def __post_init__(self) -> None:
        if not 0 < self.ewma_alpha <= 1:
            raise ValueError(f"ewma_alpha must be in (0, 1], got {self.ewma_alpha}")
        if not 0 < self.degraded_ratio < self.recovered_ratio <= 1:
            raise ValueError("need 0 < degraded_ratio < recovered_ratio <= 1")
        if self.confirm_samples < 1 or self.min_samples < 1 or self.window < self.min_samples:
            raise ValueError("need confirm_samples >= 1, min_samples >= 1 and window >= min_samples")


@dataclass(frozen=True, slots=True)
class LinkEvent:
    event: str  # link_degraded | link_recovered
    link: LinkId
    healthy_gbps: float
    measured_gbps: float
    source: str  # probe | telemetry

    def fields(self) -> dict[str, object]:
        """Keyword fields for EventBus.publish(event.event, **event.fields())."""
        return {"link": str(self.link), "healthy_gbps": round(self.healthy_gbps, 3),
                "measured_gbps": round(self.measured_gbps, 3),
                "ratio": round(self.measured_gbps / self.healthy_gbps, 3) if self.healthy_gbps else None,
                "source": self.source}


@dataclass(frozen=True, slots=True)
class CycleSummary:
    stable: bool  # every sample near its link's EWMA and no link changed state
    events: tuple[LinkEvent, ...]
    seconds: float
    bytes_moved: int


@dataclass(frozen=True, slots=True)
class TelemetryOutcome:
    link: LinkId
    bandwidth_gbps: float
    folded: bool
    reason: str
    events: tuple[LinkEvent, ...] = ()


@dataclass(slots=True)
class _Track:
    window: int
    healthy: deque[float] = field(init=False)
    recent: deque[float] = field(init=False)
    ewma: float | None = None
    latency_us: float | None = None
    probe_samples: int = 0
    telemetry_samples: int = 0
    ignored_small: int = 0
    last_time: float | None = None
    degraded: bool = False

    def __post_init__(self) -> None:
        self.healthy = deque(maxlen=self.window)
        self.recent = deque(maxlen=self.window)

    @property
    def healthy_median(self) -> float | None:
        return median(list(self.healthy)) if self.healthy else None


class LinkState:
    def __init__(self, links: Iterable[LinkId] = (), settings: LinkStateSettings | None = None) -> None:
        self.settings = settings or LinkStateSettings()
        self._tracks: dict[LinkId, _Track] = {}
        self.register(links)

    def register(self, links: Iterable[LinkId]) -> None:
        """The links of the current topology: known ones keep their history, gone ones go."""
        wanted = set(links)
        self._tracks = {link: self._tracks.get(link) or _Track(self.settings.window) for link in sorted(wanted)}

    @property
    def links(self) -> list[LinkId]:
        return list(self._tracks)

    def reset(self) -> None:
        """Forget every sample (a topology change makes old baselines meaningless)."""
        self._tracks = {link: _Track(self.settings.window) for link in self._tracks}

    def fold(self, result: ProbeResult) -> list[LinkEvent]:
        track = self._tracks.get(result.link)
        if track is None:
            return []
        track.probe_samples += 1
        return self._sample(result.link, track, result.bandwidth_gbps, result.latency_us, result.time, "probe")

    def fold_cycle(self, results: Iterable[ProbeResult]) -> CycleSummary:
        stable, events, seconds, moved = True, [], 0.0, 0
        for result in results:
            track = self._tracks.get(result.link)
            before = track.ewma if track else None
            if before is None or abs(result.bandwidth_gbps - before) > self.settings.stable_tolerance * before:
                stable = False
            events.extend(self.fold(result))
            seconds += result.seconds
            moved += result.bytes_moved
        return CycleSummary(stable and not events, tuple(events), seconds, moved)

    def telemetry(self, link: object, bytes_moved: object, seconds: object, now: float,
                  gpu_addresses: dict[int, str] | None = None,
                  authorize: Callable[[LinkId], None] | None = None) -> TelemetryOutcome:
        """Fold one job-reported transfer; TelemetryError names the bad field. `authorize`
        raises when the reporter may not speak for this link (it is not on its leases)."""
        try:
            link_id = parse_link(link, gpu_addresses)  # type: ignore[arg-type]
        except LinkSyntaxError as exc:
            raise TelemetryError(f"telemetry: {exc}") from exc
        if authorize is not None:
            authorize(link_id)
        track = self._tracks.get(link_id)
        if track is None:
            raise TelemetryError(f"telemetry: unknown link {str(link_id)!r}: not a link of this host "
                                 f"({len(self._tracks)} known; GET /v1/links lists them)")
        from topod.alloc.jsonfields import integral

        if integral(bytes_moved) is None or integral(bytes_moved) <= 0:  # 2.0 is the integer 2, as in JSON
            raise TelemetryError(f"telemetry: bytes must be a positive integer, got {bytes_moved!r}")
        bytes_moved = integral(bytes_moved)
        if bytes_moved > MAX_TELEMETRY_BYTES:
            raise TelemetryError(f"telemetry: bytes must be <= {MAX_TELEMETRY_BYTES}")
        if (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds)
                or seconds <= 0):
            raise TelemetryError(f"telemetry: seconds must be a positive finite number, got {seconds!r}")
        gbps = bytes_moved / seconds / 1e9
        if gbps > self.settings.max_plausible_gbps:
            raise TelemetryError(f"telemetry: {bytes_moved} bytes in {seconds} s is {gbps:.0f} GB/s, "
                                 f"above the plausible {self.settings.max_plausible_gbps:.0f} GB/s; check the units")
        if bytes_moved < self.settings.telemetry_min_bytes:
            track.ignored_small += 1
            return TelemetryOutcome(link_id, gbps, False, f"transfers under {self.settings.telemetry_min_bytes} bytes "
                                    "measure latency, not bandwidth; counted, not folded")
        track.telemetry_samples += 1
        events = self._sample(link_id, track, gbps, None, now, "telemetry")
        return TelemetryOutcome(link_id, gbps, True, "folded", tuple(events))

    def telemetry_body(self, body: object, now: float, gpu_addresses: dict[int, str] | None = None,
                       authorize: Callable[[LinkId], None] | None = None) -> TelemetryOutcome:
        """POST /v1/telemetry: {"link": "p2p/gpu0/gpu1", "bytes": 268435456, "seconds": 0.011}."""
        if not isinstance(body, dict):
            raise TelemetryError('telemetry: expected a JSON object {"link": ..., "bytes": ..., "seconds": ...}')
        missing = [key for key in TELEMETRY_KEYS if key not in body]
        unknown = sorted(set(body) - set(TELEMETRY_KEYS))
        if missing or unknown:
            raise TelemetryError(f"telemetry: missing {', '.join(missing) or 'nothing'}; unknown "
                                 f"{', '.join(unknown) or 'nothing'} (fields: {', '.join(TELEMETRY_KEYS)})")
        return self.telemetry(body["link"], body["bytes"], body["seconds"], now, gpu_addresses, authorize)

    def _sample(self, link: LinkId, track: _Track, gbps: float, latency: float | None, now: float,
                source: str) -> list[LinkEvent]:
        s = self.settings
        track.ewma = gbps if track.ewma is None else s.ewma_alpha * gbps + (1 - s.ewma_alpha) * track.ewma
        if latency is not None:
            track.latency_us = latency if track.latency_us is None else (
                s.ewma_alpha * latency + (1 - s.ewma_alpha) * track.latency_us)
        track.last_time = now
        if len(track.healthy) < s.min_samples:
            track.healthy.append(gbps)
            return []
        healthy = median(list(track.healthy))
        mad = max(median([abs(x - healthy) for x in track.healthy]), s.mad_floor * healthy)
        low_outlier = (healthy - gbps) > s.outlier_mads * MAD_SCALE * mad
        track.recent.append(gbps)
        latest = list(track.recent)[-s.confirm_samples:]
        recent = median(latest)
        if not track.degraded:
            # The latest confirm_samples must all be low outliers, and low enough to matter.
            if (low_outlier and len(latest) == s.confirm_samples
                    and all((healthy - x) > s.outlier_mads * MAD_SCALE * mad for x in latest)
                    and recent < s.degraded_ratio * healthy):
                track.degraded = True
                return [LinkEvent("link_degraded", link, healthy, recent, source)]
            if not low_outlier:
                track.healthy.append(gbps)
            return []
        if recent >= s.recovered_ratio * healthy:
            track.degraded = False
            track.healthy.append(gbps)
            track.ewma = gbps  # the old EWMA still remembers the fault
            return [LinkEvent("link_recovered", link, healthy, recent, source)]
        return []

    def degraded(self) -> list[LinkId]:
        return [link for link, track in self._tracks.items() if track.degraded]

    def corrections(self) -> dict[tuple[str, str], float]:
        """{(addrA, addrB): factor} for DistanceModel: a degraded p2p pair weighs
        healthy/now times more (capped at max_factor); healthy pairs are left out."""
        out: dict[tuple[str, str], float] = {}
        for link, track in self._tracks.items():
            pair = link.pair
            healthy = track.healthy_median
            if pair is None or not track.degraded or not healthy or not track.ewma:
                continue
            # The confirmed recent median reacts at once; the EWMA still remembers better days.
            now = min(track.ewma, median(list(track.recent)[-self.settings.confirm_samples:]))
            factor = min(self.settings.max_factor, max(1.0, healthy / now))
            out[pair] = max(out.get(pair, 1.0), round(factor, 3))
        return out

    def measurements(self) -> list[Measurement]:
        """One Measurement per measured link (EWMA), for calibrate()."""
        return [Measurement(link, track.ewma, track.latency_us, track.probe_samples + track.telemetry_samples)
                for link, track in self._tracks.items() if track.ewma is not None]

    def rows(self, now: float, topology: Topology | None = None) -> list[dict[str, object]]:
        """Expected (from the model) vs measured, per link, for `topoctl links` and GET /v1/links."""
        model = DistanceModel(topology) if topology is not None else None
        rows = []
        for link, track in self._tracks.items():
            healthy = track.healthy_median
            rows.append({
                "link": str(link),
                "kind": link.kind,
                "expected": _expected(link, topology, model),
                "measured_gbps": _round(track.ewma),
                "healthy_gbps": _round(healthy),
                "latency_us": _round(track.latency_us),
                "probe_samples": track.probe_samples,
                "telemetry_samples": track.telemetry_samples,
                "ignored_small_reports": track.ignored_small,
                "age_s": None if track.last_time is None else round(max(0.0, now - track.last_time), 1),
                "state": "unmeasured" if track.ewma is None else "degraded" if track.degraded else "ok",
            })
        return rows


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _expected(link: LinkId, topology: Topology | None, model: DistanceModel | None) -> str:
    """The model's word for a link: its level for a pair, local/remote for host links."""
    if topology is None or model is None:
        return "-"
    if link.kind == "p2p":
        return model.between(link.src, link.dst).label
    if link.kind == "mem":
        slit = topology.slit(node_of(link.src), node_of(link.dst))
        return "local" if link.src == link.dst else f"remote (SLIT {slit})"
    device = topology.device(link.device or "")
    if device is None or device.numa_node is None:
        return "unknown node"
    return "local" if device.numa_node == link.host_node else f"remote (device on node{device.numa_node})"


def links_document(state: LinkState, topology: Topology | None, now: float,
                   findings: Iterable[object] = (), corrections: dict[tuple[str, str], float] | None = None,
                   sampler: dict[str, object] | None = None) -> dict[str, object]:
    """The JSON body of GET /v1/links (and `topoctl links --json`)."""
    corrections = state.corrections() if corrections is None else corrections
    return {
        "links": state.rows(now, topology),
        "findings": [f.to_json() for f in findings],  # type: ignore[attr-defined]
        "corrections": [{"pair": list(pair), "factor": factor} for pair, factor in sorted(corrections.items())],
        "sampler": sampler or {},
    }
