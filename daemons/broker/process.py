"""A broker subprocess, started and stopped by PID: mosquitto when installed, else amqtt."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

from daemons.broker.amqtt_main import amqtt_config
from daemons.broker.mosquitto import find_mosquitto, mosquitto_command, render_acl, render_config
from daemons.broker.settings import BrokerSettings, free_port
from daemons.bus.config import BrokerAddress

__all__ = ["BrokerError", "Engine", "ManagedBroker", "die_with_parent", "stop_process"]

log = logging.getLogger("swarm.broker")
Engine = Literal["auto", "mosquitto", "amqtt"]
_PR_SET_PDEATHSIG = 1
_MAX_RESTARTS_PER_MINUTE = 5


class BrokerError(RuntimeError):
    """The broker could not be started; the message includes the end of its log."""


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when the process that started it dies (Linux), so a killed
    SN never leaves its broker running."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def stop_process(proc: subprocess.Popen[bytes] | None, grace: float) -> None:
    """SIGTERM ``proc`` by PID, SIGKILL it after ``grace`` seconds; nothing when it is not running."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def _check_port_free(host: str, port: int) -> None:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the broker does
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise BrokerError(
                f"port {port} on {host} is taken ({exc.strerror}): another broker or program listens "
                f"there; choose another port, or use that broker with --broker mqtt://{host}:{port}"
            ) from None


def _port_open(host: str, port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host if host not in ("0.0.0.0", "") else "127.0.0.1", port)) == 0


class ManagedBroker:
    """Run, supervise and stop one broker process.

    ``start()`` returns once the listener accepts connections; ``stop()`` sends SIGTERM to the PID and
    SIGKILL after a grace period. ``supervise()`` restarts the broker on the same port if it dies.
    """

    def __init__(self, settings: BrokerSettings, engine: Engine = "auto") -> None:
        self.settings = settings
        self.engine: Literal["mosquitto", "amqtt"] = self._pick(engine)
        self.port = settings.port or free_port(settings.host)
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopping = False
        self.restarts = 0
        self.revoked: frozenset[str] = frozenset()

    @staticmethod
    def _pick(engine: Engine) -> Literal["mosquitto", "amqtt"]:
        if engine == "amqtt":
            return "amqtt"
        if find_mosquitto() is not None:
            return "mosquitto"
        if engine == "mosquitto":
            raise BrokerError("mosquitto is not installed (apt-get install mosquitto)")
        log.warning("mosquitto not found; using the amqtt fallback broker (slower, see docs)")
        return "amqtt"

    @property
    def address(self) -> BrokerAddress:
        """Where clients connect."""
        host = "127.0.0.1" if self.settings.host in ("0.0.0.0", "") else self.settings.host
        return BrokerAddress(host, self.port, self.settings.tls is not None)

    @property
    def pid(self) -> int | None:
        """PID of the running broker process."""
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> Path:
        """The broker's log file."""
        return self.settings.workdir / f"{self.engine}.log"

    def _command(self) -> list[str]:
        workdir = self.settings.workdir
        workdir.mkdir(parents=True, exist_ok=True)
        tls = self.settings.tls
        if tls is not None:
            tls.check()
        if self.engine == "mosquitto":
            acl = workdir / "acl" if tls is not None else None
            if acl is not None:
                acl.write_text(render_acl(self.revoked))
            conf = workdir / "mosquitto.conf"
            conf.write_text(render_config(self.settings, self.port, acl))
            binary = find_mosquitto()
            assert binary is not None  # noqa: S101 - checked by _pick
            return mosquitto_command(binary, conf)
        files = None if tls is None else {"ca": str(tls.ca), "cert": str(tls.cert), "key": str(tls.key)}
        conf = workdir / "amqtt.json"
        conf.write_text(json.dumps(amqtt_config(self.settings.host, self.port, files), indent=2))
        return [sys.executable, "-m", "daemons.broker.amqtt_main", str(conf)]

    def refuse(self, identities: frozenset[str]) -> bool:
        """Refuse these (revoked) identities from now on; True when the broker enforces it.

        mosquitto with mutual TLS: the ACL file denies them everything and SIGHUP makes mosquitto
        reload it, for live connections too (they stay open but can neither publish nor receive).
        Without TLS there are no identities to refuse, and amqtt has no reload: False.
        """
        self.revoked = identities
        if self.engine != "mosquitto" or self.settings.tls is None:
            return False
        acl = self.settings.workdir / "acl"
        tmp = acl.with_name("acl.new")
        tmp.write_text(render_acl(identities))
        tmp.replace(acl)  # mosquitto never reads half a file
        proc = self._proc
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGHUP)
        log.info("broker refuses the revoked identities %s", ", ".join(sorted(identities)))
        return True

    def start(self, timeout: float = 15.0) -> BrokerAddress:
        """Start the broker and wait until it accepts connections.

        Raises BrokerError when the port is taken (something else would answer in its place) or when
        the broker exits or does not listen in time.
        """
        _check_port_free(self.settings.host, self.port)
        command = self._command()
        with self.log_path.open("ab") as log_file:
            self._proc = subprocess.Popen(
                command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,  # noqa: PLW1509 - only prctl, async-signal-safe
            )
        deadline = time.monotonic() + timeout
        while not _port_open(self.settings.host, self.port):
            code = self._proc.poll()
            if code is not None:
                raise BrokerError(
                    f"{self.engine} exited with status {code} on port {self.port}:\n{_tail(self.log_path)}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"{self.engine} did not listen on port {self.port} within {timeout:g} s")
            time.sleep(0.02)
        log.info("%s broker (pid %s) listening on %s", self.engine, self.pid, self.address)
        return self.address

    def stop(self, grace: float = 5.0) -> None:
        """Stop the broker by PID: SIGTERM, then SIGKILL after ``grace`` seconds."""
        self._stopping = True
        proc, self._proc = self._proc, None
        stop_process(proc, grace)

    def kill(self) -> None:
        """SIGKILL the broker (for tests of recovery); ``supervise`` will restart it."""
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait()

    def restart(self) -> BrokerAddress:
        """Stop (if running) and start again on the same port."""
        self.stop()
        self._stopping = False
        self.restarts += 1
        return self.start()

    async def supervise(self) -> None:
        """Restart the broker whenever it exits unexpectedly, until ``stop()`` is called.

        Restarts back off (0.2 s doubling to 5 s); after 5 failures within a minute it gives up and
        raises BrokerError, so its owner can end with that reason instead of flapping.
        """
        failures: list[float] = []
        while not self._stopping:
            proc = self._proc
            if proc is None:
                return
            code = await asyncio.to_thread(proc.wait)
            if self._stopping or proc is not self._proc:
                continue
            now = time.monotonic()
            failures = [t for t in failures if now - t < 60] + [now]
            log.error("%s (pid %s) exited with %s:\n%s", self.engine, proc.pid, code, _tail(self.log_path))
            if len(failures) > _MAX_RESTARTS_PER_MINUTE:
                raise BrokerError(f"{self.engine} failed {len(failures)} times within a minute; giving up")
            await asyncio.sleep(min(5.0, 0.2 * 2 ** (len(failures) - 1)))
            self.restarts += 1
            try:
                await asyncio.to_thread(self.start)
            except BrokerError as exc:
                log.error("restarting %s failed: %s", self.engine, exc)

    def __enter__(self) -> ManagedBroker:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
