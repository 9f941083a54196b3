"""The ML-side library: ``from swarmlearning.pyt import SwarmCallback`` works as in the reference system.

It runs inside the user's training process, so it may import ``wire`` and nothing else of the project
(never ``daemons``): it talks to its SL over a local socket.
"""
