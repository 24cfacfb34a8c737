"""Redis, MongoDB (FerretDB), the test shop and each crawler node in a network namespace of its own.

The hosts share nothing but a network: one bridge, in a namespace of its own, and a veth pair per
host, in a private /24 that :class:`Network` picks (``10.213.X.0/24``, X random, checked against
the addresses and routes of the root namespace). No host namespace has a default route, so a
process in one can reach the other hosts and nothing else. The test process gets one veth into
the bridge (``.1``) to seed the crawl and read Redis, MongoDB and the shop for its assertions; it
contacts only addresses the harness assigned.

:meth:`Network.cut` partitions two hosts as a real network would: every packet between them is
lost, silently, both ways, until :meth:`Network.heal`. It routes each one's address, in the
other's namespace, via a next hop whose MAC address no host has (a permanent neighbour entry):
the bridge floods the frames and every host drops them. A ``blackhole`` route would not do: the
kernel answers a local ``connect()`` through one with ``EINVAL`` at once, a refusal a node sees
immediately, not a partition.

Every process runs under ``ip netns exec <namespace> prlimit --as=<cap>``. :meth:`Network.close`
kills them all by pid, deletes every namespace and the test veth, and fails if any is left; it
runs from the fixture's finalizer, also after a failure, Ctrl-C or SIGTERM (turned into Ctrl-C
while a network is open), and at exit. What a SIGKILLed test process leaves is listed in
``/tmp/fleetcrawl-netns/<prefix>.json`` and removed by the next run (or ``python -m
tests.netns``) once its owner is gone. Needs root and iproute2.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import pymongo
import redis

from project.ops.install import ensure_ferretdb, ensure_redis_server
from tests.fleet import ROOT, Fleet
from tests.site.server import ShopServer

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import TracebackType

__all__ = ["Host", "NetnsFleet", "NetnsShop", "Network", "sweep"]

#: Address-space caps (prlimit --as): a runaway process fails alone, the machine stays up.
NODE_CAP = 2_000_000_000
REDIS_CAP = 1_000_000_000
SHOP_CAP = 1_000_000_000
#: Go reserves address space freely: FerretDB maps about 1.7 GB before it serves a request.
MONGO_CAP = 4_000_000_000

REDIS_PORT = 6379
MONGO_PORT = 27017
SHOP_PORT = 8080

_SUBNETS = ipaddress.IPv4Network("10.213.0.0/16")
#: Host part of each service's address; nodes get .10, .11, ...
_FIXED = {"tester": 1, "redis": 2, "mongo": 3, "shop": 4}
_FIRST_NODE = 10
#: The next hop of a cut: an address no host holds, its MAC (locally administered) no host has.
_VOID = 254
_VOID_MAC = "02:66:63:00:00:fe"
_BRIDGE = "br0"
_IN_NS = "eth0"
#: One file per open network (its namespaces, its link, its owner), so the next run can remove
#: what a test process killed with SIGKILL left behind; and the lock of the subnet pick.
_STATE = Path("/tmp/fleetcrawl-netns")
_LOCK = _STATE / ".lock"
_START_TIMEOUT = 30.0


class NetnsError(RuntimeError):
    """An ``ip`` command failed, or the harness could not set up or clean up."""


def _ip(command: str) -> str:
    """Run ``ip <command>`` (names and addresses here never hold spaces); its output."""
    done = subprocess.run(["ip", *command.split()], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NetnsError(f"ip {command}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _namespaces() -> set[str]:
    return {line.split()[0] for line in _ip("netns list").splitlines() if line.strip()}


def _process_start(pid: int) -> str | None:
    """The start time of process *pid* (clock ticks since boot), None if there is none."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _remove(namespaces: Sequence[str], link: str) -> None:
    """Kill what runs in *namespaces*, delete them and the root namespace's *link*."""
    for netns in namespaces:
        # Whatever still lives in a namespace of ours was started by a process of ours.
        with contextlib.suppress(NetnsError):
            for pid in _ip(f"netns pids {netns}").split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
    with contextlib.suppress(NetnsError):
        _ip(f"link del {link}")
    existing = _namespaces()
    for netns in reversed(namespaces):
        if netns in existing:
            _ip(f"netns del {netns}")


