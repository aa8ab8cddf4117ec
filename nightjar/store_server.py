"""The embedded store of ``nightjar up``, readable from other processes.

``nightjar up`` keeps its job store in its own memory (``memory://``, one fakeredis
``FakeServer``), which its gateway, planner and worker use through in-process connections:
serving it over TCP to them was measured much slower (docs/benchmarks/history, "fakeredis over TCP").
Outside readers — ``nightjar top``, a ``redis-cli`` — reach the same data through
``StoreServer``: fakeredis' ``TcpFakeServer`` on 127.0.0.1 (a free port unless told), sharing
the process's ``FakeServer`` (every command runs under that server's lock, so threads and the
event loop see one consistent store). It announces itself in a file under the cache
directory (``<NIGHTJAR_CACHE>/run/up-<pid>.json``: its Redis URL, the gateway's URL, the
process id), removed when ``up`` stops; ``announced()`` lists the files of live processes,
newest first, and ``nightjar top`` defaults to the first.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from shared.connection import fake_server
from shared.settings import RuntimeSettings

log = logging.getLogger("nightjar")


def run_dir(cache: Path | None = None) -> Path:
    return (cache or RuntimeSettings().cache) / "run"


@dataclass(frozen=True)
class Announcement:
    redis_url: str  # redis://127.0.0.1:PORT/0: the embedded store
    gateway_url: str
    pid: int
    started_at: float


class StoreServer:
    """The process's embedded store on 127.0.0.1:``port`` (0: a free one) until ``close``."""

    def __init__(self, gateway_url: str, port: int = 0, cache: Path | None = None) -> None:
        from fakeredis import TcpFakeServer

        self.server = TcpFakeServer(("127.0.0.1", port), server_type="redis")
        self.server.fake_server = fake_server()  # the store the in-process services use
        self.server.daemon_threads = True  # a reader left connected never holds up the exit
        self.port = int(self.server.server_address[1])
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.file = run_dir(cache) / f"up-{os.getpid()}.json"
        self._thread = threading.Thread(target=self.server.serve_forever, name="store server", daemon=True)
        self._thread.start()
        note = Announcement(self.url, gateway_url, os.getpid(), time.time())
        self.file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(note.__dict__))
        tmp.replace(self.file)
        log.info("embedded store readable at %s (nightjar top finds it)", self.url)

    def close(self) -> None:
        self.file.unlink(missing_ok=True)
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def announced(cache: Path | None = None) -> list[Announcement]:
    """The embedded stores of the ``nightjar up`` processes alive on this machine, newest
    first (the files of dead ones are removed)."""
    found = []
    folder = run_dir(cache)
    for path in folder.glob("up-*.json") if folder.is_dir() else ():
        try:
            note = Announcement(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if _alive(note.pid):
            found.append(note)
        else:
            path.unlink(missing_ok=True)
    return sorted(found, key=lambda n: n.started_at, reverse=True)
