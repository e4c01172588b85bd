"""The lease hot path without the framework: POST /v1/leases and DELETE /v1/leases/{id}
answered straight from the connection's protocol, on httptools (llhttp, the parser
uvicorn uses; aiohttp's own C parser is llhttp too).

Why: under load aiohttp's per-request machinery (request and response objects, the
middleware chain, the handler task's wrapping, header building) cost the event loop more
than everything topod does for a grant. A connection starts here; a request is served
here only when it is plainly one of those two and nothing about it is unusual:

- exactly one complete request is in hand (head and body together, no pipelined second
  one, nothing half-sent), HTTP/1.0 or 1.1;
- `POST /v1/leases` with a Content-Length body (no chunked transfer, no Expect, no
  Upgrade), or `DELETE /v1/leases/<id>` with no body, the id plain letters and digits,
  no query string;
- each header once at most where it matters (Content-Length, Content-Type,
  Transfer-Encoding), ASCII, the head within aiohttp's own line limits.

Anything else — a malformed request, a partial one (slow or stalled clients), another
endpoint — hands the connection, with every byte received since the start of that
request, to aiohttp's protocol (the GatedRequestHandler), which parses it again from the
start and answers exactly as it always has: its limits, timeouts, error answers and the
connection gate's count carry on unchanged. The hot path calls the same functions as the
aiohttp handlers (caller identity, body validation, the lease service, the error mapping),
so its answers are theirs; only the HTTP framing is its own.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from functools import partial
from typing import Any

import httptools
from aiohttp.helpers import parse_content_type

from topod.api.answers import error_document
from topod.api.answers import dumps as json_dumps
from topod.api.body import parse_body
from topod.api.closed_transport import forget_read_callback
from topod.api.framing import response_bytes
from topod.api.half_close import peer_gone
from topod.api.peer import PeerDeniedError, caller_async, caller_now, peer_credentials
from topod.api.server import check_declared_size, lease_text, max_body_bytes, released_text

# aiohttp refuses a request line or a header field over 8,190 bytes; a head that comes
# near it goes to aiohttp, which answers as it always has.
MAX_FIELD_BYTES = 8190
MAX_HEADERS = 64
# Bytes of a pipelined next request kept while one is being served; beyond that the
# socket is not read until the answer is out.
MAX_BUFFERED = 256 * 1024
_LEASE_ID = re.compile(rb"/v1/leases/([A-Za-z0-9]{1,64})")
_SINGLE = frozenset({b"content-length", b"content-type", b"transfer-encoding", b"expect", b"upgrade"})


class _NotLean(Exception):
    """This request is not for the hot path: aiohttp takes the connection."""


class LeanConnection(asyncio.Protocol):
    """One API connection: the hot path here, everything else handed to aiohttp.

    site: the GatedSockSite (its gate, its aiohttp protocol factory, the backend)."""

    __slots__ = ("_site", "_gate", "_backend", "_internal", "_transport", "_uid", "_peer", "_buffer", "_task",
                 "idle_since", "_admitted", "_paused", "_method", "_url", "_headers", "_body", "_messages",
                 "_complete", "_head_bytes", "_keep_alive", "_parser", "_half_closed")

    def __init__(self, site: Any, backend: Any, internal: bool = False) -> None:
        self._site = site
        self._gate = site.gate
        self._backend = backend
        self._internal = internal
        self._transport: asyncio.Transport | None = None
        self._uid: int | None = None
        self._peer: tuple[int | None, int, int] | Exception | None = None
        self._buffer = b""
        self._task: asyncio.Task | None = None
        self.idle_since: float | None = None  # loop time the connection last went idle; None: busy
        self._admitted = False
        self._paused = False
        self._half_closed = False  # the client sent its EOF and waits for the answer

    # -- the connection ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        if not self._internal:
            try:
                self._peer = peer_credentials(transport.get_extra_info("socket"))
                self._uid = self._peer[1]
            except (OSError, ValueError) as exc:  # counted as a user, refused when it asks for anything
                self._peer = exc
            if not self._gate.admit(self._uid):
                # The gate's refusal (503, linger or close) is the aiohttp protocol's.
                handler = self._site.aiohttp_protocol(self._internal)
                transport.set_protocol(handler)
                handler.refuse(transport, self._uid)
                return
        self._admitted = True
        self._site.lean_connections.add(self)
        self._site.idle_sweep.watch()
        self.idle_since = asyncio.get_running_loop().time()

    def connection_lost(self, exc: BaseException | None) -> None:
        forget_read_callback(self._transport)
        if not self._admitted:
            return
        self._admitted = False
        self._site.lean_connections.discard(self)
        if not self._internal:
            self._gate.leave(self._uid)
        task = self._task
        if isinstance(task, asyncio.Task) and not task.done():
            task.cancel()  # the client went away: as aiohttp's handler_cancellation does
        # A grant answered from its commit learns it then (_answer_grant: not delivered).

    def eof_received(self) -> bool | None:
        """The client's EOF. With nothing in hand, or its peer gone, it hung up: the
        transport closes and connection_lost cancels what is in progress. A client that
        only half-closed after a whole request (topod.api.half_close) keeps the connection
        for its answer (True: asyncio leaves it open for writing); the connection closes
        once every request received is answered."""
        if (self._task is None and not self._buffer) or peer_gone(self._transport):
            return None
        self._half_closed = True
        return True

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._task is not None:  # pipelined: kept until the answer in progress is out
            if len(self._buffer) > MAX_BUFFERED and not self._paused:
                self._paused = True
                self._transport.pause_reading()
            return
        self._next_request()

    # -- one request -----------------------------------------------------------------
    def _next_request(self) -> None:
        raw, self._buffer = self._buffer, b""
        if not raw:
            return
        self.idle_since = None
        self._method = self._url = None
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self._messages = 0
        self._complete = False
        self._head_bytes = 0
        self._keep_alive = False
        self._parser = parser = httptools.HttpRequestParser(self)
        try:
            parser.feed_data(raw)
            if not self._complete or self._messages != 1:
                raise _NotLean
            serve = self._job(parser)
        except (_NotLean, ValueError, httptools.HttpParserError, httptools.HttpParserUpgrade):
            self._hand_over(raw)
            return
        finally:
            # The parser holds this connection's callbacks: kept, the pair is a cycle that
            # only the cyclic collector frees, one per request (with the transport's own,
            # topod.api.closed_transport, ~11 us of collection per round trip under
            # saturation).
            self._parser = None
        serve()

    def on_message_begin(self) -> None:
        self._messages += 1
        if self._messages > 1:
            raise _NotLean  # a pipelined second request: aiohttp serves the lot

    def on_url(self, url: bytes) -> None:
        self._url = url if self._url is None else self._url + url
        if len(self._url) > MAX_FIELD_BYTES:
            raise _NotLean

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.lower()
        if key in self._headers and key in _SINGLE or len(self._headers) >= MAX_HEADERS:
            raise _NotLean
        if len(name) + len(value) > MAX_FIELD_BYTES:
            raise _NotLean
        self._headers[key] = value

    def on_headers_complete(self) -> None:
        self._keep_alive = self._parser.should_keep_alive()  # llhttp knows it only until the message ends

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._complete = True

    def _job(self, parser: httptools.HttpRequestParser) -> Callable[[], None]:
        """What serves this request (called once parsing is over), or _NotLean."""
        headers = self._headers
        if (parser.get_http_version() not in ("1.1", "1.0") or b"transfer-encoding" in headers
                or b"expect" in headers or b"upgrade" in headers or parser.should_upgrade()):
            raise _NotLean
        method, url = parser.get_method(), self._url
        if method == b"POST" and url == b"/v1/leases":
            length = headers.get(b"content-length")
            if length is None:
                raise _NotLean
            return partial(self._allocate, int(length), headers.get(b"content-type"), b"".join(self._body))
        if method == b"DELETE" and not self._body and b"content-length" not in headers:
            match = _LEASE_ID.fullmatch(url or b"")
            if match:
                return partial(self._release, match.group(1).decode())
        raise _NotLean

    # A grant or release is decided in this callback and answered from its commit's
    # callback: no task, no await. Only a request that must wait (a group lookup for its
    # caller, a queue) runs as a task; `_task` is then that task, else a future that
    # resolves when the answer is out (what shutdown waits for).
    def _start(self, job, method: str, path: str) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(job, method, path))

    def _await_commit(self) -> None:
        self._task = asyncio.get_running_loop().create_future()

    async def _run(self, job, method: str, path: str) -> None:
        """A fault outside the endpoints' own error handling is a 500, as the middleware's."""
        try:
            await job
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001 - the one place here that turns faults into a 500
            if self._task is not None:  # no answer went out yet
                self._answer_error(exc, method, path)

    def _allocate(self, length: int, content_type: bytes | None, raw: bytes) -> None:
        backend = self._backend
        try:
            charset = None
            if content_type is not None:
                charset = parse_content_type(content_type.decode("utf-8", "surrogateescape"))[1].get("charset")
            limit = max_body_bytes(backend)
            check_declared_size(length, limit)
            body = parse_body(raw, charset=charset, max_bytes=limit)
            caller = self._caller_now()
            if caller is None:
                self._start(self._allocate_later(body), "POST", "/v1/leases")
                return
            started = backend.alloc.start_allocation(body, caller)
        except Exception as exc:  # noqa: BLE001 - the API's error mapping, as the middleware does
            self._answer_error(exc, "POST", "/v1/leases")
            return
        if not isinstance(started, tuple):  # Queued, nothing granted yet: a cancelled task takes nothing
            self._start(self._allocate_later(body, started, caller), "POST", "/v1/leases")
            return
        self._await_commit()
        backend.alloc.deliver(*started, partial(self._committed, "POST", "/v1/leases", self._answer_grant))

    def _committed(self, method: str, path: str, answer: Callable[[Any], Any], lease: Any,
                   error: BaseException | None) -> None:
        """A grant's or release's commit is done: its answer, or its error's."""
        try:
            if error is not None:
                self._answer_error(error, method, path)
            else:
                answer(lease)
        except Exception as exc:  # noqa: BLE001 - a fault here is a 500, as the middleware's
            if self._task is not None:
                self._answer_error(exc, method, path)

    async def _allocate_later(self, body: Any, started: Any = None, caller: Any = None) -> None:
        backend = self._backend
        try:
            if started is None:
                caller = await self._caller()
                started = backend.alloc.start_allocation(body, caller)
            lease = await backend.alloc.finish_allocation(started, caller, connected=self._connected)
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001 - the API's error mapping, as the middleware does
            self._answer_error(exc, "POST", "/v1/leases")
            return
        self._answer_grant(lease)

    def _answer_grant(self, lease: Any) -> None:
        """Written with no await between the grant's commit and the write: a lease whose
        answer cannot reach its client ends at once (as in the aiohttp handler)."""
        backend = self._backend
        delivered = False
        try:
            delivered = self._answer(201, lease_text(backend, lease).encode())
        finally:
            backend.alloc.answered(lease, delivered)

    def _release(self, lease_id: str) -> None:
        try:
            caller = self._caller_now()
            if caller is None:
                self._start(self._release_later(lease_id), "DELETE", f"/v1/leases/{lease_id}")
                return
            lease, commit = self._backend.alloc.start_release(lease_id, caller)
        except Exception as exc:  # noqa: BLE001
            self._answer_error(exc, "DELETE", f"/v1/leases/{lease_id}")
            return
        self._await_commit()
        self._backend.alloc.when_committed(lease, commit, partial(
            self._committed, "DELETE", f"/v1/leases/{lease_id}", self._answer_released))

    def _answer_released(self, lease: Any) -> None:
        self._answer(200, released_text(lease).encode())

    async def _release_later(self, lease_id: str) -> None:
        try:
            lease = await self._backend.alloc.release(lease_id, await self._caller())
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001
            self._answer_error(exc, "DELETE", f"/v1/leases/{lease_id}")
            return
        self._answer_released(lease)

    def _peer_ids(self) -> tuple[int | None, int, int]:
        if not isinstance(self._peer, tuple):
            raise PeerDeniedError(f"cannot identify the caller: {self._peer or 'not a Unix socket peer'}")
        return self._peer

    def _caller_now(self):
        """The caller, or None when its groups must be looked up first (_caller)."""
        return caller_now(*self._peer_ids(), self._backend.allowed_group)

    async def _caller(self):
        return await caller_async(*self._peer_ids(), self._backend.allowed_group)

    def _connected(self) -> bool:
        """Still there to be answered. A half-closed client is asked (one poll): one gone
        since is a hang-up, and its connection closes now (connection_lost withdraws what
        waits for it)."""
        if not self._admitted or self._transport.is_closing():
            return False
        if self._half_closed and peer_gone(self._transport):
            self._transport.close()
            return False
        return True

    def _answer_error(self, exc: Exception, method: str, path: str) -> None:
        status, document = error_document(exc, method, path)
        self._answer(status, json_dumps(document).encode())

    def _answer(self, status: int, body: bytes) -> bool:
        """Write the whole answer; True when it went to a connection still open. Then the
        next request (pipelined), or the end of the connection."""
        transport = self._transport
        task, self._task = self._task, None
        if task is not None and not isinstance(task, asyncio.Task) and not task.done():
            task.set_result(None)  # the answer shutdown waits for is out
        if not self._connected():
            return False
        # A half-closed client's last request is answered as the last: it sends no more.
        keep_alive = self._keep_alive and not (self._half_closed and not self._buffer)
        transport.write(response_bytes(status, body, keep_alive))
        delivered = not transport.is_closing()
        if not keep_alive:
            transport.close()
            return delivered
        if self._paused:
            self._paused = False
            transport.resume_reading()
        self.idle_since = asyncio.get_running_loop().time()
        if self._buffer:
            asyncio.get_running_loop().call_soon(self._next_request)
        return delivered

    # -- handing over to aiohttp ----------------------------------------------------------
    def _hand_over(self, raw: bytes) -> None:
        """aiohttp's protocol takes the connection and these bytes (a request from its
        first byte); the gate's count goes with it."""
        self._admitted = False
        self._site.lean_connections.discard(self)
        handler = self._site.aiohttp_protocol(self._internal)
        handler.adopt(self._transport, self._uid)
        handler.data_received(raw)
        if self._half_closed and not handler.eof_received():
            # The EOF came before these bytes were handed over: aiohttp hears it now, and
            # a request it does not hold whole was a hang-up (as asyncio would close it).
            self._transport.close()

    # -- idle connections --------------------------------------------------------------------
    def close_if_idle(self, now: float, seconds: float) -> None:
        """No request within [api] idle_timeout_seconds: closed, as aiohttp's keep-alive
        timer closes its idle connections (a request in progress is never idle)."""
        since = self.idle_since
        if since is not None and now - since >= seconds and self._task is None and not self._buffer:
            self._transport.close()

    # -- shutdown ---------------------------------------------------------------------------
    def close_when_idle(self) -> asyncio.Task | None:
        """At shutdown: an idle connection closes now; a request in progress is returned to
        wait for (its answer goes out, then the connection closes)."""
        if self._task is None:
            self._transport.close()
            return None
        self._keep_alive = False
        return self._task

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