def sweep() -> list[str]:
    """Remove the networks of test processes that died without cleaning up; their prefixes."""
    swept = []
    _STATE.mkdir(exist_ok=True)
    for manifest in sorted(_STATE.glob("fc*.json")):
        try:
            state = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        if _process_start(state["owner"]) == state["owner_start"]:
            continue  # its test process still runs
        _remove(state["namespaces"], state["link"])
        manifest.unlink(missing_ok=True)
        swept.append(manifest.stem)
    return swept


def _terminate(signum: int, frame: object) -> None:
    # SIGTERM (timeout(1), a CI runner's cancel) as Ctrl-C: pytest tears the fixtures down.
    raise KeyboardInterrupt(f"signal {signum}")


def _taken_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the root namespace has an address in or a route to (default aside)."""
    taken = []
    for link in json.loads(_ip("-j -4 addr show") or "[]"):
        taken += [
            ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False)
            for info in link.get("addr_info", [])
        ]
    for route in json.loads(_ip("-j -4 route show table all") or "[]"):
        dst = route.get("dst", "default")
        if dst != "default":
            taken.append(ipaddress.IPv4Network(dst, strict=False))
    return taken


@dataclass(frozen=True)
class Host:
    """One machine of the test network: a namespace with one address."""

    name: str
    netns: str
    address: str


@dataclass
class Network:
    """A private bridge and a namespace per host; :meth:`close` removes all of it."""

    workdir: Path
    prefix: str = field(default_factory=lambda: f"fc{uuid.uuid4().hex[:6]}")
    hosts: dict[str, Host] = field(default_factory=dict, init=False)
    subnet: ipaddress.IPv4Network | None = field(default=None, init=False)
    _created: list[str] = field(default_factory=list, init=False)
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list, init=False)
    _cuts: set[tuple[str, str]] = field(default_factory=set, init=False)
    _clients: list[Any] = field(default_factory=list, init=False)
    _shops: list[ShopServer] = field(default_factory=list, init=False)
    _fleets: list[Fleet] = field(default_factory=list, init=False)
    _closed: bool = field(default=False, init=False)
    _sigterm: Any = field(default=None, init=False)

    @property
    def bridge_netns(self) -> str:
        return f"{self.prefix}-bridge"

    @property
    def tester_link(self) -> str:
        """The test process's veth in the root namespace."""
        return f"{self.prefix}-t"

    @property
    def _void(self) -> str:
        """The next hop of a cut: on the subnet, held by no host."""
        assert self.subnet is not None, "create() first"
        return str(self.subnet[_VOID])

    # -- set-up ----------------------------------------------------------------------------

    def create(self) -> Self:
        """The bridge, its namespace, and the test process's veth in a subnet nobody uses."""
        atexit.register(self.close)  # a run interrupted past the fixture's finalizer
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._sigterm = signal.signal(signal.SIGTERM, _terminate)
        _STATE.mkdir(exist_ok=True)
        # Two harnesses must not pick one subnet: the pick and its route appear under a lock.
        with _LOCK.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            sweep()
            self._add_netns(self.bridge_netns)
            self.subnet = self._free_subnet()
            _ip(f"link add {self.tester_link} type veth peer name tester netns {self.bridge_netns}")
            tester = self._address("tester")
            _ip(f"addr add {tester}/24 dev {self.tester_link}")
        _ip(f"-n {self.bridge_netns} link add {_BRIDGE} type bridge")
        _ip(f"-n {self.bridge_netns} link set {_BRIDGE} up")
        _ip(f"-n {self.bridge_netns} link set tester master {_BRIDGE} up")
        _ip(f"link set {self.tester_link} up")
        return self

    def _free_subnet(self) -> ipaddress.IPv4Network:
        taken = _taken_networks()
        candidates = list(_SUBNETS.subnets(new_prefix=24))
        random.shuffle(candidates)
        for subnet in candidates:
            if not any(subnet.overlaps(other) for other in taken):
                return subnet
        raise NetnsError(f"every /24 of {_SUBNETS} is in use in the root namespace")

    def _address(self, name: str) -> str:
        assert self.subnet is not None, "create() first"
        if name in _FIXED:
            number = _FIXED[name]
        elif name.startswith("node"):
            number = _FIRST_NODE + int(name[4:])
        else:
            raise ValueError(f"no address for host {name!r}")
        if number >= _VOID:
            raise ValueError(f"too many hosts: {name}")
        return str(self.subnet[number])

    def _add_netns(self, name: str) -> None:
        # In the manifest first: a namespace is never made without its record.
        self._created.append(name)
        state = {
            "owner": os.getpid(),
            "owner_start": _process_start(os.getpid()),
            "namespaces": self._created,
            "link": self.tester_link,
        }
        self._manifest.write_text(json.dumps(state))
        _ip(f"netns add {name}")

    @property
    def _manifest(self) -> Path:
        return _STATE / f"{self.prefix}.json"

    def add_host(self, name: str) -> Host:
        """A namespace named ``<prefix>-<name>`` on the bridge, with its address as eth0."""
        if name in self.hosts:
            return self.hosts[name]
        netns, address = f"{self.prefix}-{name}", self._address(name)
        self._add_netns(netns)
        # Both ends made where they live: no temporary name in the root namespace.
        _ip(f"link add {_IN_NS} netns {netns} type veth peer name {name} netns {self.bridge_netns}")
        _ip(f"-n {self.bridge_netns} link set {name} master {_BRIDGE} up")
        _ip(f"-n {netns} addr add {address}/24 dev {_IN_NS}")
        _ip(f"-n {netns} link set lo up")
        _ip(f"-n {netns} link set {_IN_NS} up")
        _ip(f"-n {netns} neigh add {self._void} lladdr {_VOID_MAC} dev {_IN_NS} nud permanent")
        host = self.hosts[name] = Host(name, netns, address)
        return host

    # -- processes -------------------------------------------------------------------------

    def wrap(self, host: Host, cap: int) -> tuple[str, ...]:
        """The command prefix that runs a program in *host*'s namespace under a memory cap."""
        return ("ip", "netns", "exec", host.netns, "prlimit", f"--as={cap}", "--")

    def spawn(
        self, host: Host, argv: Sequence[str], *, cap: int, log: Path
    ) -> subprocess.Popen[bytes]:
        """Start *argv* in *host*'s namespace, in a session of its own, output to *log*."""
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [*self.wrap(host, cap), *argv],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.adopt(proc)
        return proc

    def adopt(self, proc: subprocess.Popen[bytes]) -> None:
        """Kill *proc* at :meth:`close` if it still runs."""
        self._procs.append(proc)

    def _wait_answering(
        self, what: str, proc: subprocess.Popen[bytes], log: Path, probe: Callable[[], None]
    ) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise NetnsError(f"{what} exited {proc.returncode}: {_tail(log)}")
            try:
                probe()
            except Exception as exc:  # not answering yet, whatever the client says
                if time.monotonic() > deadline:
                    raise NetnsError(
                        f"{what} not answering after {_START_TIMEOUT}s: {exc}"
                    ) from exc
                time.sleep(0.1)
            else:
                return

    def start_redis(self) -> str:
        """redis-server on the ``redis`` host; its URL."""
        host = self.add_host("redis")
        folder = self.workdir / "redis"
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / "redis.conf"
        config.write_text(
            f"bind {host.address}\n"
            f"port {REDIS_PORT}\n"
            # No password: it listens on the private bridge only.
            "protected-mode no\n"
            "daemonize no\n"
            f'dir "{folder}"\n'
            'logfile ""\n'
            # Test data: no AOF, no RDB snapshots (and no forked children).
            "appendonly no\n"
            'save ""\n'
        )
        log = folder / "redis.log"
        proc = self.spawn(host, [str(ensure_redis_server()), str(config)], cap=REDIS_CAP, log=log)

        def ping() -> None:
            with redis.Redis(
                host.address, REDIS_PORT, socket_timeout=1, socket_connect_timeout=1
            ) as client:
                client.ping()

        self._wait_answering("redis-server", proc, log, ping)
        return f"redis://{host.address}:{REDIS_PORT}/0"

    def start_mongo(self) -> str:
        """FerretDB on SQLite on the ``mongo`` host, flags as ``fleetcrawl services``; its URL."""
        host = self.add_host("mongo")
        folder = self.workdir / "ferretdb"
        (folder / "data").mkdir(parents=True, exist_ok=True)
        argv = [
            str(ensure_ferretdb()),
            f"--listen-addr={host.address}:{MONGO_PORT}",
            "--handler=sqlite",
            f"--sqlite-url=file:{folder / 'data'}/",
            f"--state-dir={folder}",
            "--telemetry=disable",
            "--log-level=error",
            "--debug-addr=-",
        ]
        log = folder / "ferretdb.log"
        proc = self.spawn(host, argv, cap=MONGO_CAP, log=log)
        url = f"mongodb://{host.address}:{MONGO_PORT}/"

        def ping() -> None:
            client: pymongo.MongoClient[dict[str, Any]]
            with pymongo.MongoClient(
                url, serverSelectionTimeoutMS=1000, directConnection=True
            ) as client:
                client.admin.command("ping")

        self._wait_answering("ferretdb", proc, log, ping)
        return url

    def start_shop(self, products: int = 200, **options: Any) -> NetnsShop:
        """The test shop on the ``shop`` host; stopped at :meth:`close`."""
        shop = NetnsShop(self, self.add_host("shop"), products, **options).start()
        self._shops.append(shop)
        return shop

    def fleet(self, redis_url: str, mongo_url: str, **fields: Any) -> NetnsFleet:
        """Crawler nodes, each on a host of its own (``node0``, ``node1``, ...)."""
        log_dir = self.workdir / "nodes"
        log_dir.mkdir(parents=True, exist_ok=True)
        fields.setdefault("mongo_db", "fleetcrawl_hosts")
        crew = NetnsFleet(
            redis_url=redis_url, mongo_url=mongo_url, log_dir=log_dir, network=self, **fields
        )
        self._fleets.append(crew)
        return crew

    # -- readers for the test's assertions -------------------------------------------------

    def redis(self, url: str) -> redis.Redis:
        """A client of the test's Redis (from the root namespace); closed at :meth:`close`."""
        client: redis.Redis = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
        self._clients.append(client)
        return client

    def mongo(self, url: str) -> pymongo.MongoClient[dict[str, Any]]:
        """A client of the test's MongoDB (from the root namespace); closed at :meth:`close`."""
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
            url, serverSelectionTimeoutMS=5000, directConnection=True
        )
        self._clients.append(client)
        return client

    # -- partitions ------------------------------------------------------------------------

    def cut(self, a: str, b: str) -> None:
        """Lose every packet between hosts *a* and *b*, silently, both ways."""
        pair = self._pair(a, b)
        if pair in self._cuts:
            return
        for src, dst in (pair, pair[::-1]):
            host, other = self.hosts[src], self.hosts[dst]
            _ip(f"-n {host.netns} route add {other.address}/32 via {self._void} dev {_IN_NS}")
        self._cuts.add(pair)

    def heal(self, a: str, b: str) -> None:
        """Undo :meth:`cut`: *a* and *b* reach each other again."""
        pair = self._pair(a, b)
        if pair not in self._cuts:
            return
        for src, dst in (pair, pair[::-1]):
            host, other = self.hosts[src], self.hosts[dst]
            _ip(f"-n {host.netns} route del {other.address}/32")
        self._cuts.discard(pair)

    def _pair(self, a: str, b: str) -> tuple[str, str]:
        for name in (a, b):
            if name not in self.hosts:
                raise KeyError(f"no host {name!r} (hosts: {', '.join(self.hosts)})")
        if a == b:
            raise ValueError("a host cannot be cut from itself")
        return (a, b) if a < b else (b, a)

    # -- tear-down -------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process started here, delete every namespace and link; check none is left."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        problems: list[str] = []
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.close()
        for crew in self._fleets:
            crew.stop()
        for shop in self._shops:
            with contextlib.suppress(Exception):
                shop.stop()
        for proc in self._procs:
            _kill(proc)
        try:
            _remove(self._created, self.tester_link)
        except NetnsError as exc:
            problems.append(str(exc))
        # The kernel destroys a namespace, and the veths in it, after the last reference goes.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            left = self.leftovers()
            if not left:
                break
            time.sleep(0.1)
        problems += self.leftovers()
        if self._sigterm is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
        if problems:
            raise NetnsError("not cleaned up: " + "; ".join(problems))
        self._manifest.unlink(missing_ok=True)

    def leftovers(self) -> list[str]:
        """Namespaces, links and live processes of this network that still exist."""
        left = [f"netns {name}" for name in sorted(_namespaces() & set(self._created))]
        if Path(f"/sys/class/net/{self.tester_link}").exists():
            left.append(f"link {self.tester_link}")
        procs = [proc for crew in self._fleets for proc in crew.procs] + self._procs
        left += [f"pid {proc.pid}" for proc in procs if proc.poll() is None]
        return left

    def __enter__(self) -> Self:
        try:
            return self.create()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # its session: the process and any children
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def _tail(log: Path, size: int = 2000) -> str:
    try:
        return log.read_text(errors="replace")[-size:]
    except OSError:
        return "(no log)"


