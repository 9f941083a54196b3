"""A swarm over several hosts (network namespaces): an SN host, two SWOP hosts with their own
certificates and SL nodes, and a swci host; every daemon on its host's address."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.multihost_setup import (
    DAEMON,
    SN_PORT,
    Pki,
    final_digests,
    start_sn,
    start_swop,
    swci_script,
    wait_for_line,
    write_profile,
)
from tests.netns import hosts_or_skip

pytestmark = [pytest.mark.multihost, pytest.mark.slow]


def test_a_swarm_trains_across_hosts_with_their_own_certificates(tmp_path: Path) -> None:
    with hosts_or_skip() as net:
        sn_host, swop1_host, swop2_host, swci_host = (net.add(n) for n in ("sn", "swop1", "swop2", "swci"))
        pki = Pki(tmp_path / "pki")
        start_sn(sn_host, tmp_path, pki.issue("sn-1", "sn", sn_host.address))
        broker = f"mqtts://{sn_host.address}:{SN_PORT}"
        env = {"MIN_PEERS": 4, "EPOCHS": 2, "BATCHES": 8}
        for host, swop, sls in (
            (swop1_host, "swop-1", ("sl-1", "sl-2")),
            (swop2_host, "swop-2", ("sl-3", "sl-4")),
        ):
            idents = [(sl, pki.issue(sl, "sl", host.address)) for sl in sls]
            profile = write_profile(tmp_path, swop, idents, env)
            proc = start_swop(host, tmp_path, swop, profile, broker, pki.issue(swop, "swop", host.address))
            wait_for_line(tmp_path / f"{swop}.out", "listening on taskrunner", proc)

        script = swci_script(tmp_path, sn_host.address, SN_PORT, 4)
        swci = pki.issue("swci-1", "swci", swci_host.address)
        done = swci_host.run(
            [sys.executable, "-m", "swci.main", "--init-script", str(script), *swci.args()], 240
        )
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        assert "COMPLETE" in done.stdout, done.stdout[-3000:]
        digests = final_digests(tmp_path)
        assert sorted(digests) == ["sl-1", "sl-2", "sl-3", "sl-4"], digests
        assert len(set(digests.values())) == 1 and all(digests.values()), digests

        # every daemon talked over the test subnet: the SN's broker listens on its host's address only
        listening = sn_host.run(["ss", "-ltn"]).stdout
        assert f"{sn_host.address}:{SN_PORT}" in listening and f"127.0.0.1:{SN_PORT}" not in listening

        # a host whose certificate comes from another CA is refused by the broker, with a clear reason
        stranger = Pki(tmp_path / "other-pki").issue("swop-9", "swop", swop2_host.address)
        profile = write_profile(tmp_path / "stranger", "swop-9", [("sl-9", None)], env)
        refused = swop2_host.run(
            [*DAEMON, "swop", "--uid", "swop-9", "--profile", str(profile), "--broker", broker,
             "--work-dir", str(tmp_path / "stranger" / "work"), *stranger.args()],
            timeout=60,
        )  # fmt: skip
        assert refused.returncode != 0
        assert "certificate" in refused.stderr.lower() and "ca" in refused.stderr.lower(), refused.stderr[
            -2000:
        ]
