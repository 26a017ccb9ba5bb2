"""Redis connection options reach redis-py: password, ACL user, TLS (real redis-server)."""

from __future__ import annotations

import pytest

from planner_svc.adapters.redis_publisher import PlanPublisher
from router_client import RouterClient, signing
from router_client.plan import Version
from router_client.redis_source import RedisPlanSource
from router_client.testing import synthetic_plan
from tests.waiting import eventually, stop_routers

pytestmark = pytest.mark.integration


@pytest.fixture()
def key():
    return signing.generate_private_key()


def test_password_and_acl_user_are_passed_through(tmp_path, key):
    from planner_svc.devstack.processes import start_redis

    server = start_redis(
        tmp_path,
        extra_args=[
            "--requirepass",
            "adminpw",
            "--user",
            "edge",
            "on",
            ">edgepw",
            "~*",
            "&*",
            "+@all",
        ],
    )
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        pub = PlanPublisher(url, key, password="adminpw")
        pub.install(synthetic_plan(20, 3), None)
        ok = RouterClient(
            RedisPlanSource(url, username="edge", password="edgepw"),
            router_id="acl",
            public_keys=signing.pin([key.public_key()]),
        ).start()
        denied = RouterClient(
            RedisPlanSource(url, username="edge", password="wrong"),
            router_id="bad",
            public_keys=signing.pin([key.public_key()]),
            destination_ids=["d0000"],
        ).start()
        try:
            assert ok.wait_for_version(Version(1, 1), 5)
            assert eventually(lambda: denied.unavailable_rounds > 0, 3)
            assert denied.version == Version() and denied.route("x") == "d0000"
        finally:
            stop_routers([ok, denied])
    finally:
        server.process.stop()


def _self_signed(tmp_path):
    """A CA and a server certificate for 127.0.0.1 (files: ca.pem, server.pem, server.key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    now = datetime.datetime.now(datetime.UTC)
    ca_key, srv_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("test-ca"))
        .issuer_name(name("test-ca"))
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    srv = (
        x509.CertificateBuilder()
        .subject_name(name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(srv_key.public_key())
        .serial_number(2)
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(pem))
    (tmp_path / "server.pem").write_bytes(srv.public_bytes(pem))
    (tmp_path / "server.key").write_bytes(
        srv_key.private_bytes(
            pem, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
    )
    return tmp_path / "ca.pem"


def test_tls_connection_options_are_passed_through(tmp_path, key):
    from planner_svc.devstack.processes import free_port, start_redis

    ca = _self_signed(tmp_path)
    port = free_port()
    server = start_redis(
        tmp_path,
        port=port,
        extra_args=[
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--tls-cert-file",
            str(tmp_path / "server.pem"),
            "--tls-key-file",
            str(tmp_path / "server.key"),
            "--tls-ca-cert-file",
            str(ca),
            "--tls-auth-clients",
            "no",
        ],
    )
    try:
        url = f"rediss://127.0.0.1:{port}/0"
        pub = PlanPublisher(url, key, ssl_ca_certs=str(ca))
        pub.install(synthetic_plan(20, 3), None)
        c = RouterClient(
            RedisPlanSource(url, ssl_ca_certs=str(ca)),
            router_id="tls",
            public_keys=signing.pin([key.public_key()]),
        ).start()
        try:
            assert c.wait_for_version(Version(1, 1), 5)
        finally:
            c.stop()
    finally:
        server.process.stop()
