"""A DNS server on a loopback UDP port answering from a zone the test edits (dnspython's
wire format, so `DnsSource`'s resolver speaks real DNS to it). No DNS server runs on this
machine kind; this is the smallest one that answers A, AAAA and SRV."""

from __future__ import annotations

import socket
import threading

import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset


class Zone:
    def __init__(self) -> None:
        self.records: dict[tuple[str, str], list[str]] = {}  # (name., type) -> rdata texts
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.queries = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def nameserver(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                wire, peer = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            query = dns.message.from_wire(wire)
            reply = dns.message.make_response(query)
            reply.flags |= dns.flags.AA
            q = query.question[0]
            name, rdtype = q.name.to_text(), dns.rdatatype.to_text(q.rdtype)
            if not any(n == name for n, _ in self.records):
                reply.set_rcode(dns.rcode.NXDOMAIN)
            elif (name, rdtype) in self.records:
                reply.answer.append(dns.rrset.from_text_list(
                    q.name, 5, dns.rdataclass.IN, q.rdtype, self.records[(name, rdtype)]))
            self.queries += 1
            self.sock.sendto(reply.to_wire(), peer)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()
