"""Real Redis topologies from redis-server processes on loopback: a Cluster and a Sentinel set.

- ``RedisCluster``: 3 masters and 3 replicas (``redis-cli --cluster create ...
  --cluster-replicas 1 --cluster-yes``), a short ``cluster-node-timeout`` so a killed master's
  replica is promoted within seconds. Its URL is ``redis+cluster://`` (shared/connection.py).
- ``SentinelSet``: one master, one replica and three sentinels watching it (quorum 2), with a
  short ``down-after-milliseconds``. Its URL is ``redis+sentinel://.../SERVICE``.

Every node runs with ``--appendonly yes`` in a directory of its own; ports are chosen from a
fixed range (a cluster node's bus is its port + 10000, so the range must leave both free),
skipping any that something else on the machine holds. Every wait is on a condition with a
deadline; nothing sleeps blindly.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

BUS_OFFSET = 10_000  # Redis Cluster's bus port is the node's port + 10000
PORT_BASES = tuple(range(7100, 7900, 50))  # tried in turn until every port needed is free
NODE_TIMEOUT_MS = 1500  # a master unreachable this long is failed over (default 15000)
SENTINEL_SERVICE = "nightjar"
SENTINEL_DOWN_MS = 1000  # a master unreachable this long is subjectively down for a sentinel
SENTINEL_FAILOVER_MS = 5000


def require_redis_binaries() -> None:
    """Fail, loudly, where redis-server or redis-cli is missing: these suites must not skip."""
    missing = [b for b in ("redis-server", "redis-cli") if shutil.which(b) is None]
    if missing:
        raise RuntimeError(
            f"{' and '.join(missing)} not on PATH: the Cluster and Sentinel suites start their own "
            "Redis processes (apt-get install redis-server; .ci/run installs it)"
        )


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_ports(n: int, bus: bool, bases: tuple[int, ...] = PORT_BASES) -> list[int]:
    """``n`` consecutive free loopback ports (and their bus ports when ``bus``) from the
    first base of ``bases`` where all are free."""
    for base in bases:
        ports = list(range(base, base + n))
        wanted = ports + ([p + BUS_OFFSET for p in ports] if bus else [])
        if all(_free(p) for p in wanted):
            return ports
    raise RuntimeError(f"no {n} free ports in any of the ranges starting at {bases}")


def wait_until(check: Callable[[], object], timeout_s: float, what: str, every_s: float = 0.05) -> object:
    """``check()`` until truthy (its value is returned); AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(every_s)


@dataclass
class Node:
    """One redis-server (or sentinel) process on 127.0.0.1:``port``."""

    port: int
    dir: Path
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def client(self, timeout_s: float = 1.0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=timeout_s)

    def ping(self) -> bool:
        try:
            with self.client(0.5) as c:
                return bool(c.ping())
        except (redis.RedisError, OSError):
            return False

    def start(self, timeout_s: float = 20.0) -> None:
        assert not self.alive(), f"node {self.port} already running"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        with (self.dir / f"server-{self.starts}.log").open("wb") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
        wait_until(self.ping, timeout_s, f"redis on port {self.port}")

    def kill(self) -> float:
        """SIGKILL (no shutdown save): returns when the process is gone, as a wall time."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        return time.time()

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def info(self, section: str) -> dict[str, object]:
        with self.client() as c:
            return dict(c.info(section))


def _server_args(port: int, *extra: str) -> list[str]:
    return [
        "redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", ".",
        "--appendonly", "yes", "--save", "", "--daemonize", "no", "--protected-mode", "no", *extra,
    ]  # fmt: skip


@dataclass
class RedisCluster:
    """3 masters + 3 replicas on loopback, created with redis-cli."""

    root: Path
    masters: int = 3
    ports: list[int] = field(default_factory=list)
    nodes: dict[int, Node] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start(self, timeout_s: float = 60.0) -> None:
        require_redis_binaries()
        self.ports = pick_ports(self.masters * 2, bus=True)
        for port in self.ports:
            args = _server_args(
                port,
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                # A replica promoted whatever its last contact with the master: the test kills
                # the master, so that contact is recent anyway.
                "--cluster-replica-validity-factor", "0",
            )  # fmt: skip
            node = Node(port, self.root / str(port), args)
            node.start()
            self.nodes[port] = node
        hosts = [f"127.0.0.1:{p}" for p in self.ports]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *hosts, "--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=timeout_s,
        )
        wait_until(self.healthy, timeout_s, "the cluster to cover every slot on every node", every_s=0.1)

    def healthy(self) -> bool:
        """Every live node sees ``cluster_state:ok`` and ``masters`` masters, each with a replica."""
        for node in self.nodes.values():
            if not node.alive():
                continue
            try:
                with node.client() as c:
                    if c.execute_command("CLUSTER INFO").get("cluster_state") != "ok":
                        return False
            except (redis.RedisError, OSError):
                return False
        shards = self.shards()
        return len(shards) == self.masters and all(replicas for replicas in shards.values())

    def shards(self) -> dict[int, list[int]]:
        """master port -> its live replicas' ports, as a live node sees it."""
        node = next(n for n in self.nodes.values() if n.alive())
        with node.client() as c:
            lines = c.execute_command("CLUSTER", "NODES").decode().splitlines()
        ids: dict[str, int] = {}
        rows = []
        for line in lines:
            parts = line.split()
            port = int(parts[1].split("@")[0].rsplit(":", 1)[1])
            ids[parts[0]] = port
            rows.append((parts[0], port, parts[2], parts[3]))
        out: dict[int, list[int]] = {}
        for _, port, flags, _master in rows:
            if "master" in flags and "fail" not in flags:
                out.setdefault(port, [])
        for _, port, flags, master in rows:
            if "slave" in flags and "fail" not in flags and ids.get(master) in out:
                out[ids[master]].append(port)
        return out

    def master_of(self, key: str) -> int:
        """The port of the master that serves ``key``'s slot now."""
        node = next(n for n in self.nodes.values() if n.alive())
        with node.client() as c:
            slot = int(c.execute_command("CLUSTER KEYSLOT", key))
            for start, end, master, *_ in c.execute_command("CLUSTER SLOTS"):
                if start <= slot <= end:
                    return int(master[1])
        raise AssertionError(f"no master serves the slot of {key!r}")

    def keyslot(self, key: str) -> int:
        node = next(n for n in self.nodes.values() if n.alive())
        with node.client() as c:
            return int(c.execute_command("CLUSTER KEYSLOT", key))

    def role(self, port: int) -> str:
        with self.nodes[port].client() as c:
            return str(c.info("replication")["role"])

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()


