"""The reference's commands: ``run-sn``, ``run-swop``, ``run-swci``, ``run-sl``, ``stop-swarm``, ``gen-cert``.

Thin wrappers over ``swarm sn|swop|sl``, ``swci`` and the PKI that take the options of HPE Swarm
Learning's ``scripts/bin`` scripts, so that its README steps run unchanged. Container-only options are
accepted and explained in one line; ``-d`` runs a node in the background with its log and pid in the
state directory (``$SWARM_STATE_DIR``, default ``~/.local/state/open-swarm``), where ``stop-swarm``
finds it. It may import ``certs``, ``daemons`` (only ``daemons.cli``, to check arguments) and ``swci``;
nothing imports it.
"""
