"""The daemon: asyncio loop, systemd integration, reload."""
