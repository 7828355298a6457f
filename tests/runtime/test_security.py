"""What distfit exposes on the network (docs/deployment.md, distfit/runtime/security.py).

The local cluster distfit starts listens on loopback only (every listening socket of this
process and its worker processes, counted with psutil); an existing scheduler is reached over
TLS with the cluster's certificates (a real TLS cluster on this machine, Dask's
``Security.temporary()``), and over plain TCP only with ``--insecure``."""
from __future__ import annotations

import ipaddress
import os
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
import yaml
from distributed import Client, LocalCluster
from distributed.security import Security

from distfit.cli.main import main
from distfit.plan.job import run_plan
from distfit.runtime.cluster import connection_security, dask_client
from distfit.runtime.failures import ClusterError
from distfit.runtime.placement import Placement
from distfit.runtime.security import Transport, is_loopback, refusal, scheduler_address
from distfit.spec.parse import load_spec
from distfit.stores.plan import read_plan
from tests.reference import SMALL_SPEC


def error_lines(err: str) -> list[str]:
    """The ``distfit: error:`` lines of a command's stderr (progress lines come before)."""
    return [line for line in err.splitlines() if line.startswith("distfit: error:")]


def listening_addresses(process: psutil.Process) -> list[tuple[int, str, int]]:
    """``(pid, ip, port)`` of every listening inet socket of ``process`` and its descendants."""
    found = []
    for each in [process] + process.children(recursive=True):
        try:
            connections = each.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        found += [(each.pid, c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN]
    return found


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("spec") / "spec.yaml"
    path.write_text(yaml.safe_dump(SMALL_SPEC))
    return str(path)


@pytest.fixture(scope="module")
def serial_alpha(spec, tmp_path_factory) -> float:
    """The plan's alpha made in this process, without Dask: what every cluster must reproduce."""
    plan, _ = run_plan(load_spec(spec), str(tmp_path_factory.mktemp("serial") / "plan.zarr"),
                       placement=Placement(serial=True))
    return plan.alpha


@pytest.fixture(scope="module")
def local():
    """distfit's own local cluster, as every command starts it (``dask_client(None)``)."""
    with dask_client(None, workers=2) as client:
        yield client


def test_every_listener_of_the_local_cluster_is_on_loopback(local):
    """Scheduler, nannies, workers and the HTTP servers Dask runs beside them: all on loopback."""
    workers = set(local.run(os.getpid).values())
    assert len(workers) == 2 and workers <= {p.pid for p in psutil.Process().children(recursive=True)}
    sockets = listening_addresses(psutil.Process())
    pids = {pid for pid, _, _ in sockets}
    # this process: scheduler, its HTTP server and two nannies; each worker: itself and its HTTP server
    assert workers <= pids and len(sockets) >= 8
    outside = [s for s in sockets if not ipaddress.ip_address(s[1]).is_loopback]
    assert outside == [], f"listening beyond loopback: {outside}"
    assert local.scheduler.address.startswith("tcp://127.0.0.1:")


def test_the_local_cluster_serves_no_dashboard(local):
    """Decision (runtime.cluster.local_cluster): no dashboard; the scheduler's HTTP server (health,
    metrics) stays, on a free loopback port rather than Dask's 8787."""
    port = local.scheduler_info()["services"]["dashboard"]
    assert port != 8787
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy from the environment
    with direct.open(f"http://127.0.0.1:{port}/health", timeout=10) as response:
        assert response.status == 200
    with pytest.raises(urllib.error.HTTPError) as missing:
        direct.open(f"http://127.0.0.1:{port}/status", timeout=10)
    assert missing.value.code == 404


def test_plain_tcp_cluster_needs_insecure(local, spec, serial_alpha, tmp_path, capsys):
    """``--cluster tcp://...``: refused without --insecure (exit 2, one line saying how, nothing
    written), planned with it."""
    address = local.scheduler.address
    refused = tmp_path / "refused.zarr"
    assert main(["plan", spec, "--out", str(refused), "--cluster", address]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert line.startswith(f"distfit: error: --cluster {address}: plain tcp://")
    assert "--insecure" in line and "--tls-ca-file" in line
    assert not refused.exists() and not list(tmp_path.glob("refused.zarr*"))
    out = tmp_path / "plan.zarr"
    assert main(["plan", spec, "--out", str(out), "--cluster", address, "--insecure"]) == 0
    assert "over plain TCP (--insecure)" in capsys.readouterr().err
    assert read_plan(str(out)).attrs["alpha"] == pytest.approx(serial_alpha, rel=1e-9)


def write_pem(security: Security, directory: Path) -> dict[str, str]:
    """A ``Security.temporary()``'s CA, certificate and key as files (what a user is given)."""
    directory.mkdir()
    files = {"ca": security.tls_ca_file, "cert": security.tls_client_cert, "key": security.tls_client_key}
    for name, contents in files.items():
        (directory / f"{name}.pem").write_text(contents)
    return {name: str(directory / f"{name}.pem") for name in files}


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    """A real TLS cluster on this machine (a stand-in for a remote one): per-run certificates
    (``Security.temporary()``), one worker process; yields its address and the certificate files."""
    security = Security.temporary()
    pem = write_pem(security, tmp_path_factory.mktemp("tls") / "pem")
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, protocol="tls://", host="127.0.0.1",
                      security=security, dashboard_address=None, silence_logs=40) as cluster, \
            Client(cluster, security=security) as client:
        scheduler_file = tmp_path_factory.mktemp("tls") / "scheduler.json"
        client.write_scheduler_file(str(scheduler_file))
        yield cluster.scheduler_address, str(scheduler_file), pem


def test_a_plan_over_tls_with_the_cluster_s_certificates(tls_cluster, spec, serial_alpha, tmp_path, capsys):
    address, scheduler_file, pem = tls_cluster
    assert address.startswith("tls://127.0.0.1:")
    tls = ["--tls-ca-file", pem["ca"], "--tls-cert", pem["cert"], "--tls-key", pem["key"]]
    for cluster in (address, scheduler_file):  # by address and by scheduler file
        out = tmp_path / f"plan-{len(cluster)}.zarr"
        assert main(["plan", spec, "--out", str(out), "--cluster", cluster, *tls]) == 0
        assert f"connected to {cluster} over TLS" in capsys.readouterr().err
        assert read_plan(str(out)).attrs["alpha"] == pytest.approx(serial_alpha, rel=1e-9)


@pytest.mark.parametrize("flags", [[], ["--insecure"]])
def test_tls_without_certificates_is_refused(tls_cluster, spec, flags, tmp_path, capsys):
    """--insecure allows plain TCP; it does not make up for a TLS scheduler's missing certificates."""
    _, scheduler_file, _ = tls_cluster
    out = tmp_path / "plan.zarr"
    assert main(["plan", spec, "--out", str(out), "--cluster", scheduler_file, *flags]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert "tls:// needs the cluster's certificates" in line and "--tls-cert" in line
    assert not out.exists()


def test_certificates_of_another_ca_do_not_get_in(tls_cluster, tmp_path):
    """Dask's TLS is mutual: a client whose certificate the cluster's CA did not sign is turned
    away (and its own CA does not vouch for the scheduler)."""
    address, _, _ = tls_cluster
    other = write_pem(Security.temporary(), tmp_path / "other")
    with pytest.raises(ClusterError, match="cannot reach the scheduler"):
        with dask_client(address, timeout=2, transport=Transport(other["ca"], other["cert"], other["key"])):
            pass


# --------------------------------------------------------------------------------------------
# the rule and the user's choice, without a cluster


def test_refusal_names_the_way_out_in_one_line():
    assert refusal("tls://h:8786", "tls://h:8786", insecure=False, certificates=True) is None
    assert refusal("h:8786", "h:8786", insecure=True, certificates=False) is None  # no scheme: Dask's tcp
    assert refusal("inproc://x", "inproc://x", insecure=False, certificates=False) is None
    for address in ("tcp://h:8786", "h:8786", "ws://h:8786", "ucx://h:8786"):
        message = refusal(address, address, insecure=False, certificates=False)
        assert message and "\n" not in message and "--insecure" in message and "--tls-ca-file" in message
    message = refusal("sched.json", "tls://10.0.0.1:8786", insecure=True, certificates=False)
    assert message.startswith("--cluster sched.json (scheduler tls://10.0.0.1:8786): tls:// needs")


def test_a_scheduler_file_is_read_for_its_address(tmp_path):
    path = tmp_path / "scheduler.json"
    path.write_text('{"type": "Scheduler", "address": "tls://10.1.2.3:8786"}')
    assert scheduler_address(str(path)) == "tls://10.1.2.3:8786"
    assert scheduler_address("tcp://h:1") == "tcp://h:1"
    path.write_text("{not json")
    assert scheduler_address(str(path)) is None


def test_connection_security_carries_the_files_and_requires_encryption(tmp_path):
    pem = write_pem(Security.temporary(), tmp_path / "pem")
    security = connection_security("tls://h:1", Transport(pem["ca"], pem["cert"], pem["key"]))
    assert security.require_encryption
    assert (security.tls_ca_file, security.tls_client_cert, security.tls_client_key) == (pem["ca"], pem["cert"], pem["key"])
    assert not connection_security("tcp://h:1", Transport(insecure=True)).require_encryption
    with pytest.raises(ClusterError, match="plain tcp://"):
        connection_security("tcp://h:1", Transport())


@pytest.mark.parametrize("kwargs, message", [
    ({"cert": "c.pem"}, "--tls-ca-file, --tls-cert and --tls-key go together"),
    ({"ca_file": "ca.pem"}, "--tls-ca-file, --tls-cert and --tls-key go together"),
    ({"key": "k.pem"}, "--tls-ca-file, --tls-cert and --tls-key go together"),
    ({"ca_file": "ca.pem", "cert": "c.pem", "insecure": True}, "--insecure excludes"),
    ({"ca_file": "missing.pem", "cert": "c.pem"}, "--tls-ca-file missing.pem: no such file"),
])
def test_bad_tls_options_are_one_line(kwargs, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ca.pem").write_text("x")
    (tmp_path / "c.pem").write_text("x")
    with pytest.raises(ValueError) as raised:
        Transport(**kwargs)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_tls_options_are_for_a_cluster(tmp_path, capsys):
    out = tmp_path / "plan.zarr"
    assert main(["plan", "spec.yaml", "--out", str(out), "--insecure"]) == 2
    assert capsys.readouterr().err == ("distfit: error: --tls-ca-file, --tls-cert, --tls-key and --insecure are for "
                                       "--cluster (a scheduler distfit does not start)\n")
    assert not out.exists()


def test_a_job_s_own_local_cluster_is_reached_over_loopback_tcp():
    """Placement.at: the stages of a job reach the local cluster it started (plain TCP on
    loopback, its own choice); any other address keeps the user's transport."""
    assert Placement(workers=2).at("tcp://[::1]:9").transport == Transport(insecure=True, own=True)
    assert Placement(workers=2).at("tcp://10.0.0.5:9").transport == Transport()
    given = Placement(cluster="tcp://h:1", transport=Transport(insecure=True))
    assert given.at("tcp://h:1") is given
    assert [is_loopback(a) for a in ("tcp://127.0.0.1:1", "tcp://[::1]:1", "tls://localhost:1", "tcp://0.0.0.0:1",
                                     "tcp://10.0.0.1:1", "tcp://example.org:1")] == [True, True, True, False, False, False]
