"""Several "hosts" on one machine: Linux network namespaces joined by veth pairs on a bridge.

``Hosts`` builds them and always removes them (namespaces, bridge, veths, and every process started in
them), also after a failed test. Names carry this process's pid and a counter, so test runs of other
engineers on the same machine never collide, and leftovers of a killed run (whose pid is gone) are
removed by the next one. Each host has its own address; nothing is bound to 127.0.0.1 across hosts.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "osl"
_COUNTER = itertools.count()


def netns_unavailable() -> str | None:
    """Why this machine cannot build network namespaces (None when it can)."""
    if os.geteuid() != 0:
        return "multihost tests need root (ip netns, veth, bridge)"
    if shutil.which("ip") is None:
        return "multihost tests need the `ip` command (iproute2)"
    probe = f"{PREFIX}-{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        return f"this machine refuses network namespaces: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["ip", *(["-n", ns] if ns else []), *args]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return result


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers() -> None:
    """Remove namespaces and bridges of earlier runs whose process is gone (a killed pytest)."""
    listing = _ip("netns", "list", check=False).stdout
    for name in re.findall(rf"^({PREFIX}-(\d+)-\S+)", listing, flags=re.MULTILINE):
        if not _alive(int(name[1])):
            _kill_all_in(name[0])
            _ip("netns", "del", name[0], check=False)
    links = _ip("-o", "link", "show", check=False).stdout
    for match in re.finditer(rf"^\d+: ({PREFIX}b([0-9a-f]+)g[0-9a-f]+)[@:]", links, flags=re.MULTILINE):
        if not _alive(int(match.group(2), 16)):
            _ip("link", "del", match.group(1), check=False)


def _kill_all_in(ns: str) -> None:
    pids = _ip("netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _free_subnet() -> ipaddress.IPv4Network:
    used = set(re.findall(r"inet (10\.\d+\.\d+)\.", _ip("-o", "addr", check=False).stdout))
    seed = os.getpid() * 7919 + next(_COUNTER) * 104729
    for offset in range(4096):
        n = (seed + offset) % (250 * 250)
        prefix = f"10.{1 + n // 250}.{1 + n % 250}"
        if prefix not in used:
            return ipaddress.IPv4Network(f"{prefix}.0/24")
    raise RuntimeError("no free 10.x.y.0/24 subnet for the test hosts")


@dataclass
class Host:
    """One network namespace with one address on the test bridge."""

    name: str
    ns: str
    address: str
    veth: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def popen(
        self, argv: Sequence[str], *, log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in this host (its own process group), output appended to ``log``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(
                self.argv(argv), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, **(env or {})},
            )  # fmt: skip
        self.processes.append(proc)
        return proc

    def run(self, argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in this host to its end."""
        return subprocess.run(self.argv(argv), capture_output=True, text=True, timeout=timeout, check=False)

    def link(self, up: bool) -> None:
        """Plug this host's cable in (``up``) or pull it out: its peers see it unreachable."""
        _ip("link", "set", self.veth, "up" if up else "down")

    def stop_all(self) -> None:
        """SIGTERM every process group started here, then SIGKILL what is left in the namespace."""
        for proc in self.processes:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(deadline - time.monotonic(), 0.1))
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        _kill_all_in(self.ns)


class Hosts:
    """``with Hosts() as hosts: sn = hosts.add("sn")``: namespaces on a bridge, removed on exit."""

    def __init__(self) -> None:
        tag = f"{os.getpid():x}g{next(_COUNTER):x}"
        self._ns_base = f"{PREFIX}-{os.getpid()}-{tag}"
        self.bridge = f"{PREFIX}b{tag}"
        self.subnet = _free_subnet()
        self._addresses = self.subnet.hosts()
        self.gateway = str(next(self._addresses))
        self.hosts: list[Host] = []
        self._tag = tag

    def __enter__(self) -> Hosts:
        remove_leftovers()
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    def add(self, name: str) -> Host:
        """A new host called ``name`` with the next address of the subnet."""
        index = len(self.hosts)
        ns = f"{self._ns_base}-{name}"
        veth, inner = f"{PREFIX}v{self._tag}{index:x}", f"{PREFIX}i{self._tag}{index:x}"
        address = str(next(self._addresses))
        _ip("netns", "add", ns)
        host = Host(name, ns, address, veth)
        self.hosts.append(host)
        _ip("link", "add", veth, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", ns)
        _ip("link", "set", veth, "master", self.bridge)
        _ip("link", "set", veth, "up")
        _ip("link", "set", "lo", "up", ns=ns)
        _ip("link", "set", inner, "name", "eth0", ns=ns)
        _ip("addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0", ns=ns)
        _ip("link", "set", "eth0", "up", ns=ns)
        return host

    def __exit__(self, *exc_info: object) -> None:
        for host in self.hosts:
            with contextlib.suppress(Exception):
                host.stop_all()
        for host in self.hosts:
            _ip("link", "del", host.veth, check=False)
            _ip("netns", "del", host.ns, check=False)
        _ip("link", "del", self.bridge, check=False)


@contextlib.contextmanager
def hosts_or_skip() -> Iterator[Hosts]:
    """Hosts, or a pytest skip saying why this machine cannot build them."""
    import pytest

    reason = netns_unavailable()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI runs as root)")
        pytest.skip(reason)
    with Hosts() as hosts:
        yield hosts
