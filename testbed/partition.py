"""A TCP path that can be cut: what a network partition between a node and the API server
looks like to the node's processes.

`Partition(target_port)` listens on a port of 127.0.0.1 of its own and forwards each
connection to the target (the kube-apiserver stand-in); clients are given its `url`. `cut()`
closes every forwarded connection (each side sees its peer reset) and the listening socket
(a new connection is refused, as to a host that is gone); `heal()` listens again on the same
port. Watches end with the cut, and clients reconnect and list again, as after a real one.

Left out: latency, loss, and one-way partitions; a cut connection is reset, not left to
time out.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

from testbed.host import Closing

CHUNK = 1 << 16


class Partition(Closing):
    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener = self._listen(0)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._closed = False
        self._accepting = self._accept_in_thread()

    def _listen(self, port: int) -> socket.socket:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
        return listener

    def _accept_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self._accept, args=(self._listener,), daemon=True)
        thread.start()
        return thread

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # cut or closed
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(CHUNK):
                sink.sendall(data)
        for s in (source, sink):  # one side ended: both go
            self._drop(s)

    def _drop(self, s: socket.socket) -> None:
        with self._lock:
            self._open.discard(s)
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        s.close()

    def cut(self) -> None:
        """No connection through, and none to be made, until `heal`."""
        with contextlib.suppress(OSError):  # wakes the accept: a close alone would not
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._accepting.join(timeout=5)
        with self._lock:
            cut = list(self._open)
        for s in cut:
            with contextlib.suppress(OSError):  # RST, as a gone peer's kernel answers
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self._drop(s)

    def heal(self) -> None:
        if self._closed:
            return
        self._listener = self._listen(self.port)
        self._accepting = self._accept_in_thread()

    def close(self) -> None:
        self._closed = True
        self.cut()
