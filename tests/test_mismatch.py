"""Mismatched TLS and profiles say what is wrong, in one line, without a traceback.

A client without certificates against an SN with them (and the reverse), from swci, ``swarm sl`` and
``swarm swop``; and ``swarm swop``'s start checks of its profile's files and certificates.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from certs import init_swarm, issue_identity
from daemons.bus.session import NEEDS_CERTIFICATES
from daemons.identity import Identity
from daemons.swop.checks import ProfileCheckError, check_profile
from taskdefs import load_swop_profile
from tests.conftest import RunningSN, start_sn

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    init_swarm(root, sl=2)
    return root


@pytest.fixture(scope="module")
def secure_sn(tmp_path_factory: pytest.TempPathFactory, pki: Path) -> Iterator[RunningSN]:
    ids = [
        "--cert",
        str(pki / "sn-1-cert.pem"),
        "--key",
        str(pki / "sn-1-key.pem"),
        "--capath",
        str(pki / "ca"),
    ]
    node = start_sn(tmp_path_factory.mktemp("sn") / "sn", extra=ids)
    yield node
    node.stop()


def _run(*argv: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def _one_clear_line(result: subprocess.CompletedProcess[str], wanted: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert wanted in output, output
    assert "Traceback" not in output, output


def test_swci_without_certificates_against_an_mtls_sn(secure_sn: RunningSN, tmp_path: Path) -> None:
    lines = [f"CREATE CONTEXT s WITH IP 127.0.0.1 {secure_sn.port}", "SWITCH CONTEXT s", "LIST CONTRACTS"]
    result = _run("swci.main", *(arg for line in lines for arg in ("-e", line)), cwd=tmp_path)
    _one_clear_line(result, NEEDS_CERTIFICATES)


def test_an_sl_without_certificates_against_an_mtls_sn(secure_sn: RunningSN, tmp_path: Path) -> None:
    argv = ["daemons.cli", "sl", "--name", "sl-1", "--sn-api-port", str(secure_sn.port)]
    result = _run(
        *argv, "--ml-cmd", "x.py", "--ml-w", str(tmp_path), "--run-dir", str(tmp_path / "r"), cwd=tmp_path
    )
    _one_clear_line(result, NEEDS_CERTIFICATES)


def test_a_client_with_certificates_against_a_plain_sn(sn: RunningSN, pki: Path, tmp_path: Path) -> None:
    ids = [
        "--cert",
        str(pki / "swci-1-cert.pem"),
        "--key",
        str(pki / "swci-1-key.pem"),
        "--capath",
        str(pki / "ca"),
    ]
    result = _run("swci.main", *ids, "-e", f"WAIT FOR IP 127.0.0.1 {sn.port} 0", cwd=tmp_path)
    _one_clear_line(result, "does this SN run without certificates?")


# --- swarm swop's start checks ---------------------------------------------------------------------

PROFILE = """\
groupname: g
taskrunner: defaulttaskbb.taskdb.sml.hpe
policyuri: ~
resourcemgr: {{mgrtype: DOCKER, accessinfo: {{accesstype: FROMENV}}}}
network: n
apls: {{locator: {{host: 127.0.0.1, port: ~}}}}
apisrv: {{locator: {{host: 127.0.0.1, port: {port}, service: ~}}}}
envvars: ~
nodes:
{nodes}
"""
NODE = """\
  - slnodedef:
      idx: {idx}
      identity: {identity}
      slhostname: {name}
      privatedata: {{src: "{data}", mType: BIND}}
      slenvvars: ~
      usrhostname: u{idx}
      usrenvvars: ~
"""


def _identity(pki: Path, uid: str) -> str:
    attrs = [("KEY", f"{uid}-key.pem"), ("CERT", f"{uid}-cert.pem"), ("CAPATH", "ca")]
    return "[" + ", ".join(
        f'{{attribute: {{aType: {kind}, mType: BIND, src: "{pki / name}", tgt: /c/{name}, subPath: ~}}}}'
        for kind, name in attrs
    ) + "]"  # fmt: skip


def _profile(tmp_path: Path, nodes: list[tuple[str, str, Path]], port: int = 30304) -> Path:
    text = PROFILE.format(
        port=port,
        nodes="".join(
            NODE.format(idx=i, name=name, identity=identity, data=data)
            for i, (name, identity, data) in enumerate(nodes)
        ),
    )
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    return path


def _check(path: Path, identity: Identity | None) -> None:
    check_profile(load_swop_profile(path), path, "swop-1", identity)


def test_a_fitting_profile_passes(pki: Path, tmp_path: Path) -> None:
    nodes = [(f"sl-{i}", _identity(pki, f"sl-{i}"), tmp_path) for i in (1, 2)]
    swop = Identity.load(pki / "swop-1-cert.pem", pki / "swop-1-key.pem", pki / "ca")
    _check(_profile(tmp_path, nodes), swop)
    _check(_profile(tmp_path, [("sl1", "[]", tmp_path)]), None)


def test_missing_files_and_unfit_certificates_are_all_named(pki: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    init_swarm(other, sn=0, swop=0, sl=1, swci=0)  # another swarm's CA
    issue_identity(pki / "ca", "sl-9", "swci", pki)  # right CA, wrong role
    nodes = [
        ("sl-1", _identity(pki, "sl-1"), tmp_path / "no-such-data"),
        ("sl-2", _identity(pki, "sl-1"), tmp_path),  # sl-1's certificate shared by sl-2: fine
        ("sl-3", "[]", tmp_path),
        ("sl-4", _identity(other, "sl-1").replace(str(other / "ca"), str(pki / "ca")), tmp_path),
        ("sl-9", _identity(pki, "sl-9"), tmp_path),
    ]
    swop = Identity.load(pki / "swop-1-cert.pem", pki / "swop-1-key.pem", pki / "ca")
    with pytest.raises(ProfileCheckError) as caught:
        _check(_profile(tmp_path, nodes), swop)
    lines = str(caught.value).splitlines()
    assert "node idx 0 (sl-1): privatedata src" in lines[1] and "does not exist" in lines[1]
    assert "node idx 2 (sl-3)" in lines[2] and "needs an identity with KEY, CERT and CAPATH" in lines[2]
    assert "node idx 3 (sl-4)" in lines[3] and "not issued by the CA" in lines[3]
    assert "node idx 4 (sl-9)" in lines[4] and "role 'swci', not 'sl'" in lines[4]
    assert len(lines) == 5
    with pytest.raises(ProfileCheckError, match="runs without certificates"):
        _check(_profile(tmp_path, [("sl-1", _identity(pki, "sl-1"), tmp_path)]), None)


def test_swarm_swop_refuses_such_a_profile_at_start(tmp_path: Path) -> None:
    path = _profile(tmp_path, [("sl1", "[]", tmp_path / "gone")])
    result = _run(
        "daemons.cli", "swop", "--profile", str(path), "--work-dir", str(tmp_path / "w"), cwd=tmp_path
    )
    _one_clear_line(result, "privatedata src")
    assert "node idx 0 (sl1)" in result.stderr
