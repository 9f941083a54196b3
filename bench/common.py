"""Shared pieces of the benchmarks: timing, baselines measured in the same run, machine facts, tables."""

from __future__ import annotations

import os
import platform
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MB = 1_000_000


def best_of(fn: Callable[[], object], repeat: int = 5) -> float:
    """Best wall time of ``repeat`` calls (seconds)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def memcpy_rate(nbytes: int, repeat: int = 7) -> float:
    """Bytes per second of ``np.copyto`` between two warm buffers of ``nbytes``."""
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    return nbytes / best_of(lambda: np.copyto(dst, src), repeat)


def loopback_tcp_rate(nbytes: int, repeat: int = 5) -> float:
    """Bytes per second of ``sendall`` → ``recv_into`` over a 127.0.0.1 TCP connection."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    payload = memoryview(bytearray(nbytes))
    sink = bytearray(1 << 20)

    def receive(conn: socket.socket) -> None:
        left = nbytes
        while left:
            got = conn.recv_into(sink)
            if not got:
                return
            left -= got

    client = socket.create_connection(("127.0.0.1", port))
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn, _ = server.accept()
    times = []
    try:
        for _ in range(repeat):
            reader = threading.Thread(target=receive, args=(conn,))
            start = time.perf_counter()
            reader.start()
            client.sendall(payload)
            reader.join()
            times.append(time.perf_counter() - start)
    finally:
        client.close()
        conn.close()
        server.close()
    return nbytes / min(times)


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "numpy": np.__version__,
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except ImportError:
        info["device"] = "cpu"
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def print_table(title: str, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """Print ``rows`` as a fixed-width text table."""
    cells = [[_fmt(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print(f"\n{title}")
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)
