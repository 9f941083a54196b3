"""The amqtt fallback broker, run in its own process: ``python -m daemons.broker.amqtt_main CONFIG``.

amqtt is the pure-Python fallback used only where no mosquitto binary exists. Known gaps (see
shared/reference/mqtt.md): MQTT 3.1.1 only, TLS client certificates are optional, no packet size limit,
and our per-identity ACLs are not enforced by it (the daemons still check that every message's signed
sender owns its topic).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

__all__ = ["amqtt_config", "main"]


def amqtt_config(host: str, port: int, tls: dict[str, str] | None) -> dict[str, Any]:
    """The amqtt broker configuration for one listener."""
    listener: dict[str, Any] = {"type": "tcp", "bind": f"{host}:{port}", "max_connections": 0}
    if tls is not None:
        listener |= {
            "ssl": True,
            "cafile": tls["ca"],
            "certfile": tls["cert"],
            "keyfile": tls["key"],
        }
    return {
        "listeners": {"default": listener},
        "timeout_disconnect_delay": 0,
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }


async def _serve(config: dict[str, Any]) -> None:
    from amqtt.broker import Broker  # noqa: PLC0415 - optional dependency, only in this process

    broker = Broker(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await broker.start()
    try:
        await stop.wait()
    finally:
        await broker.shutdown()


def main(argv: list[str] | None = None) -> int:
    """Run the broker described by the JSON file given as the only argument."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m daemons.broker.amqtt_main CONFIG.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s amqtt %(levelname)s %(message)s")
    for noisy in ("amqtt", "transitions"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    config = json.loads(Path(args[0]).read_text())
    asyncio.run(_serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
