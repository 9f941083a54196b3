"""Node liveness from retained presence: a node whose presence says ``offline`` (its will, or a clean
exit) is marked offline in the ledger; so is a node the ledger thinks online that shows no presence at
all for a grace period after the SN (re)connects (the broker lost its retained messages, say).

Presence carries the bus session; ``node.offline`` names it, and the ledger applies it only to the
node's registered session, so a second session of one node ending never takes the live one offline.
An ``offline`` will signed while its certificate was valid is believed after the certificate expired
(``offline_will``): a node's will is signed when it connects and published when its connection ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Container

from certs import Verifier
from contracts.ledger import Accepted, Ledger
from daemons.aio import raise_if_cancelling
from daemons.bus import Bus
from daemons.bus.endpoint import Message
from daemons.bus.topics import namespace_of
from daemons.sn.sealer import Outcome
from wire import CodecError, Envelope, VerifierLike, decode_envelope, verify_envelope

__all__ = ["Liveness", "offline_will"]

log = logging.getLogger("swarm.sn.liveness")

Submit = Callable[[str, dict[str, object]], Awaitable[Outcome]]


class Liveness:
    """Watches presence and submits ``node.offline`` for nodes that are gone."""

    def __init__(self, bus: Bus, ledger: Ledger, submit: Submit, *, grace: float = 15.0) -> None:
        self._bus = bus
        self._ledger = ledger
        self._submit = submit
        self._grace = grace
        self.online: dict[str, str] = {}  # uid -> session

    @staticmethod
    async def subscribe_ahead(bus: Bus) -> None:
        """Have ``bus`` hold the presence filter from now on (an SN of a cluster, at its start), so that
        the watch of a sealer it becomes sends no SUBSCRIBE: in the failover that makes it the sealer, a
        NATS cluster may have lost the leader of the session store a SUBSCRIBE writes, and the broker
        then drops the connection after 5 s."""
        async with bus.subscribe(bus.topics.presence(), keep=True):
            pass

    async def run(self) -> None:
        """Watch presence until cancelled."""
        topic = self._bus.topics.presence()
        # kept: a sealer that loses its lease and wins it again does not unsubscribe and subscribe
        async with (
            self._bus.subscribe(topic, maxsize=100_000, keep=True) as sub,
            asyncio.TaskGroup() as group,
        ):
            group.create_task(self._sweep_after_grace())
            async for message in sub:
                raise_if_cancelling()
                try:
                    env = self._bus.open(message)
                except CodecError as exc:
                    will = offline_will(message, self._bus.verifier, self._bus.refused)
                    if will is None:
                        log.warning("ignored a bad presence message: %s", exc)
                        continue
                    log.info("believed the offline will of %s, signed before: %s", will.sender, exc)
                    env = will
                if env.kind != "presence":
                    continue
                session = str(env.body.get("session") or "")
                if env.body.get("state") == "online":
                    self.online[env.sender] = session
                else:
                    if self.online.get(env.sender) == session:
                        del self.online[env.sender]
                    await self._mark_offline(env.sender, "its presence says offline", session)

    async def _sweep_after_grace(self) -> None:
        await asyncio.sleep(self._grace)
        for uid, node in list(self._ledger.state.nodes.items()):
            if uid != self._bus.uid and node.online and uid not in self.online:
                await self._mark_offline(uid, f"no presence for {self._grace:g} s")

    async def _mark_offline(self, uid: str, reason: str, session: str = "") -> None:
        node = self._ledger.state.nodes.get(uid)
        if node is None or not node.online or uid == self._bus.uid:
            return
        if session and node.session and session != node.session:
            log.info(
                "node %s: session %s ended; its live session %s stays online", uid, session, node.session
            )
            return
        with contextlib.suppress(Exception):
            body: dict[str, object] = {"uid": uid, "reason": reason, "session": session}
            result = await self._submit("node.offline", body)
            if not isinstance(result, Accepted):
                log.debug("node.offline %s not applied: %s", uid, result.reason)
            else:
                log.info("node %s is offline: %s", uid, reason)


def offline_will(message: Message, verifier: VerifierLike | None, refused: Container[str]) -> Envelope | None:
    """``message`` as an ``offline`` presence whose signature checks out at the time it was signed,
    though its certificate is no longer valid now (None: it is not one). Believed for this one claim,
    which only takes that node's session offline."""
    if not isinstance(verifier, Verifier):
        return None
    try:
        env = decode_envelope(message.payload, what=f"message on {message.topic}")
        if env.kind != "presence" or env.body.get("state") != "offline" or env.time > time.time():
            return None
        verify_envelope(env, Verifier(verifier.cas, clock=lambda: env.time))
    except CodecError:
        return None
    owner = namespace_of(message.topic)
    if env.identity in refused or (owner is not None and owner != (env.identity, env.sender)):
        return None
    return env
