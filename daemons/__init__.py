"""The actors (SN, SWOP, SL) and what they share: the bus, the managed broker, identities, the SN client.

It may import ``wire``, ``certs``, ``contracts`` and ``taskdefs``. An actor (``daemons.sn``,
``daemons.swop``, ``daemons.sl``) uses the shared modules and never another actor; only ``daemons.cli``
(the ``swarm`` command) imports them all.
"""
