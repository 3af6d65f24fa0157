"""What the device-plugin tests share: the plugin served in a thread of the test."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from deviceplugin.config import Config
from deviceplugin.plugin import serve


@contextmanager
def serving(config: Config) -> Iterator[None]:
    """`serve.run(config)` until the block ends; it must stop within 30 s once told."""
    stop = threading.Event()
    thread = threading.Thread(target=serve.run, args=(config, stop))
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)
        assert not thread.is_alive()
