"""The kubelet's unix sockets as both plugins serve them: a gRPC server bound to one (with
the reason when it cannot be), and what tells one file at a path from the next one created
there (the kubelet deletes and recreates sockets when it restarts)."""

from __future__ import annotations

import os
from pathlib import Path

import grpc


def identity(path: Path) -> tuple[int, int, int] | None:
    """What tells one file at `path` from the next one created there (None: nothing there)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


def listen(server: grpc.Server, path: Path, what: str) -> None:
    """Add the unix socket `path` to `server`; OSError naming `what` if it cannot be."""
    try:
        bound = server.add_insecure_port(f"unix://{path}")
    except RuntimeError:  # grpc raises where it used to return 0
        bound = 0
    if not bound:
        long = len(bytes(path)) > 107
        why = " (longer than the 107 bytes a socket path may have)" if long else ""
        raise OSError(f"cannot serve {what} on {path}{why}")
