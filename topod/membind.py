"""Memory binding for the calling process (set_mempolicy through ctypes; no libnuma needed)."""

from __future__ import annotations

import ctypes
import os
import platform

MPOL_BIND = 2
_SYSCALL_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "ppc64le": 261}


def bind_memory(nodes: list[int]) -> bool:
    """Bind future allocations of this process to `nodes`. False when the kernel or
    architecture does not allow it (reported by the caller; never silently assumed)."""
    number = _SYSCALL_SET_MEMPOLICY.get(platform.machine())
    if number is None or not nodes:
        return False
    max_node = max(nodes) + 1
    words = (max_node + 63) // 64
    mask = (ctypes.c_ulong * words)()
    for node in nodes:
        mask[node // 64] |= 1 << (node % 64)
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.syscall(number, MPOL_BIND, mask, ctypes.c_ulong(words * 64 + 1))
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"set_mempolicy(MPOL_BIND, {nodes}): {os.strerror(errno)}")
    return True
