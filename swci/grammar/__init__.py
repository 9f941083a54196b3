"""The SWCI command language, one module per command family.

Importing this package registers every command in :data:`REGISTRY`.
"""

from __future__ import annotations

from swci.grammar import contexts, contracts, identities, session, taskrunners, tasks, trials, watching
from swci.registry import REGISTRY

__all__ = ["REGISTRY"]

_FAMILIES = (contexts, contracts, tasks, taskrunners, session, identities, watching, trials)