@dataclass
class NetnsFleet(Fleet):
    """:class:`tests.fleet.Fleet` whose node *i* runs on host ``node<i>``, its journal its own."""

    network: Network | None = None

    def start_node(self, *wrapper: str, **settings: Any) -> subprocess.Popen[bytes]:
        assert self.network is not None
        index = len(self.procs)
        host = self.network.add_host(f"node{index}")
        settings.setdefault("MONGO_JOURNAL_DIR", str(self.log_dir / f"node{index}.journal"))
        proc = super().start_node(*self.network.wrap(host, NODE_CAP), *wrapper, **settings)
        self.network.adopt(proc)
        return proc

    def host(self, index: int) -> Host:
        assert self.network is not None
        return self.network.hosts[f"node{index}"]


class NetnsShop(ShopServer):
    """:class:`ShopServer` run in the ``shop`` host's namespace, on its address."""

    def __init__(self, network: Network, host: Host, products: int = 200, **options: Any) -> None:
        super().__init__(products, host=host.address, port=SHOP_PORT, **options)
        self._network = network
        self._host = host

    def start(self) -> Self:
        """Start ``python -m tests.site`` in the namespace and wait for the port it bound."""
        self._stderr = open(self._network.workdir / "shop.log", "w+b")  # noqa: SIM115 (stop() closes it)
        self._process = subprocess.Popen(
            [
                *self._network.wrap(self._host, SHOP_CAP),
                sys.executable,
                "-m",
                "tests.site",
                *self.args,
            ],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,
        )
        self._network.adopt(self._process)
        try:
            self.base_url = self._read_url(self._process)
        except BaseException:
            self.stop()
            raise
        return self


if __name__ == "__main__":
    # python -m tests.netns: remove what test runs killed with SIGKILL left behind
    print("\n".join(sweep()) or "nothing to remove")
