"""The bus's small exception hierarchy; every error names the peer and what was asked."""

from __future__ import annotations

__all__ = ["BusConnectError", "BusError", "RemoteError", "RequestTimeout"]


class BusError(Exception):
    """Anything that went wrong on the bus."""


class BusConnectError(BusError):
    """The broker could not be reached or refused us; the message says which broker and why."""


class RequestTimeout(BusError):
    """No reply came in time."""

    def __init__(self, peer: str, method: str, corr: str, seconds: float) -> None:
        self.peer, self.method, self.corr, self.seconds = peer, method, corr, seconds
        super().__init__(
            f"no reply from {peer!r} to {method!r} within {seconds:g} s (request {corr[:8]}); "
            f"is {peer!r} running and connected to the same broker and network?"
        )


class RemoteError(BusError):
    """The peer answered with an error."""

    def __init__(self, peer: str, method: str, code: str, message: str) -> None:
        self.peer, self.method, self.code, self.message = peer, method, code, message
        super().__init__(message)
