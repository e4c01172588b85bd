"""The error hierarchy: every message says what to fix."""

from __future__ import annotations


class TopodError(Exception):
    """Base of every error topod raises on purpose."""

    code = "topod_error"


class NotAHostTreeError(TopodError):
    """A --root that holds neither sys/ nor proc/ the way a host does."""

    code = "not_a_host_tree"


class HostReadError(TopodError):
    """A file under the host root could not be read or parsed."""

    code = "host_read_error"


class HostWriteError(TopodError):
    """A write under the host root failed; carries the errno."""

    code = "host_write_error"

    def __init__(self, path: str, errno_value: int, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.errno = errno_value


class ConfigError(TopodError):
    """The TOML configuration is invalid; the message names the key path."""

    code = "invalid_config"


class InvalidJsonError(TopodError):
    """A request body that is not the JSON the endpoint takes."""

    code = "invalid_json"


class UnavailableError(TopodError):
    """A feature switched off in the configuration."""

    code = "unavailable"


class AllocationError(TopodError):
    """A request that cannot be met as asked."""

    code = "allocation_failed"


class HostFileMissingError(HostReadError):
    """A host file that is not there (ENOENT/ENOTDIR): usually normal, the caller decides."""

    code = "file_missing"


class HostPermissionError(HostReadError):
    """A host file topod may not read (EACCES/EPERM): run as root or fix the mode."""

    code = "permission_denied"


class NotARegularFileError(HostReadError):
    """A FIFO, socket, device or directory where the host tree should hold a plain file."""

    code = "not_a_regular_file"


class HostFileTooLargeError(HostReadError):
    """A host file larger than the cap for its path; topod refuses to read it."""

    code = "file_too_large"


class HostFileUnreadableError(HostReadError):
    """Any other I/O error reading a host file (EIO, ELOOP, ...); the message has the errno."""

    code = "read_error"
