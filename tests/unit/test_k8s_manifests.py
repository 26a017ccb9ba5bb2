"""Every kustomize target renders, every built-in object passes strict structural validation
against the Kubernetes API schemas (kubernetes-validate: unknown or mistyped fields fail),
and the custom resources (InferencePool, HTTPRoute, ServiceMonitor, PodMonitor) have the
shape their APIs define and point at objects that exist.

No cluster runs here: this is what can be checked without one (docs/deploy.md says what
was not verified).
"""

from __future__ import annotations

from typing import Any

import pytest

from planner_svc.cli.epp_cmd import FLAGS as EPP_FLAGS
from planner_svc.server import LEADER_HEALTH
from router_client.epp import protocol
from tests.unit.test_deploy import PLANNER_ENV, by_kind, configmap_env, kustomize

kubernetes_validate = pytest.importorskip("kubernetes_validate")

TARGETS = ["base", "overlays/gateway-api", "overlays/production"]
K8S_VERSION = "1.32"
CUSTOM = {"InferencePool", "HTTPRoute", "ServiceMonitor", "PodMonitor"}
EPP_ENV = {"CACHEROUTE_EPP_" + f.upper().replace("-", "_") for f in EPP_FLAGS}


@pytest.mark.parametrize("target", TARGETS)
def test_every_built_in_object_validates_strictly(target: str) -> None:
    docs = kustomize(target)
    assert docs
    for doc in docs:
        if doc["kind"] in CUSTOM:
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_validation_catches_a_misspelt_field() -> None:
    doc = dict(by_kind("Deployment")["cacheroute-epp"])
    spec = {**doc["spec"], "replica": 2}  # not "replicas"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({**doc, "spec": spec}, K8S_VERSION, strict=True)


def _one(kind: str) -> dict[str, Any]:
    (obj,) = by_kind(kind).values()
    return obj


def test_the_inference_pool_names_the_picker_and_its_port() -> None:
    pool = _one("InferencePool")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    spec = pool["spec"]
    assert set(spec) == {"selector", "targetPorts", "endpointPickerRef"}
    assert set(spec["selector"]) == {"matchLabels"} and spec["selector"]["matchLabels"]
    assert len(spec["targetPorts"]) == 1 and 0 < spec["targetPorts"][0]["number"] < 65536
    ref = spec["endpointPickerRef"]
    assert set(ref) <= {"group", "kind", "name", "port", "failureMode"}
    assert ref["kind"] == "Service" and ref["failureMode"] in ("FailOpen", "FailClose")
    service = by_kind("Service")[ref["name"]]
    ports = {p["port"]: p for p in service["spec"]["ports"]}
    assert ref["port"]["number"] in ports
    epp = configmap_env("cacheroute-epp")
    assert int(epp["CACHEROUTE_EPP_PORT"]) == ref["port"]["number"]
    # the picker's Service reaches the picker's pods
    deployment = by_kind("Deployment")["cacheroute-epp"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    # pool, picker and its Service share a namespace (the pool's selector is namespaced)
    assert pool["metadata"]["namespace"] == service["metadata"]["namespace"] \
        == deployment["metadata"]["namespace"]


def test_the_route_sends_the_openai_api_to_the_pool() -> None:
    route = _one("HTTPRoute")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert backend["group"] == "inference.networking.k8s.io"
    assert backend["kind"] == "InferencePool"
    assert backend["name"] == _one("InferencePool")["metadata"]["name"]
    assert rule["matches"][0]["path"]["value"] == "/v1/"


def test_the_picker_deployment_agrees_with_its_command() -> None:
    deployment = by_kind("Deployment")["cacheroute-epp"]
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["cacheroute", "epp"]
    env = configmap_env("cacheroute-epp")
    names = set(env) | {e["name"] for e in c["env"]}
    assert {n for n in names if n.startswith("CACHEROUTE_")} <= EPP_ENV
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": int(env["CACHEROUTE_EPP_PORT"]),
                     "metrics": int(env["CACHEROUTE_EPP_METRICS_PORT"])}
    # GIE's health services, on the ext_proc port
    assert c["readinessProbe"]["grpc"] == {"port": ports["grpc"], "service": "readiness"}
    assert c["livenessProbe"]["grpc"] == {"port": ports["grpc"], "service": "liveness"}
    assert pod["automountServiceAccountToken"] is False
    mounted = {m["mountPath"] for m in c["volumeMounts"]}
    assert env["CACHEROUTE_EPP_PUBLIC_KEY"].rsplit("/", 1)[0] in mounted
    assert protocol.SERVICE_NAME == "envoy.service.ext_proc.v3.ExternalProcessor"


