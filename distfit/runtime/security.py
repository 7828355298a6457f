"""How distfit reaches a Dask scheduler it did not start (docs/deployment.md).

A Dask scheduler runs whatever its clients submit on its workers, and the tasks carry the data
(unit histograms, microdata marginals) and the release's noise. Over plain TCP anyone who can
reach the scheduler's port can submit code, and anyone on the path can read the traffic. So a
connection to an existing scheduler (``--cluster ADDRESS|FILE``) goes over TLS by default, with
Dask's mutual authentication: the scheduler and distfit each show a certificate signed by the
cluster's CA (``distributed.security.Security``; ``--tls-ca-file``, ``--tls-cert``,
``--tls-key``, or ``distributed.comm.tls`` in the Dask config). Plain TCP is refused unless
``--insecure`` says so. The local cluster distfit starts itself listens on 127.0.0.1 only and
speaks plain TCP there (``distfit.runtime.cluster.local_cluster``): that choice is the job's,
not the user's, and :meth:`distfit.runtime.placement.Placement.at` records it.

This module holds the rule and the user's choice (:class:`Transport`); the Dask objects are
made in :mod:`distfit.runtime.cluster`. It is light (no Dask): the command line imports it for
every command.
"""
from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass

__all__ = ["Transport", "scheduler_address", "scheme_of", "is_loopback", "refusal"]

#: Dask comm schemes that encrypt and authenticate (``tls://`` and TLS websockets).
ENCRYPTED_SCHEMES = frozenset({"tls", "wss"})
#: Dask's scheme for an address without one (``distributed.comm.default-scheme``).
DEFAULT_SCHEME = "tcp"
TLS_FLAGS = "--tls-ca-file, --tls-cert and --tls-key"


@dataclass(frozen=True)
class Transport:
    """How to reach an existing scheduler: the client's TLS files (``ca_file``: the cluster's
    CA certificate; ``cert``/``key``: distfit's certificate and key, signed by that CA; ``key``
    may be left out when it is in the ``cert`` file, as Dask allows) and ``insecure`` (plain
    TCP allowed). No files: Dask's configuration (``distributed.comm.tls.ca-file``,
    ``.client.cert``, ``.client.key``) supplies them, if it has them.

    Made valid or not at all (ValueError, one line naming the flag): the CA and the certificate
    come together, a key needs a certificate, every file exists, and ``insecure`` excludes the
    files (asking for TLS and for plain TCP at once has no one meaning)."""

    ca_file: str | None = None
    cert: str | None = None
    key: str | None = None
    insecure: bool = False
    own: bool = False  # the job's own local cluster (Placement.at): loopback, plain TCP, no dashboard

    def __post_init__(self) -> None:
        for name in ("ca_file", "cert", "key"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, os.fspath(value))
        if self.insecure and self.files:
            raise ValueError(f"--insecure excludes {TLS_FLAGS}")
        if (self.ca_file is None) != (self.cert is None) or (self.key is not None and self.cert is None):
            raise ValueError(f"{TLS_FLAGS} go together (--tls-key may be left out when the key is in "
                             "the --tls-cert file)")
        for flag, path in (("--tls-ca-file", self.ca_file), ("--tls-cert", self.cert), ("--tls-key", self.key)):
            if path is not None and not os.path.isfile(path):
                raise ValueError(f"{flag} {path}: no such file")

    @property
    def files(self) -> bool:
        """Whether TLS files are given (else Dask's configuration is asked)."""
        return self.cert is not None

    @property
    def default(self) -> bool:
        """Whether nothing was chosen (no files, not insecure)."""
        return not self.files and not self.insecure

    def flags(self) -> list[str]:
        """The ``distfit`` command-line flags that give this transport (a launcher that runs
        ``distfit ... --cluster`` as a command: cluster/jobqueue_run.py)."""
        given = (("--tls-ca-file", self.ca_file), ("--tls-cert", self.cert), ("--tls-key", self.key))
        return [part for flag, path in given if path is not None for part in (flag, path)] + (
            ["--insecure"] if self.insecure else [])


def scheduler_address(cluster: str) -> str | None:
    """The address ``cluster`` (a ``--cluster`` value) names: the ``address`` of a scheduler
    file (a path that exists: ``distfit.runtime.cluster.dask_client``'s rule), else the value
    itself. None for a scheduler file that cannot be read (connecting to it then fails with
    Dask's own message)."""
    if not os.path.exists(cluster):
        return cluster
    try:
        with open(cluster, encoding="utf-8") as handle:
            address = json.load(handle).get("address")
    except (OSError, ValueError, AttributeError):
        return None
    return address if isinstance(address, str) else None


def scheme_of(address: str) -> str:
    """The comm scheme of a Dask address (``tls://h:1`` -> ``tls``; none given: ``tcp``)."""
    return address.split("://", 1)[0].lower() if "://" in address else DEFAULT_SCHEME


def is_loopback(address: str) -> bool:
    """Whether a Dask address's host is a loopback address (127.0.0.0/8, ::1, localhost)."""
    rest = address.split("://", 1)[-1]
    host = rest[1:rest.find("]")] if rest.startswith("[") else rest.rsplit(":", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refusal(cluster: str, address: str, insecure: bool, certificates: bool) -> str | None:
    """Why distfit will not connect to the scheduler at ``address`` (named by the ``--cluster``
    value ``cluster``), as one line, or None: a TLS address needs ``certificates`` (the client's
    CA and certificate, from the flags or Dask's configuration); any other network scheme (plain
    ``tcp``, ``ws``, ``ucx``) needs ``insecure``; ``inproc`` (this process) needs nothing."""
    scheme = scheme_of(address)
    where = cluster if cluster == address else f"{cluster} (scheduler {address})"
    if scheme in ENCRYPTED_SCHEMES:
        if certificates:
            return None
        return (f"--cluster {where}: {scheme}:// needs the cluster's certificates: give {TLS_FLAGS} "
                "(or distributed.comm.tls in the Dask config); see docs/deployment.md")
    if insecure or scheme == "inproc":
        return None
    return (f"--cluster {where}: plain {scheme}:// is unencrypted and unauthenticated (whoever reaches the "
            f"scheduler can run code on its workers and read the data); connect over tls:// with {TLS_FLAGS}, "
            "or pass --insecure; see docs/deployment.md")
