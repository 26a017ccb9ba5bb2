"""Where `cacheroute discover` reads the destinations from: a watched file, DNS, or
Kubernetes (an InferencePool's pods or a Service's EndpointSlices).

Each source answers `desired()` with the destinations it names now
(planner_svc.adapters.discovery parses the answers), or raises: `InvalidRequest` for an
answer that cannot be read (a typo in the file), `Unavailable` for a source that cannot be
reached (a DNS timeout, the API server down), `NotFound` for a name that does not exist. The
sync keeps the planner's list as it is on any of them. dnspython is imported here only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from planner_svc.adapters.discovery import (
    MAX_FILE_BYTES,
    destinations_from_a,
    destinations_from_endpoint_slices,
    destinations_from_file,
    destinations_from_srv,
    pool_destinations,
    pool_spec,
)
from planner_svc.errors import InvalidRequest, NotFound, Unavailable
from router_client.plan import DestinationSpec


class DestinationSource(Protocol):
    name: str

    def desired(self) -> list[DestinationSpec]: ...


class FileSource:
    """A destinations file, re-read when its modification time or size changes (an editor
    that replaces the file, a ConfigMap volume's symlink swap: both change them)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.name = f"file {self.path}"
        self._seen: tuple[int, int] | None = None
        self._held: list[DestinationSpec] = []

    def desired(self) -> list[DestinationSpec]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise NotFound(f"{self.path}: no such file") from None
        except OSError as exc:
            raise Unavailable(f"{self.path}: {exc.strerror}") from None
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._seen:
            return list(self._held)
        if st.st_size > MAX_FILE_BYTES:
            raise InvalidRequest(f"{self.path}: larger than {MAX_FILE_BYTES >> 20} MiB")
        try:
            text = self.path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest(f"{self.path}: not UTF-8 text") from None
        except OSError as exc:
            raise Unavailable(f"{self.path}: {exc.strerror}") from None
        self._held = destinations_from_file(text, str(self.path))
        self._seen = stamp  # only once it parsed: a bad edit is reported every round
        return list(self._held)


class DnsSource:
    """A DNS name's A/AAAA records on one port, or (`srv=True`) its SRV records.
    `nameserver` ("host" or "host:port") asks that server instead of the system's."""

    def __init__(self, qname: str, *, port: int = 0, srv: bool = False,
                 nameserver: str = "", timeout_s: float = 3.0) -> None:
        import dns.resolver

        self._dns = dns
        self.qname, self.port, self.srv = qname, port, srv
        self.name = f"DNS {'SRV' if srv else 'A/AAAA'} {qname}"
        if not srv and not 0 < port < 65536:
            raise InvalidRequest(f"{self.name}: an A/AAAA source needs a port")
        if nameserver:
            self._resolver = dns.resolver.Resolver(configure=False)
            host, _, p = nameserver.rpartition(":") if nameserver.count(":") == 1 \
                else (nameserver, "", "")
            self._resolver.nameservers = [host or nameserver]
            self._resolver.port = int(p) if p else 53
        else:
            self._resolver = dns.resolver.Resolver()
        self._resolver.lifetime = timeout_s
        self._resolver.cache = None  # every round asks: the answer is what changes

    def _resolve(self, rdtype: str) -> list[Any]:
        d = self._dns
        try:
            return list(self._resolver.resolve(self.qname, rdtype))
        except d.resolver.NXDOMAIN:
            raise NotFound(f"{self.name}: no such name") from None
        except d.resolver.NoAnswer:
            return []
        except (d.resolver.NoNameservers, d.resolver.LifetimeTimeout,
                d.exception.DNSException) as exc:
            raise Unavailable(f"{self.name}: {exc}") from None

    def desired(self) -> list[DestinationSpec]:
        if self.srv:
            return destinations_from_srv(
                [(r.priority, r.weight, r.port, r.target.to_text()) for r in
                 self._resolve("SRV")], self.name)
        addresses = [r.address for r in self._resolve("A")]
        addresses += [r.address for r in self._resolve("AAAA")]
        return destinations_from_a(addresses, self.port, self.name)


class PoolReader(Protocol):
    def read_pool(self) -> dict[str, Any]: ...
    def list_pods(self, label_selector: str) -> list[dict[str, Any]]: ...


class InferencePoolSource:
    """A Gateway API Inference Extension pool's ready pods."""

    def __init__(self, reader: PoolReader, name: str = "InferencePool") -> None:
        self.reader, self.name = reader, name

    def desired(self) -> list[DestinationSpec]:
        spec = pool_spec(self.reader.read_pool())
        self.name = f"InferencePool {spec.name}"
        return pool_destinations(spec, self.reader.list_pods(spec.label_selector))


class ServiceSource:
    """A Kubernetes Service's ready endpoints, from its EndpointSlices."""

    def __init__(self, list_slices: Callable[[], list[dict[str, Any]]], service: str,
                 port_name: str = "") -> None:
        self.list_slices, self.port_name = list_slices, port_name
        self.name = f"Service {service}"

    def desired(self) -> list[DestinationSpec]:
        return destinations_from_endpoint_slices(self.list_slices(), self.port_name,
                                                 self.name)