def test_rbac_is_read_only_and_only_for_the_pool_sync() -> None:
    (role,) = by_kind("Role").values()
    for rule in role["rules"]:
        assert set(rule["verbs"]) <= {"get", "list", "watch"}
    assert {r for rule in role["rules"] for r in rule["resources"]} == {"pods", "inferencepools"}
    (binding,) = by_kind("RoleBinding").values()
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    (subject,) = binding["subjects"]
    planner = by_kind("Deployment")["cacheroute-planner"]["spec"]["template"]["spec"]
    assert planner["serviceAccountName"] == subject["name"]
    assert subject["namespace"] == role["metadata"]["namespace"]
    sidecar = next(c for c in planner["containers"] if c["name"] == "pool-sync")
    assert sidecar["command"] == ["cacheroute", "pool-sync"]
    for name, d in by_kind("Deployment").items():
        if name != "cacheroute-planner":
            assert d["spec"]["template"]["spec"].get("serviceAccountName") != subject["name"]


def test_monitors_select_services_and_ports_that_exist() -> None:
    services = by_kind("Service")
    for name, monitor in by_kind("ServiceMonitor").items():
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        wanted = monitor["spec"]["selector"]["matchLabels"]
        matching = [s for s in services.values()
                    if wanted.items() <= s["metadata"].get("labels", {}).items()]
        assert matching, name
        ports = {p["name"] for s in matching for p in s["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports, name
    (pods,) = by_kind("PodMonitor").values()
    worker = by_kind("Deployment")["cacheroute-streams"]["spec"]["template"]
    assert pods["spec"]["selector"]["matchLabels"].items() <= worker["metadata"]["labels"].items()
    ports = {p["name"] for p in worker["spec"]["containers"][0]["ports"]}
    assert {e["port"] for e in pods["spec"]["podMetricsEndpoints"]} <= ports


def test_the_replicated_planner_elects_a_leader() -> None:
    planner = by_kind("Deployment")["cacheroute-planner"]
    assert planner["spec"]["replicas"] == 2
    c = planner["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"] for e in c["env"]}
    assert {"CACHEROUTE_LEADER_LEASE_S", "CACHEROUTE_LEADER_ID"} <= env
    assert {n for n in env if n.startswith("CACHEROUTE_")} <= PLANNER_ENV  # real settings
    # only the leader is ready (the planner's "leader" health service), so the Service
    # sends operators' changes to it
    assert c["readinessProbe"]["grpc"]["service"] == LEADER_HEALTH
    assert by_kind("PodDisruptionBudget")["cacheroute-planner"]["spec"] == {
        "minAvailable": 1, "selector": {"matchLabels": {
            "app.kubernetes.io/name": "cacheroute-planner"}}}
    # the base stays a single planner that recreates (no leader election configured)
    (base,) = [d for d in kustomize("base") if d["kind"] == "Deployment"
               and d["metadata"]["name"] == "cacheroute-planner"]
    assert base["spec"]["replicas"] == 1 and base["spec"]["strategy"] == {"type": "Recreate"}


def test_every_container_is_probed_and_sized() -> None:
    for name, deployment in by_kind("Deployment").items():
        for c in deployment["spec"]["template"]["spec"]["containers"]:
            assert "livenessProbe" in c, (name, c["name"])
            assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
