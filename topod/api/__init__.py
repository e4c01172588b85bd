"""HTTP/1.1 + JSON on a Unix socket: topoctl and schedulers are its clients."""
