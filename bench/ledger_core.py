"""Ledger core benchmark: sealing throughput with signature checks, and open + verify + replay time.

The workload is a training contract at work: 8 SL nodes check in to every round, the SN closes it,
its leader merges, and every node reports its progress (18 transactions a round). Every envelope is
signed by its sender; sealing verifies each one. The baseline measured in the same run is decoding and
verifying the same envelopes without the ledger, so the ratio shows what the ledger itself costs.

    .venv/bin/python bench/ledger_core.py [n_tx] [batch]
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_parser, make_row, positive_int
from contracts.ledger import Accepted, Ledger
from contracts.machine import DEFAULT_CONTRACT
from contracts.rounds import leader_order
from wire.envelope import SignerLike, VerifierLike, decode_envelope, encode_envelope, make_envelope

C = DEFAULT_CONTRACT
N_SL = 8
Keys = tuple[str, Callable[[str, str], SignerLike], VerifierLike]


@contextmanager
def _keys(folder: Path) -> Iterator[Keys]:
    """Signers and a verifier: ``certs.signing`` (X.509, ECDSA) when importable, else dev keys."""
    try:
        from certs.pki import create_ca, issue_identity
        from certs.signing import Signer, Verifier
    except ImportError:
        from contracts.devkeys import DevAuthority

        authority = DevAuthority("bench")
        yield (
            "contracts.devkeys (Ed25519, certs.signing not importable)",
            authority.issue,
            authority.verifier(),
        )
        return
    ca = create_ca(folder)

    def issue(uid: str, role: str) -> SignerLike:
        files = issue_identity(ca.cert.parent, uid, role, folder)
        return Signer.from_files(files.cert, files.key)

    yield "certs.signing (X.509, ECDSA P-256)", issue, Verifier.from_ca(ca.cert)


def _env(signer: SignerLike, kind: str, body: dict[str, Any]) -> bytes:
    return encode_envelope(
        make_envelope("tx:" + kind, body, sender=signer.uid, role=signer.role, signer=signer)
    )


def _round(sls: list[SignerLike], sn: SignerLike, number: int) -> list[bytes]:
    uids = sorted(s.uid for s in sls)
    by_uid = {s.uid: s for s in sls}
    out = [
        _env(s, "round.checkin", {"contract": C, "digest": f"{number:08x}{i:056x}"})
        for i, s in enumerate(sls)
    ]
    out.append(_env(sn, "round.close", {"contract": C, "round": number}))
    leader = by_uid[leader_order(C, number, uids)[0]]
    merged = {"contract": C, "round": number, "digest": f"{number:064x}", "contributors": uids}
    out.append(_env(leader, "round.merged", merged))
    progress = {
        "contract": C,
        "epochs_done": number,
        "total_epochs": 10**6,
        "loss": 1.0 / number,
        "metric": 0.5,
    }
    out += [_env(s, "contract.progress", progress) for s in sls]
    return out


def workload(n_tx: int, sls: list[SignerLike], sn: SignerLike) -> list[bytes]:
    """About ``n_tx`` signed envelopes: registrations and joins, then whole rounds."""
    params = {"min_peers": N_SL, "quorum_wait": 0.0, "leader_timeout": 600.0}
    out = [_env(s, "node.register", {"host": "bench"}) for s in sls]
    out += [_env(s, "contract.join", {"contract": C, "params": params}) for s in sls]
    number = 1
    while len(out) < n_tx:
        out += _round(sls, sn, number)
        number += 1
    return out[:n_tx]


def _seal_all(ledger: Ledger, envelopes: list[bytes], batch: int, sn: SignerLike) -> int:
    accepted = 0
    for start in range(0, len(envelopes), batch):
        result = ledger.seal(envelopes[start : start + batch], sealer=sn, sealer_uid=sn.uid, now=time.time())
        accepted += sum(isinstance(r, Accepted) for r in result.results)
    return accepted


def _verify_only(envelopes: list[bytes], verifier: VerifierLike) -> float:
    started = time.perf_counter()
    for raw in envelopes:
        decode_envelope(raw, verifier=verifier)
    return time.perf_counter() - started


@dataclass(frozen=True)
class ChainTimings:
    """What sealing a workload into a new chain and reopening it took."""

    n_tx: int
    blocks: int
    verify_s: float  # decoding + verifying the same envelopes alone (the baseline)
    seal_s: float
    open_s: float
    mib: float


def seal_and_reopen(
    path: Path, sn: SignerLike, sls: list[SignerLike], verifier: VerifierLike, n_tx: int, batch: int
) -> ChainTimings:
    """Seal ``n_tx`` signed transactions into a new chain at ``path`` in blocks of ``batch``, reopen it."""
    envelopes = workload(n_tx, sls, sn)
    verify_s = _verify_only(envelopes, verifier)
    ledger = Ledger.create(path, sealer=sn, sealer_uid=sn.uid, verifier=verifier, now=time.time())
    started = time.perf_counter()
    accepted = _seal_all(ledger, envelopes, batch, sn)
    seal_s = time.perf_counter() - started
    height = ledger.height
    ledger.close()
    assert accepted == len(envelopes), f"only {accepted} of {len(envelopes)} accepted"
    started = time.perf_counter()
    with Ledger.open(path, verifier=verifier) as reopened:
        open_s = time.perf_counter() - started
        assert reopened.height == height
    return ChainTimings(len(envelopes), height + 1, verify_s, seal_s, open_s, path.stat().st_size / 2**20)


def measure(n_tx: int = 100_000, batch: int = 200) -> dict[str, Any]:
    """Seal ``n_tx`` signed transactions in blocks of ``batch``, then reopen the chain."""
    with tempfile.TemporaryDirectory() as tmp, _keys(Path(tmp)) as (keys, issue, verifier):
        sn = issue("sn-1", "sn")
        sls = [issue(f"sl-{i}", "sl") for i in range(1, N_SL + 1)]
        t = seal_and_reopen(Path(tmp) / "ledger.db", sn, sls, verifier, n_tx, batch)
        return {
            "keys": keys,
            "n_tx": t.n_tx,
            "batch": batch,
            "blocks": t.blocks,
            "chain_mib": round(t.mib, 1),
            "seal_s": round(t.seal_s, 3),
            "seal_tx_per_s": round(t.n_tx / t.seal_s),
            "verify_only_tx_per_s": round(t.n_tx / t.verify_s),
            "seal_vs_verify_only": round(t.verify_s / t.seal_s, 3),
            "open_s": round(t.open_s, 3),
            "open_tx_per_s": round(t.n_tx / t.open_s),
        }


def run(n_tx: int = 100_000, batch: int = 200) -> list[dict[str, Any]]:
    """Table rows: sealing throughput and reopening time, each against verifying the same signatures."""
    r = measure(n_tx, batch)
    n = r["n_tx"]
    verify_s = n / r["verify_only_tx_per_s"]
    note = f"{r['keys']}; {r['blocks']:,} blocks, chain {r['chain_mib']} MiB"
    return [
        make_row(
            f"ledger: seal {n:,} signed tx (blocks of {batch})", r["seal_tx_per_s"], "tx/s",
            "decode + verify the same envelopes alone", r["verify_only_tx_per_s"],
            target="value >= 1000", note=note,
        ),
        make_row(
            f"ledger: open + verify + replay {n:,} tx", r["open_s"], "s",
            "decode + verify the same envelopes alone", verify_s, target="value < 5", note=note,
        ),
    ]  # fmt: skip


def main() -> None:
    """Print the numbers against their targets (>= 1,000 tx/s sealed; open < 5 s for 100,000 tx)."""
    parser = bench_parser(__doc__)
    parser.add_argument(
        "transactions",
        nargs="?",
        type=positive_int,
        default=100_000,
        help="how many transactions to seal (default %(default)s)",
    )
    parser.add_argument(
        "batch",
        nargs="?",
        type=positive_int,
        default=200,
        help="transactions per block (default %(default)s)",
    )
    args = parser.parse_args()
    n_tx, batch = args.transactions, args.batch
    result = measure(n_tx, batch)
    print(f"signatures: {result['keys']}")
    print(f"sealed {result['n_tx']:,} transactions in {result['blocks']:,} blocks of up to {batch}")
    print(
        f"  seal: {result['seal_tx_per_s']:,} tx/s with signature verification (target >= 1,000); "
        f"{result['seal_vs_verify_only']:.2f}x the speed of verifying alone "
        f"({result['verify_only_tx_per_s']:,} tx/s)"
    )
    print(
        f"  open + verify chain + replay: {result['open_s']:.2f} s ({result['open_tx_per_s']:,} tx/s; "
        f"target < 5 s for 100,000), chain {result['chain_mib']} MiB"
    )


if __name__ == "__main__":
    main()
