"""The ledger: a pure, deterministic state machine and its hash-chained block store (docs/ledger.md).

``machine.apply(state, tx)`` gives the next state or a ``Rejection``; ``ledger.Ledger`` seals envelopes
into blocks in SQLite (``blockstore``), verifies the chain when opened and replays it; ``views.query``
answers the reads of the swci shell. ``rounds``, ``tasks``, ``taskrunners``, ``nodes``, ``training`` and
``trials`` hold the rules of each kind of entity, ``state`` and ``tx`` their data.

Import from those modules: the package imports nothing itself, so that an SL, which needs only the
round rules (``rounds``) and the block reader (``history``), starts without the ledger, SQLite and
the task-definition checks.

It may import ``wire`` and ``taskdefs`` (to check task bodies), never an actor: it runs anywhere.
"""
