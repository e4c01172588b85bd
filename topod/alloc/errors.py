"""Allocation errors, each with a machine-readable `code` the API returns as is.

`retryable` says whether waiting can help (GPUs or CPUs may free up); a request the host
can never satisfy, or a malformed one, is not retryable. The capacity errors take
`retryable=False` when the empty host could not satisfy the request either
(topod.alloc.feasibility); the quota errors carry their numbers in `details`, which the
API's error body adds as fields of its own.
"""

from __future__ import annotations

from typing import Any

from topod.errors import AllocationError


class InvalidRequestError(AllocationError, ValueError):
    """A request field is missing, of the wrong type, or out of range; names the field."""

    code = "invalid_request"
    retryable = False

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class UnknownGpuError(AllocationError):
    code = "unknown_gpu"
    retryable = False


class InsufficientGpusError(AllocationError):
    """Not enough free GPUs pass the filters (retryable), or the host never has enough."""

    code = "insufficient_gpus"

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class LevelUnreachableError(AllocationError):
    """Enough GPUs are free, but no free set reaches the requested level now (retryable),
    or none ever would."""

    code = "level_unreachable"

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class InsufficientCpusError(AllocationError):
    """Not enough free whole cores near the GPUs now (retryable), or never on this host."""

    code = "insufficient_cpus"

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class InsufficientNicsError(AllocationError):
    """Not enough RDMA NIC ports for nics_per_gpu: free ones may come (retryable) or the
    host never has enough."""

    code = "insufficient_nics"

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class QuotaError(AllocationError):
    """A request that would take its holder past an [alloc] GPU cap. Retryable only when
    the request alone fits the cap (asked <= cap): then releasing the holder's own leases
    can make room; a request larger than the cap never fits."""

    def __init__(self, message: str, *, held: int, asked: int, cap: int, **holder: Any) -> None:
        super().__init__(message)
        self.retryable = asked <= cap
        self.held, self.asked, self.cap = held, asked, cap
        self.details: dict[str, Any] = {"held": held, "asked": asked, "cap": cap, **holder}


class UidQuotaError(QuotaError):
    """Over [alloc] max_gpus_per_uid: the GPUs of the caller's live leases plus the request."""

    code = "uid_quota"


class GroupQuotaError(QuotaError):
    """Over a group's [alloc] max_gpus_per_group: the GPUs its members' live leases hold
    together, plus the request."""

    code = "group_quota"
