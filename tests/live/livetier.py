"""Helpers the live tests share: topod's API and the kernel's IRQ files, read in the guest."""

from __future__ import annotations

import json

import pytest

from topod.cpulist import parse_cpulist

SOCKET = "/run/topod/topod.sock"
# The API over the Unix socket with the guest's python3 (no curl in the image).
_API = r"""
import http.client, json, socket, sys
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(120)
        self.sock.connect(sys.argv[3])
connection = Unix("topod", timeout=120)
body = sys.stdin.read()
connection.request(sys.argv[1], sys.argv[2], body=body or None,
                   headers={"Content-Type": "application/json"} if body else {})
answer = connection.getresponse()
print(json.dumps({"status": answer.status, "body": answer.read().decode()}))
"""


def api(guest, method: str, path: str, body: object | None = None, timeout: float = 180) -> tuple[int, object]:
    """(HTTP status, decoded JSON body or its text) of one request to topod in the guest."""
    result = guest.exec(["/usr/bin/python3", "-I", "-c", _API, method, path, SOCKET], timeout=timeout,
                        stdin="" if body is None else json.dumps(body))
    if result.returncode != 0:
        raise AssertionError(f"{method} {path} failed in the guest ({result.returncode}): {result.stderr}")
    answer = json.loads(result.stdout)
    try:
        return answer["status"], json.loads(answer["body"])
    except json.JSONDecodeError:
        return answer["status"], answer["body"]


def irq_report(guest) -> dict:
    status, body = api(guest, "GET", "/v1/irqs")
    return body if status == 200 and isinstance(body, dict) else {}


def topology(guest) -> dict:
    status, body = api(guest, "GET", "/v1/topology")
    assert status == 200, body
    return body


def affinities(guest) -> dict[int, tuple[tuple[int, ...], tuple[int, ...] | None]]:
    """{irq: (smp_affinity_list, effective_affinity_list or None)} as the kernel shows them now."""
    return parse_affinities(guest.sh(AFFINITIES, check=True).stdout)


# One line per IRQ: number, smp_affinity_list, effective_affinity_list ("-" when the kernel
# shows none or an empty one, as for the cascade IRQ 2).
AFFINITIES = ("for d in /proc/irq/[0-9]*; do e=$(cat $d/effective_affinity_list 2>/dev/null); "
              "printf '%s %s %s\\n' \"${d##*/}\" \"$(cat $d/smp_affinity_list)\" \"${e:--}\"; done")


def parse_affinities(text: str) -> dict[int, tuple[tuple[int, ...], tuple[int, ...] | None]]:
    out: dict[int, tuple[tuple[int, ...], tuple[int, ...] | None]] = {}
    for line in text.splitlines():
        irq, requested, effective = line.split()
        out[int(irq)] = (tuple(parse_cpulist(requested)),
                         None if effective == "-" else tuple(parse_cpulist(effective)))
    return out


def interrupt_names(guest) -> dict[int, str]:
    """{irq: vector name} from /proc/interrupts (numbered lines only)."""
    names: dict[int, str] = {}
    lines = guest.sh("cat /proc/interrupts", check=True).stdout.splitlines()
    columns = len(lines[0].split())
    for line in lines[1:]:
        fields = line.split()
        if fields and fields[0].rstrip(":").isdigit():
            rest = fields[1 + columns:]
            names[int(fields[0].rstrip(":"))] = rest[-1] if rest else ""
    return names


def wait_cycles(guest, more: int, timeout: float = 300) -> dict:
    """Wait until topod has run `more` full IRQ cycles beyond the current one; the report."""
    start = irq_report(guest).get("cycles", 0)
    return guest.wait_until(lambda: (r := irq_report(guest)).get("cycles", 0) >= start + more and r,
                            f"{more} more IRQ cycle(s) after cycle {start}", timeout, 2)


def journal(guest, *matches: str, since: int = 0) -> list[dict]:
    """topod's journal entries with these field matches, written after `since` (now_usec)."""
    out = guest.sh("journalctl -u topod.service -o json --no-pager " + " ".join(matches), timeout=120).stdout
    entries = (json.loads(line) for line in out.splitlines() if line.startswith("{"))
    return [e for e in entries if int(e["__REALTIME_TIMESTAMP"]) > since]


def now_usec(guest) -> int:
    return int(guest.sh("date +%s%6N", check=True).stdout)


# --- leases without GPUs ------------------------------------------------------------
_GPULESS_SUPPORT: dict[str, str | None] = {}


def gpuless_lease(guest, cpus: int, near: str, ttl: float = 900, **more) -> dict:
    """A GPU-less lease ({"gpus": 0, "cpus": N, "near": DEV}), or the test skips while this
    daemon answers that such a request is invalid (it wants gpus >= 1)."""
    reason = _GPULESS_SUPPORT.get("reason")
    if reason:
        pytest.skip(reason)
    status, body = api(guest, "POST", "/v1/leases", gpuless_request(cpus, near, ttl, **more))
    return granted_or_skip(status, body, cpus, near)


def gpuless_request(cpus: int, near: str, ttl: float = 900, **more) -> dict:
    return {"gpus": 0, "cpus": cpus, "near": near, "ttl_seconds": ttl, **more}


def granted_or_skip(status: int, body: object, cpus: int, near: str) -> dict:
    """The lease a 201 carries; a skip (remembered for the session) when the daemon's 400
    says it has no GPU-less leases; a failure for any other answer."""
    if status == 400 and _names_a_gpuless_field(body):
        _GPULESS_SUPPORT["reason"] = ("GPU-less leases are not in this daemon yet: POST /v1/leases "
                                      f'{{"gpus": 0, "cpus": {cpus}, "near": "{near}"}} answered 400 '
                                      f"{_message(body)}")
        pytest.skip(_GPULESS_SUPPORT["reason"])
    assert status == 201, f"POST /v1/leases (gpus 0, cpus {cpus}, near {near}) answered {status}: {body}"
    return body


def require_gpuless_leases(guest, near: str) -> None:
    """Skip (saying why) unless this daemon leases CPUs without GPUs; leaves no lease."""
    release(guest, gpuless_lease(guest, cpus=1, near=near, ttl=60)["id"])


def leases(guest) -> list[dict]:
    status, body = api(guest, "GET", "/v1/leases")
    assert status == 200, body
    return body["leases"] if isinstance(body, dict) else body


def release(guest, lease_id: str) -> None:
    status, body = api(guest, "DELETE", f"/v1/leases/{lease_id}")
    assert status in (200, 204), f"DELETE /v1/leases/{lease_id} answered {status}: {body}"


def _message(body: object) -> str:
    return json.dumps(body)[:300]


def _names_a_gpuless_field(body: object) -> bool:
    """The daemon's 400 is about GPU-less leases themselves: gpus must be >= 1, or it does
    not know the fields cpus/near (not a 400 about anything else in the request)."""
    message = str(body.get("message", "")) if isinstance(body, dict) else str(body)
    wants_gpus = message.startswith("gpus:") and ">= 1" in message
    unknown = message.startswith(("cpus: unknown field", "near: unknown field"))
    return wants_gpus or unknown
