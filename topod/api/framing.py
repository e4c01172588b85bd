"""The lease hot path's HTTP/1.1 response: status line, the headers aiohttp would send
for a JSON answer (minus `Server:`), and the body, as one buffer for one write."""

from __future__ import annotations

import time
from email.utils import formatdate

_REASONS = {200: "OK", 201: "Created", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            408: "Request Timeout", 409: "Conflict", 413: "Payload Too Large", 415: "Unsupported Media Type",
            429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}


class _Date:
    """The Date header, formatted once per second."""

    second = -1
    value = b""

    @classmethod
    def now(cls) -> bytes:
        second = int(time.time())
        if second != cls.second:
            cls.second, cls.value = second, formatdate(second, usegmt=True).encode()
        return cls.value


def response_bytes(status: int, body: bytes, keep_alive: bool) -> bytes:
    return b"".join((
        b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, "Unknown").encode()),
        b"Content-Type: application/json; charset=utf-8\r\nContent-Length: %d\r\nDate: %s\r\n"
        % (len(body), _Date.now()),
        b"Connection: keep-alive\r\n\r\n" if keep_alive else b"Connection: close\r\n\r\n",
        body))
