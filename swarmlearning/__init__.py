"""The ML-side library: ``from swarmlearning.pyt import SwarmCallback`` works as in the reference system."""
