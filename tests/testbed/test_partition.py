"""The cuttable TCP path (testbed/partition.py): traffic through it, a cut that ends open
connections and refuses new ones, and a heal on the same port."""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest

from testbed.partition import Partition


def echo(conn: socket.socket) -> None:
    with conn, contextlib.suppress(OSError):
        while data := conn.recv(64):
            conn.sendall(data)


def serving(server: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while True:
            conn, _ = server.accept()
            threading.Thread(target=echo, args=(conn,), daemon=True).start()


def ended(conn: socket.socket) -> bool:
    """Whether the peer has gone (reset, or closed: nothing more comes)."""
    try:
        conn.sendall(b"again")
        return conn.recv(64) == b""
    except OSError:
        return True


def test_a_cut_ends_what_is_open_refuses_what_is_new_and_a_heal_lets_it_through() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=serving, args=(server,), daemon=True).start()
    with server, Partition(server.getsockname()[1]) as path:
        before = socket.create_connection(("127.0.0.1", path.port), timeout=5)
        before.sendall(b"hello")
        assert before.recv(64) == b"hello"
        path.cut()
        assert ended(before)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", path.port), timeout=5)
        path.heal()
        with socket.create_connection(("127.0.0.1", path.port), timeout=5) as after:
            after.sendall(b"back")
            assert after.recv(64) == b"back"
        before.close()
