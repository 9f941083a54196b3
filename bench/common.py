"""Shared pieces of the benchmarks: timing, baselines measured in the same run, machine facts, tables."""

from __future__ import annotations

import argparse
import os
import platform
import socket
import subprocess
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


def bench_parser(description: str | None) -> argparse.ArgumentParser:
    """A benchmark's command line: ``--help`` says what it measures (the first paragraph of
    ``description``, its module docstring), and an argument it does not know stops it with a usage line
    rather than running it in full."""
    return argparse.ArgumentParser(description=(description or "").split("\n\n")[0].strip())


def positive_int(text: str) -> int:
    """An argparse type: a whole number above 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not above 0")
    return value


def chosen_names(
    description: str | None, what: str, known: Sequence[str], argv: Sequence[str] | None = None
) -> list[str]:
    """The ``what``s (rows, benchmarks) named on the command line, none meaning all (see
    ``bench_parser``); a name not in ``known`` stops the script with a usage line listing them."""
    parser = bench_parser(description)
    parser.add_argument(
        "names", nargs="*", metavar=what.upper(), help=f"one of {', '.join(known)} (default: all)"
    )
    names = list(parser.parse_args(argv).names)
    unknown = sorted(set(names) - set(known))
    if unknown:
        parser.error(f"no {what} {', '.join(unknown)}; the {what}s are {', '.join(known)}")
    return names


def quick_flag(description: str | None, quick_help: str) -> bool:
    """Whether ``--quick`` was given on the command line (see ``bench_parser``)."""
    parser = bench_parser(description)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    return bool(parser.parse_args().quick)


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
    info["mosquitto"] = _mosquitto_version()
    flwr = sorted((ROOT / "bench" / ".flower-venv").glob("lib/python*/site-packages/flwr-*.dist-info"))
    if flwr:
        info["flwr"] = "flwr " + flwr[-1].name.removeprefix("flwr-").removesuffix(".dist-info")
    return info


def _mosquitto_version() -> str:
    """``mosquitto X.Y.Z`` from its help text, or what is missing."""
    from daemons.broker.mosquitto import find_mosquitto

    binary = find_mosquitto()
    if binary is None:
        return "mosquitto missing"
    try:
        out = subprocess.run([str(binary), "-h"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "mosquitto ?"
    words = (out.stdout or out.stderr).split()
    return f"mosquitto {words[2]}" if len(words) > 2 and words[1] == "version" else "mosquitto ?"


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


ROW_KEYS = ("benchmark", "value", "unit", "baseline", "baseline_value", "ratio", "target", "note")


def make_row(
    benchmark: str,
    value: float,
    unit: str,
    baseline: str,
    baseline_value: float,
    *,
    target: str = "",
    note: str = "",
) -> dict[str, Any]:
    """One table row; ``ratio`` is always ``value / baseline_value``.

    ``target`` reads ``"ratio < 1.0"`` or ``"value >= 32"``: what it constrains, an operator, a number.
    """
    ratio = value / baseline_value if baseline_value else float("nan")
    return {
        "benchmark": benchmark,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_value": baseline_value,
        "ratio": ratio,
        "target": target,
        "note": note,
    }


def print_rows(title: str, rows: Sequence[dict[str, Any]]) -> None:
    """Print standard rows (``ROW_KEYS``, and ``met`` when the rows have it) as a text table."""
    columns = [*ROW_KEYS[:7], "met", "note"] if rows and "met" in rows[0] else list(ROW_KEYS)
    print_table(title, rows, columns)
