"""Contexts: named connections to a Swarm Network node, kept in ``$XDG_CONFIG_HOME/swci/contexts.json``.

A context points at an SN's API (its broker): by host and port (default 30304) or by a reverse-proxy
service ``fqdn[:port]`` (default 443). It also holds environment variables (``SET CONTEXT ENV``) that
swci reads before the process environment (``SWCI_RUN_TASK_MAX_WAIT_TIME`` ...). One context is the
current one; the file remembers which, so that ``swci -e`` calls carry on where the last one left.

The file::

    {"current": "demo",
     "contexts": {"demo": {"host": "sn1", "port": 30304, "service": null, "env": {"K": "v"}}}}

:func:`run_context_command` runs every context command except ``GET CONTEXT VERSION`` (which asks
the SN, see :mod:`swci.executor`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from daemons.bus.config import DEFAULT_PORT, BrokerAddress
from swci.commands import (
    Command,
    CreateContext,
    CreateContextService,
    GetContextEnv,
    GetContextInfo,
    ListContextEnv,
    ListContexts,
    SetContextEnv,
    SwitchContext,
)
from swci.output import Result, Table
from swci.paths import contexts_file
from swci.session import SessionState
from swci.tables import kv_table

__all__ = [
    "CONTEXT_COMMANDS",
    "DEFAULT_SERVICE_PORT",
    "Context",
    "ContextError",
    "ContextStore",
    "run_context_command",
    "service_address",
]

DEFAULT_SERVICE_PORT = 443
"""The port of a context given by service name, when the name has none."""

CONTEXT_COMMANDS: tuple[type[Command], ...] = (
    CreateContext,
    CreateContextService,
    SwitchContext,
    GetContextInfo,
    GetContextEnv,
    SetContextEnv,
    ListContextEnv,
    ListContexts,
)
"""The commands :func:`run_context_command` runs (locally, without the SN)."""


class ContextError(Exception):
    """A context that does not exist, or a contexts file that cannot be read or written."""


def service_address(service: str, *, tls: bool) -> BrokerAddress:
    """The broker address of a service name ``fqdn[:port]`` (default port 443)."""
    host, colon, port = service.rpartition(":")
    if colon and port.isdigit():
        return BrokerAddress(host, int(port), tls)
    return BrokerAddress(service, DEFAULT_SERVICE_PORT, tls)


@dataclass(frozen=True)
class Context:
    """One context: an SN's address (host and port, or a service) and environment variables."""

    name: str
    host: str | None = None
    port: int | None = None
    service: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    def broker(self, *, tls: bool = False) -> BrokerAddress:
        """``mqtt://host:port``, or ``mqtts://`` when ``tls`` (the process has an identity)."""
        if self.service is not None:
            return service_address(self.service, tls=tls)
        return BrokerAddress(self.host or "localhost", self.port or DEFAULT_PORT, tls)

    @property
    def endpoint(self) -> str:
        """How the context was given: ``IP host port`` or ``SERVICE fqdn[:port]``."""
        if self.service is not None:
            return f"SERVICE {self.service}"
        return f"IP {self.host} {self.port or DEFAULT_PORT}"

    def to_json(self) -> dict[str, Any]:
        """The context's entry in the contexts file."""
        return {"host": self.host, "port": self.port, "service": self.service, "env": dict(self.env)}

    @classmethod
    def from_json(cls, name: str, data: object) -> Context:
        """Read an entry of the contexts file.

        Raises:
            ContextError: the entry is not a valid context.
        """
        if not isinstance(data, dict):
            raise ContextError(f"context {name!r} is not a JSON object")
        env = data.get("env") or {}
        port = data.get("port")
        if not isinstance(env, dict) or (port is not None and not isinstance(port, int)):
            raise ContextError(f"context {name!r} has a bad 'env' or 'port'")
        host, service = data.get("host"), data.get("service")
        if (
            not isinstance(host, str | None)
            or not isinstance(service, str | None)
            or (host is None) == (service is None)
        ):
            raise ContextError(f"context {name!r} needs either a 'host' or a 'service'")
        return cls(name, host, port, service, {str(k): str(v) for k, v in env.items()})


@dataclass(frozen=True)
class _File:
    current: str | None
    contexts: dict[str, Context]