@dataclass
class SentinelSet:
    """One master, one replica, three sentinels (quorum 2) on loopback."""

    root: Path
    service: str = SENTINEL_SERVICE
    ports: list[int] = field(default_factory=list)  # master, replica, sentinel × 3
    data: dict[int, Node] = field(default_factory=dict)
    sentinels: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}"

    def start(self, timeout_s: float = 60.0) -> None:
        require_redis_binaries()
        self.ports = pick_ports(5, bus=False, bases=tuple(b + 25 for b in PORT_BASES))
        master, replica, *sentinel_ports = self.ports
        for port, extra in ((master, []), (replica, ["--replicaof", "127.0.0.1", str(master)])):
            node = Node(port, self.root / str(port), _server_args(port, *extra))
            node.start()
            self.data[port] = node
        wait_until(lambda: self.link_up(replica), timeout_s, "the replica to sync with the master")
        for port in sentinel_ports:
            d = self.root / f"sentinel-{port}"
            d.mkdir(parents=True, exist_ok=True)
            conf = d / "sentinel.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {d}\n"
                f"sentinel monitor {self.service} 127.0.0.1 {master} 2\n"
                f"sentinel down-after-milliseconds {self.service} {SENTINEL_DOWN_MS}\n"
                f"sentinel failover-timeout {self.service} {SENTINEL_FAILOVER_MS}\n"
                f"sentinel parallel-syncs {self.service} 1\n"
            )
            node = Node(port, d, ["redis-server", str(conf), "--sentinel"])
            node.start()
            self.sentinels.append(node)
        wait_until(self.watching, timeout_s, "every sentinel to know the master, its replica and the others")

    def link_up(self, replica: int) -> bool:
        try:
            return self.data[replica].info("replication").get("master_link_status") == "up"
        except (redis.RedisError, OSError):
            return False

    def watching(self) -> bool:
        for s in self.sentinels:
            try:
                with s.client() as c:
                    m = c.execute_command("SENTINEL", "MASTER", self.service)
            except (redis.RedisError, OSError):
                return False
            info = dict(zip(m[::2], m[1::2], strict=True)) if isinstance(m, list) else m
            if int(info[b"num-slaves"]) < 1 or int(info[b"num-other-sentinels"]) < 2:
                return False
        return True

    def master_port(self) -> int | None:
        """The master's port as the sentinels agree on it (None while they do not)."""
        seen = set()
        for s in self.sentinels:
            if not s.alive():
                continue
            with contextlib.suppress(redis.RedisError, OSError), s.client() as c:
                _, port = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
                seen.add(int(port))
        return seen.pop() if len(seen) == 1 else None

    def role(self, port: int) -> str:
        return str(self.data[port].info("replication")["role"])

    def stop(self) -> None:
        for node in [*self.sentinels, *self.data.values()]:
            node.stop()


@contextlib.contextmanager
def running(topology: RedisCluster | SentinelSet) -> Iterator[RedisCluster | SentinelSet]:
    try:
        topology.start()
        yield topology
    finally:
        topology.stop()
