"""topoctl's exit statuses (sysexits-style), and the errors that choose them."""

from __future__ import annotations

import sys

from topod.errors import TopodError

OK = 0
ERROR = 1
USAGE = 2
NOT_FOUND = 3
TEMPFAIL = 75  # EX_TEMPFAIL: no capacity now, queue full, daemon unavailable: retrying may work
# A request the host can never satisfy (the daemon says retryable: false) and permission
# denied on the socket are ERROR: a retry loop on 75 would never end.
PIPE = 141  # 128 + SIGPIPE: what a shell reports for a tool whose reader went away

_TEMPORARY_STATUSES = (409, 429, 503)
_NOT_FOUND_CODES = ("lease_not_found", "unknown_gpu", "not_found")


class NotFoundError(TopodError):
    """Something named on the command line does not exist (a lease, a GPU)."""

    code = "not_found"


class UsageError(TopodError):
    """Options that cannot go together, found after parsing."""

    code = "usage"


class DaemonUnavailableError(TopodError):
    """The command needs the daemon and none answered."""

    code = "daemon_unreachable"


def exit_code_of(exc: BaseException) -> int:
    if isinstance(exc, NotFoundError):
        return NOT_FOUND
    if isinstance(exc, UsageError):
        return USAGE
    if isinstance(exc, DaemonUnavailableError):
        return TEMPFAIL
    client = sys.modules.get("topod.client")  # never imported just to classify an error
    if client is not None and isinstance(exc, client.ApiError):
        if exc.code in _NOT_FOUND_CODES or exc.status == 404:
            return NOT_FOUND
        if exc.code == "permission_denied":
            return ERROR  # joining the group helps, waiting does not
        if exc.status in _TEMPORARY_STATUSES and getattr(exc, "retryable", None) is False:
            return ERROR  # the host can never satisfy it (more GPUs than it has, a model it lacks)
        if exc.status == 0 or exc.status in _TEMPORARY_STATUSES:
            return TEMPFAIL
        if exc.status == 400:
            return USAGE
    return ERROR