class ContextStore:
    """The contexts file; every call reads it afresh, so that several swci processes agree.

    Args:
        path: the JSON file (default ``$XDG_CONFIG_HOME/swci/contexts.json``).
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or contexts_file()

    def names(self) -> list[str]:
        """The context names, sorted."""
        return sorted(self._read().contexts)

    def all(self) -> list[Context]:
        """Every context, by name."""
        found = self._read().contexts
        return [found[name] for name in sorted(found)]

    def get(self, name: str) -> Context | None:
        """One context, or None."""
        return self._read().contexts.get(name)

    def require(self, name: str) -> Context:
        """One context; raises ContextError naming the known ones when there is none."""
        found = self.get(name)
        if found is None:
            known = ", ".join(self.names()) or "none yet"
            raise ContextError(
                f"no context {name!r} (known: {known}); CREATE CONTEXT {name} WITH IP <ip> first"
            )
        return found

    @property
    def current(self) -> str | None:
        """The name of the current context (None when none is set or it no longer exists)."""
        data = self._read()
        return data.current if data.current in data.contexts else None

    def put(self, context: Context) -> bool:
        """Add or replace a context (keeping its env vars); True if it is new."""
        data = self._read()
        old = data.contexts.get(context.name)
        if old is not None and not context.env:
            context = replace(context, env=old.env)
        data.contexts[context.name] = context
        self._write(data)
        return old is None

    def switch(self, name: str) -> Context:
        """Make a context the current one."""
        data = self._read()
        context = self.require(name)
        self._write(_File(name, data.contexts))
        return context

    def set_env(self, name: str, key: str, value: str) -> None:
        """Set an environment variable of a context."""
        context = self.require(name)
        self.put(replace(context, env={**context.env, key: value}))

    # ------------------------------------------------------------------ file
    def _read(self) -> _File:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return _File(None, {})
        except OSError as exc:
            raise ContextError(f"cannot read the contexts file {self.path}: {exc.strerror or exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ContextError(f"{self.path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
        return _parse(data, self.path)

    def _write(self, data: _File) -> None:
        payload = {
            "current": data.current,
            "contexts": {name: data.contexts[name].to_json() for name in sorted(data.contexts)},
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".contexts-", suffix=".json")
        except OSError as exc:
            raise ContextError(f"cannot write the contexts file {self.path}: {exc.strerror or exc}") from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(payload, out, indent=2)
                out.write("\n")
            os.replace(tmp, self.path)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise ContextError(f"cannot write the contexts file {self.path}: {exc.strerror or exc}") from None


def _parse(data: object, path: Path) -> _File:
    if not isinstance(data, dict) or not isinstance(data.get("contexts", {}), dict):
        raise ContextError(f"{path}: expected an object with 'current' and 'contexts'")
    contexts = {str(name): Context.from_json(str(name), entry) for name, entry in data["contexts"].items()}
    current = data.get("current")
    return _File(current if isinstance(current, str) else None, contexts)


# --- the commands ----------------------------------------------------------------------------------


def run_context_command(cmd: Command, store: ContextStore, session: SessionState, *, tls: bool) -> Result:
    """Run a context command (one of :data:`CONTEXT_COMMANDS`).

    Args:
        cmd: the command.
        store: the contexts file.
        session: ``SWITCH CONTEXT`` sets its ``context``.
        tls: whether connections use TLS (the process has an identity), for the broker addresses shown.
    """
    try:
        return _dispatch(cmd, store, session, tls)
    except ContextError as exc:
        return Result.failure(str(exc))


def _dispatch(cmd: Command, store: ContextStore, session: SessionState, tls: bool) -> Result:
    if isinstance(cmd, CreateContext):
        return _create(store, Context(cmd.name, host=cmd.host, port=cmd.port), tls)
    if isinstance(cmd, CreateContextService):
        return _create(store, Context(cmd.name, service=cmd.service), tls)
    if isinstance(cmd, SwitchContext):
        context = store.switch(cmd.name)
        session.context = context.name
        return Result.success(
            f"Switched to context {context.name} ({context.broker(tls=tls)})", data=context.name
        )
    if isinstance(cmd, GetContextInfo):
        return _info(store, cmd.name or _current(store, session), session, tls)
    if isinstance(cmd, GetContextEnv):
        return _get_env(store.require(cmd.context), cmd.env)
    if isinstance(cmd, SetContextEnv):
        store.set_env(cmd.context, cmd.env, cmd.value)
        return Result.success(f"{cmd.context}: {cmd.env} = {cmd.value}", data={cmd.env: cmd.value})
    if isinstance(cmd, ListContextEnv):
        context = store.require(cmd.context)
        table = Table.of(
            f"Environment of context {context.name}", ("Name", "Value"), sorted(context.env.items())
        )
        return Result.success(table=table, data=dict(context.env))
    if isinstance(cmd, ListContexts):
        return _list(store, session, tls)
    raise ContextError(f"{type(cmd).__name__} is not a context command")


def _current(store: ContextStore, session: SessionState) -> str:
    name = session.context or store.current
    if name is None:
        raise ContextError(
            "no context is active; CREATE CONTEXT <name> WITH IP <ip> and SWITCH CONTEXT <name>"
        )
    return name


def _create(store: ContextStore, context: Context, tls: bool) -> Result:
    created = store.put(context)
    verb = "created" if created else "updated"
    data = {"name": context.name, **context.to_json(), "broker": str(context.broker(tls=tls))}
    return Result.success(f"Context {context.name} {verb}: {context.broker(tls=tls)}", data=data)


def _info(store: ContextStore, name: str, session: SessionState, tls: bool) -> Result:
    context = store.require(name)
    active = name == (session.context or store.current)
    pairs: list[tuple[str, object]] = [
        ("NAME", context.name),
        ("ACTIVE", "yes" if active else "no"),
        ("HOST", context.host or ""),
        ("PORT", "" if context.service is not None else context.port or DEFAULT_PORT),
        ("SERVICE", context.service or ""),
        ("BROKER", str(context.broker(tls=tls))),
        ("ENV VARS", len(context.env)),
    ]
    data = {
        "name": context.name,
        "active": active,
        **context.to_json(),
        "broker": str(context.broker(tls=tls)),
    }
    return Result.success(table=kv_table(f"Context {context.name}", pairs), data=data)


def _get_env(context: Context, key: str) -> Result:
    if key not in context.env:
        return Result.failure(
            f"context {context.name!r} has no variable {key!r} (LIST CONTEXT ENV {context.name} shows them)"
        )
    return Result.success(context.env[key], data={key: context.env[key]})


def _list(store: ContextStore, session: SessionState, tls: bool) -> Result:
    active = session.context or store.current
    contexts = store.all()
    rows = [("*" if c.name == active else "", c.name, c.endpoint, str(c.broker(tls=tls))) for c in contexts]
    data = [{"name": c.name, "active": c.name == active, **c.to_json()} for c in contexts]
    return Result.success(
        table=Table.of("Contexts", ("Active", "Name", "Endpoint", "Broker"), rows), data=data
    )
