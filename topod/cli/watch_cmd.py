"""`topoctl watch`: follow the daemon's events, across daemon restarts.

Text lines are `TIME EVENT key=value ...`: times (the event's own, `expires`, `deadline`)
as ISO 8601 local time, null fields left out, lists in brackets (`gpus=[0,1]`), strings
with blanks quoted. `--json` prints the API's records unchanged (times as seconds since the epoch).

When the stream ends or breaks before `--count` events (the daemon stopped, restarted,
was killed), watch says so on stderr and reconnects, trying for `--reconnect-timeout`
seconds; events published while it was away are not replayed (it says that too). A
daemon that does not answer at the start, or not within the window, is exit 75 (daemon
unavailable: retrying may work); permission denied is 1. Arguments: topod.cli.commands.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator

TIME_FIELDS = ("expires", "deadline", "created", "since")  # seconds since the epoch in the API
RETRY_FIRST_SECONDS = 0.2
RETRY_MAX_SECONDS = 2.0


def _value(key: str, value: object) -> str:
    from topod.cli.lease_cmd import local_time

    if key in TIME_FIELDS and isinstance(value, (int, float)) and not isinstance(value, bool):
        return local_time(value)
    if isinstance(value, (list, tuple)):  # bracketed: a one-item list is never taken for a count
        return "[" + ",".join(str(item) for item in value) + "]"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    text = str(value)
    if not text or any(ch.isspace() or ch in '"=' for ch in text):
        return json.dumps(text)  # one token for a key=value reader
    return text


def format_event(event: dict) -> str:
    """One text line: `2025-03-01T14:05:09+01:00 lease_renewed lease=ab expires=2025-...`."""
    from topod.cli.lease_cmd import local_time

    when = event.get("time")
    head = f"{local_time(when)} " if isinstance(when, (int, float)) and not isinstance(when, bool) else ""
    fields = " ".join(f"{key}={_value(key, value)}" for key, value in event.items()
                      if key not in ("event", "time") and value is not None)
    return f"{head}{event.get('event')}" + (f" {fields}" if fields else "")


def _retryable(exc: BaseException) -> bool:
    """The daemon is away (not listening, connection reset) or restarting (503)."""
    from topod.client import ApiError

    return isinstance(exc, ApiError) and (exc.status == 0 or exc.status == 503) and exc.code != "permission_denied"


def _note(args, state: str, message: str) -> None:  # noqa: ANN001 - Namespace
    if args.json:
        line = json.dumps({"note": state, "socket": args.socket_path, "message": message})
    else:
        line = f"topoctl: {message}"
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _reconnect(args, client, error: BaseException | None,  # noqa: ANN001 - Namespace, Client
               sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
    """Wait for the daemon to answer again (GET /v1/health), within --reconnect-timeout;
    raise the last error when it does not (0: no reconnecting, the error at once)."""
    from topod.client import ApiError

    why = f" ({error})" if error is not None else ""
    limit = args.reconnect_timeout
    if limit <= 0:
        raise error if error is not None else ApiError(0, "daemon_unreachable",
                                                       f"topod at {args.socket_path} closed the event stream")
    _note(args, "reconnecting", f"topod at {args.socket_path} went away{why}; reconnecting "
                                f"(for up to {limit:g} s)")
    deadline = clock() + limit
    delay = RETRY_FIRST_SECONDS
    while True:
        sleep(delay)  # first: a stream that keeps ending at once is not a busy loop
        try:
            client.health()
            break
        except ApiError as exc:
            if not _retryable(exc):
                raise
            if clock() + delay > deadline:
                raise ApiError(exc.status, exc.code, f"{exc}; gave up reconnecting after {limit:g} s") from exc
        delay = min(delay * 2, RETRY_MAX_SECONDS)
    _note(args, "reconnected", f"reconnected to topod at {args.socket_path}; "
                               "events published while it was away are not replayed")


def follow(args, client, sleep: Callable[[float], None] = time.sleep) -> Iterator[dict]:  # noqa: ANN001
    """Every event of the stream, reconnecting when it ends or breaks (the caller has
    seen the daemon answer once: a daemon that never did is its error, 75 or 1)."""
    while True:
        error: BaseException | None = None
        try:
            yield from client.events()
        except Exception as exc:  # noqa: BLE001 - only a daemon that went away is retried
            if not _retryable(exc):
                raise
            error = exc
        _reconnect(args, client, error, sleep)


def run_watch(args) -> int:  # noqa: ANN001 - Namespace
    from topod.client import Client, default_socket

    args.socket_path = args.socket or default_socket()
    client = Client(args.socket_path)
    client.health()  # fail now (75, or 1 for permission) rather than on the first event
    wanted = set(args.event or ())
    seen = 0
    for event in follow(args, client):
        if wanted and event.get("event") not in wanted:
            continue
        print(json.dumps(event) if args.json else format_event(event), flush=True)
        seen += 1
        if args.count and seen >= args.count:
            break
    return 0
