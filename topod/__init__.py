"""topod: a host daemon that gets GPU server topology right."""

__version__ = "0.1.0"
