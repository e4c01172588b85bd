"""Allocation errors, each with a machine-readable `code` the API returns as is.

`retryable` says whether waiting can help (GPUs or CPUs may free up); a request the host
can never satisfy, or a malformed one, is not retryable.
"""

from __future__ import annotations

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
    """Enough GPUs are free, but no free set reaches the requested level now."""

    code = "level_unreachable"
    retryable = True


class InsufficientCpusError(AllocationError):
    code = "insufficient_cpus"
    retryable = True


class InsufficientNicsError(AllocationError):
    """Not enough RDMA NIC ports for nics_per_gpu: free ones may come (retryable) or the
    host never has enough."""

    code = "insufficient_nics"

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable
