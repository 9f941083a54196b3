"""The SL's own directory: private, locked while its SL runs, removed when it ends, and removed by the next
SL that starts when its SL was killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from daemons.sl.workdir import remove_dead, sl_directory

ROOT = Path(__file__).resolve().parent.parent


def test_the_directory_of_a_running_sl_is_kept_and_removed_when_it_ends(tmp_path: Path) -> None:
    with sl_directory(tmp_path) as directory:
        assert directory.name.startswith("swarm-sl-") and (directory / ".alive").exists()
        assert directory.stat().st_mode & 0o777 == 0o700
        assert remove_dead(tmp_path) == []
    assert list(tmp_path.iterdir()) == []


def test_the_directory_of_a_killed_sl_is_removed_by_the_next(tmp_path: Path) -> None:
    script = (
        "import sys, time; from pathlib import Path; from daemons.sl.workdir import sl_directory\n"
        "with sl_directory(Path(sys.argv[1])) as d:\n"
        "    (d / 'weights-1').write_bytes(b'x' * 1000); print(d, flush=True); time.sleep(60)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert child.stdout is not None
        directory = Path(child.stdout.readline().strip())
        assert remove_dead(tmp_path) == [] and directory.exists()  # its SL runs
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        with sl_directory(tmp_path) as mine:
            assert not directory.exists()
            assert [p.name for p in tmp_path.iterdir()] == [mine.name]
    finally:
        child.kill()
        child.wait()


def test_a_directory_without_a_lock_is_removed_only_once_it_is_old(tmp_path: Path) -> None:
    fresh, old, other = tmp_path / "swarm-sl-fresh", tmp_path / "swarm-sl-old", tmp_path / "something-else"
    for directory in (fresh, old, other):
        directory.mkdir()
    (tmp_path / "swarm-sl-file").write_text("a file, not a directory")
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    os.utime(other, (an_hour_ago, an_hour_ago))
    assert remove_dead(tmp_path) == [old]  # an SL starting now makes its directory, then its lock
    assert fresh.exists() and other.exists() and (tmp_path / "swarm-sl-file").exists()
