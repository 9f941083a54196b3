"""Platform-independent parts of the ML-side library: the SL link and SwarmCallbackBase."""

from swarmlearning.client.swarm import SwarmCallbackBase, SwarmError, loopback_enabled

__all__ = ["SwarmCallbackBase", "SwarmError", "loopback_enabled"]
