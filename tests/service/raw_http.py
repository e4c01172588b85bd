"""Hand-made HTTP over the daemon's Unix socket, for bodies no client library would send."""

from __future__ import annotations

import socket


def exchange(sock_path: str, request: bytes, timeout: float = 10.0) -> tuple[int, dict, bytes, str]:
    """(status, headers, raw body, body as text) of one raw request."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(sock_path)
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body, body.decode("utf-8", "replace")


def post(path: str, body: bytes, content_type: str = "application/json") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: topod\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
