"""The swarm bus: MQTT sessions, topics, request/reply and state transfer."""

from daemons.bus.config import DEFAULT_PORT, BrokerAddress, BusConfig
from daemons.bus.errors import BusConnectError, BusError, RemoteError, RequestTimeout
from daemons.bus.rpc import Request, RpcError
from daemons.bus.session import Bus, Message, Subscription
from daemons.bus.topics import Topics, topic_matches

__all__ = [
    "DEFAULT_PORT",
    "BrokerAddress",
    "Bus",
    "BusConfig",
    "BusConnectError",
    "BusError",
    "Message",
    "RemoteError",
    "Request",
    "RequestTimeout",
    "RpcError",
    "Subscription",
    "Topics",
    "topic_matches",
]
