"""The tracer ``bench/chain.py`` puts on the ``PYTHONPATH`` of the SLs it starts (Python imports a
``sitecustomize`` module at start-up): in a ``swarm sl`` process, when ``SWARM_CHAIN_TRACE_DIR`` is set,
each coroutine of ``TRACED`` writes ``<CLOCK_MONOTONIC ns> <label>+`` when it starts and ``...-`` when it
ends into ``<dir>/<node name>-<pid>.txt`` (buffered: written out as the file's buffer fills, and at
exit). Any other process, and an SL without the variable, is left as it is.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import inspect
import os
import sys
import time
from collections.abc import Callable, Coroutine
from typing import IO, Any

# (module, class or None for a module-level function, coroutine, label)
TRACED = (
    ("daemons.sl.session", "MLSession", "_exchange", "request"),  # a program's sync, in its SL
    ("daemons.bus.transfer", "StateHolder", "add", "hash"),  # the node hashes its model
    ("daemons.sl.dataplane", "DataPlaneClient", "offer", "push"),  # its row to the predicted leader
    ("daemons.sl.dataplane", "DataPlaneClient", "fetch_result", "fetch"),  # the early merge, copied
    ("daemons.sl.dataplane", "DataPlaneServer", "_take_offer", "take"),  # a leader copies a pushed row
    ("daemons.sl.rounds", "RoundEngine", "_merge_early", "merge_early"),  # waits for the rows, merges
    ("daemons.sl.rounds", "RoundEngine", "_merge", "merge"),  # the merge and its manifest
    ("daemons.sl.dataplane", None, "_send_model", "hand_over"),  # a leader answers a fetch
    ("daemons.sl.dataplane", None, "_copy_file", "copy"),  # a model copied out of a peer's file, checked
    ("daemons.sl.local_server", "LocalServer", "_send", "answer"),  # the SL answers its program
)


def _stamped(fn: Callable[..., Coroutine[Any, Any, Any]], label: str, out: IO[str]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def traced(*args: Any, **kwargs: Any) -> Any:
        out.write(f"{time.monotonic_ns()} {label}+\n")
        try:
            return await fn(*args, **kwargs)
        finally:
            out.write(f"{time.monotonic_ns()} {label}-\n")

    return traced


def install(directory: str, name: str) -> None:
    """Wrap every coroutine of ``TRACED``, writing to ``<directory>/<name>-<pid>.txt``."""
    from daemons.cli import limit_blas_threads

    limit_blas_threads()  # what ``swarm`` does first, before anything loads numpy (these imports do)
    out = open(os.path.join(directory, f"{name}-{os.getpid()}.txt"), "w")  # noqa: SIM115 - open to the end
    atexit.register(out.close)
    for module_name, class_name, attribute, label in TRACED:
        module = importlib.import_module(module_name)
        owner: Any = module if class_name is None else getattr(module, class_name)
        static = isinstance(inspect.getattr_static(owner, attribute), staticmethod)
        wrapped = _stamped(getattr(owner, attribute), label, out)
        setattr(owner, attribute, staticmethod(wrapped) if static else wrapped)


def _node_name(argv: list[str]) -> str | None:
    """The ``--name`` of a ``swarm sl`` command line; None for any other process."""
    if len(argv) < 3 or os.path.basename(argv[0]) != "swarm" or argv[1] != "sl" or "--name" not in argv:
        return None
    index = argv.index("--name") + 1
    return argv[index] if index < len(argv) else None


_directory = os.environ.get("SWARM_CHAIN_TRACE_DIR")
_name = _node_name(sys.argv) if _directory else None
if _directory and _name:
    install(_directory, _name)
