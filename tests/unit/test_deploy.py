"""deploy/: the compose file, Kubernetes manifests, Dockerfile, Prometheus rules and the
Grafana dashboard agree with the code (settings names and defaults, ports, topics, metric
names), and promtool accepts the rules and the scrape config.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import shutil
import subprocess
import tomllib
from collections import Counter
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from planner_svc.cli.epp_cmd import FLAGS as EPP_FLAGS
from planner_svc.cli.gateway_cmd import FLAGS as GATEWAY_FLAGS
from planner_svc.devstack.stack import StackOptions
from planner_svc.settings import PlannerSettings, from_env
from router_client.prom import METRICS as ROUTER_METRICS
from router_client.prom import RouterCollector
from streams.metrics import StreamCounters
from streams.settings import Settings as StreamSettings
from streams.settings import parse_settings

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"cacheroute:{VERSION}"
PLANNER_ENV = {f"CACHEROUTE_{f.name.upper()}" for f in fields(PlannerSettings)} - {
    "CACHEROUTE_EXTRA"
}
STREAMS_ENV = {f"CACHEROUTE_{f.name.upper()}" for f in fields(StreamSettings)}
CLI_ENV = {"CACHEROUTE_PLANNER", "CACHEROUTE_TOKEN", "CACHEROUTE_TLS_CA"}
GATEWAY_ENV = {"CACHEROUTE_GATEWAY_" + f.upper().replace("-", "_") for f in GATEWAY_FLAGS}


def load_all(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@functools.cache
def compose() -> dict[str, Any]:
    return load_all(DEPLOY / "compose.yaml")[0]


@functools.cache
def manifests() -> list[dict[str, Any]]:
    """Everything the production overlay renders (base, endpoint picker, components), plus
    the example Secret they expect."""
    docs = kustomize("overlays/production")
    return docs + load_all(DEPLOY / "k8s" / "base" / "secret.example.yaml")


@functools.cache
def kustomize_cached(target: str) -> str:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl renders the manifests (apt-get install kubectl; run.sh does)"
    done = subprocess.run([kubectl, "kustomize", str(DEPLOY / "k8s" / target)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def kustomize(target: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(kustomize_cached(target)) if d]


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in manifests() if d.get("kind") == kind}


def container(deployment: str) -> dict[str, Any]:
    return by_kind("Deployment")[deployment]["spec"]["template"]["spec"]["containers"][0]


def configmap_env(name: str) -> dict[str, str]:
    return {k: str(v) for k, v in by_kind("ConfigMap")[name]["data"].items()}


def cacheroute_names(env: dict[str, Any]) -> set[str]:
    return {k for k in env if k.startswith("CACHEROUTE_")}


# --- compose ----------------------------------------------------------------------------


def test_compose_services_share_one_image_of_the_project_version():
    services = compose()["services"]
    ours = {name: s for name, s in services.items() if "cacheroute" in str(s.get("image", ""))}
    assert set(ours) == {"planner", "streams", "demo", "gateway", "streams-keys"}
    assert {s["image"] for s in ours.values()} == {IMAGE}
    assert {s["build"]["dockerfile"] for s in ours.values()} == {"deploy/docker/Dockerfile"}
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"


def _volume_path(service: dict[str, Any], file: str) -> str:
    """The named volume and the path inside it where `file` lies for `service`."""
    for mount in service.get("volumes", []):
        volume, target = mount.split(":")[:2]
        if file.startswith(target + "/"):
            return f"{volume}:{file[len(target) + 1:]}"
    raise AssertionError(f"{file} is on no volume")


def test_compose_planner_pins_the_public_half_of_the_key_the_workers_sign_with():
    services = compose()["services"]
    signing = services["streams"]["environment"]["CACHEROUTE_SIGNING_KEY_PATH"]
    pinned = services["planner"]["environment"]["CACHEROUTE_SNAPSHOT_KEYS"]
    made = services["streams-keys"]["command"][-1].split("'")[1]
    assert _volume_path(services["streams-keys"], made) == _volume_path(
        services["streams"], signing) == "streams-keys:streams-signing-key.pem"
    assert _volume_path(services["planner"], pinned) == "streams-keys:streams-signing-key.pub.pem"


def test_compose_env_names_and_values_are_what_the_code_reads():
    services = compose()["services"]
    planner_env = services["planner"]["environment"]
    assert cacheroute_names(planner_env) <= PLANNER_ENV | CLI_ENV
    settings = from_env(environ={k: str(v) for k, v in planner_env.items()})
    assert settings.grpc_port == PlannerSettings().grpc_port == 50051
    assert settings.grpc_host == "0.0.0.0" and settings.metrics_port == 9464
    assert "127.0.0.1:50051:50051" in services["planner"]["ports"]
    assert settings.snapshots_topic == PlannerSettings().snapshots_topic
    assert settings.state_topic == PlannerSettings().state_topic
    assert list(settings.destinations) == StackOptions(destinations=8).destination_ids
    demo = services["demo"]["command"]
    assert demo[demo.index("--destinations") + 1] == "8"

    streams_env = {k: str(v) for k, v in services["streams"]["environment"].items()}
    assert cacheroute_names(streams_env) <= STREAMS_ENV
    worker = parse_settings([], streams_env)
    assert worker.web_port == StreamSettings().web_port == 6066
    assert worker.snapshots_topic == settings.snapshots_topic


def test_gateway_config_names_flags_that_exist_and_parses():
    from router_client.plan import parse_destinations
    compose_env = compose()["services"]["gateway"]["environment"]
    k8s_env = configmap_env("cacheroute-gateway")
    c = container("cacheroute-gateway")
    for env in (compose_env, k8s_env, {e["name"]: "" for e in c["env"]}):
        assert cacheroute_names(env) <= GATEWAY_ENV, cacheroute_names(env) - GATEWAY_ENV
    assert int(k8s_env["CACHEROUTE_GATEWAY_PORT"]) == c["ports"][0]["containerPort"]
    assert parse_destinations(k8s_env["CACHEROUTE_GATEWAY_DESTINATIONS"])
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert compose()["services"]["gateway"]["command"] == c["command"] == ["cacheroute", "gateway"]


def test_compose_creates_the_topics_the_code_uses():
    script = compose()["services"]["kafka-init"]["command"][0]
    created = dict(re.findall(r"--topic (\S+) --partitions (\d+)", script))
    defaults = StreamSettings()
    assert set(created) == {
        defaults.events_topic,
        defaults.snapshots_topic,
        defaults.deadletter_topic,
        PlannerSettings().state_topic,
    }
    assert created[defaults.snapshots_topic] == "1"  # one ordered stream of windows
    assert int(created[defaults.events_topic]) >= compose()["services"]["streams"]["deploy"][
        "replicas"
    ]
    state_line = next(line for line in script.splitlines() if PlannerSettings().state_topic in line)
    assert "cleanup.policy=compact" in state_line


def test_entry_points_exist():
    for module in ("planner_svc.__main__", "streams.__main__", "planner_svc.cli.main"):
        assert importlib.util.find_spec(module) is not None, module
    assert compose()["services"]["planner"]["command"] == ["python", "-m", "planner_svc"]
    assert compose()["services"]["streams"]["command"] == ["python", "-m", "streams", "worker"]
    assert container("cacheroute-planner")["command"] == ["python", "-m", "planner_svc"]
    assert container("cacheroute-streams")["command"] == ["python", "-m", "streams", "worker"]


# --- Kubernetes -------------------------------------------------------------------------


def test_k8s_images_ports_and_env_agree_with_the_code():
    planner, worker = container("cacheroute-planner"), container("cacheroute-streams")
    assert planner["image"] == worker["image"] == IMAGE
    planner_cm = configmap_env("cacheroute-planner")
    streams_cm = configmap_env("cacheroute-streams")
    assert cacheroute_names(planner_cm) <= PLANNER_ENV
    assert cacheroute_names(streams_cm) <= STREAMS_ENV
    assert {e["name"] for e in planner["env"]} & PLANNER_ENV >= {
        "CACHEROUTE_REDIS_URL", "CACHEROUTE_OPERATOR_TOKEN", "CACHEROUTE_READER_TOKEN"
    }
    assert {e["name"] for e in worker["env"]} <= STREAMS_ENV
    settings = from_env(environ=planner_cm)
    ports = {p["name"]: p["containerPort"] for p in planner["ports"]}
    assert ports == {"grpc": settings.grpc_port, "metrics": settings.metrics_port}
    assert settings.grpc_port == PlannerSettings().grpc_port and settings.grpc_host == "0.0.0.0"
    web = parse_settings([], streams_cm).web_port
    assert [p["containerPort"] for p in worker["ports"]] == [web] == [StreamSettings().web_port]
    annotations = by_kind("Deployment")["cacheroute-planner"]["spec"]["template"]["metadata"][
        "annotations"
    ]
    assert annotations["prometheus.io/port"] == str(settings.metrics_port)


def test_k8s_probes_resources_and_budgets():
    planner = container("cacheroute-planner")
    grpc_port = configmap_env("cacheroute-planner")["CACHEROUTE_GRPC_PORT"]
    assert planner["readinessProbe"]["grpc"]["port"] == int(grpc_port)
    assert planner["startupProbe"]["grpc"]["port"] == int(grpc_port)
    assert "livenessProbe" in planner
    for name, deployment in by_kind("Deployment").items():
        c = deployment["spec"]["template"]["spec"]["containers"][0]
        assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"], name
        assert "readinessProbe" in c and "livenessProbe" in c, name
    budgets = by_kind("PodDisruptionBudget")
    assert set(budgets) == set(by_kind("Deployment"))
    for name, pdb in budgets.items():
        labels = by_kind("Deployment")[name]["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_k8s_secrets_configmaps_and_service_ports_resolve():
    secret = by_kind("Secret")["cacheroute-secrets"]["stringData"]
    configmaps = by_kind("ConfigMap")
    for name in ("cacheroute-planner", "cacheroute-streams", "cacheroute-gateway"):
        spec = by_kind("Deployment")[name]["spec"]["template"]["spec"]
        c = spec["containers"][0]
        for source in c.get("envFrom", []):
            assert source["configMapRef"]["name"] in configmaps
        for e in c.get("env", []):
            ref = e.get("valueFrom", {})
            if "secretKeyRef" in ref:
                assert ref["secretKeyRef"]["key"] in secret
            if "configMapKeyRef" in ref:
                cm = configmaps[ref["configMapKeyRef"]["name"]]["data"]
                assert ref["configMapKeyRef"]["key"] in cm
        for volume in spec.get("volumes", []):
            for item in volume.get("secret", {}).get("items", []):
                assert item["key"] in secret
    key_path = configmap_env("cacheroute-planner")["CACHEROUTE_SIGNING_KEY_PATH"]
    mounts = {m["mountPath"] for m in container("cacheroute-planner")["volumeMounts"]}
    assert str(Path(key_path).parent) in mounts
    service = by_kind("Service")["cacheroute-planner"]
    names = {p["name"] for p in container("cacheroute-planner")["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= names
    kustomization = load_all(DEPLOY / "k8s" / "base" / "kustomization.yaml")[0]
    assert "secret.example.yaml" not in kustomization["resources"]
    assert kustomization["images"][0]["newTag"] == VERSION


# --- Dockerfile -------------------------------------------------------------------------


def test_dockerfile_copies_what_exists_and_exposes_the_ports():
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    for line in text.splitlines():
        if line.startswith("COPY") and "--from" not in line:
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
    exposed = {int(p) for p in re.search(r"^EXPOSE (.+)$", text, re.M).group(1).split()}
    assert exposed == {PlannerSettings().grpc_port, 9464, StreamSettings().web_port,
                       GATEWAY_FLAGS["port"][1], EPP_FLAGS["port"][1]}
    # the image runs every entry point: gateway, endpoint picker, pool-sync
    extras = re.search(r"pip install '\.\[([a-z0-9,]+)\]'", text)
    assert extras and {"gateway", "epp", "k8s"} <= set(extras.group(1).split(","))
    ignore = (DEPLOY / "docker" / "Dockerfile.dockerignore").read_text()
    assert "!deploy/docker/demo_fleet.py" in ignore and "!protos/**" in ignore


# --- Prometheus and Grafana ---------------------------------------------------------------


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(tool).exists():
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return subprocess.run([tool, *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def test_promtool_accepts_rules_config_and_rule_tests():
    rules = promtool("check", "rules", "deploy/prometheus/alerts.yml")
    assert rules.returncode == 0, rules.stdout + rules.stderr
    config = promtool("check", "config", "deploy/prometheus/prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr
    assert "WARNING" not in config.stdout + config.stderr
    tests = promtool("test", "rules", "alerts_test.yml", cwd=DEPLOY / "prometheus")
    assert tests.returncode == 0, tests.stdout + tests.stderr


def test_scrape_config_targets_match_the_ports():
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    planner_port = compose()["services"]["planner"]["environment"]["CACHEROUTE_METRICS_PORT"]
    assert jobs["cacheroute-planner"]["static_configs"][0]["targets"] == [f"planner:{planner_port}"]
    assert jobs["cacheroute-streams"]["dns_sd_configs"][0]["port"] == StreamSettings().web_port


def exported_names() -> set[str]:
    """Every cacheroute_streams_* / cacheroute_router_* name the code exports."""
    counters = StreamCounters()
    counters.events_by_type.update({"request": 1})
    counters.dead_letters_by_reason.update({"bad": 1})
    counters.lag_by_partition[0] = 1
    class _Client:  # just what RouterCollector reads
        router_id = "r"

        @staticmethod
        def metrics() -> dict[str, float]:
            return {**dict.fromkeys(ROUTER_METRICS, 1.0), "decisions_planned": 1.0}

    from prometheus_client import CollectorRegistry, generate_latest
    registry = CollectorRegistry()
    registry.register(RouterCollector(_Client()))  # type: ignore[arg-type]
    text = counters.to_prometheus() + generate_latest(registry).decode()
    return set(re.findall(r"^(cacheroute_\w+)", text, re.M))


def queries() -> list[str]:
    """Every PromQL expression of the dashboard and the alert rules."""
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "cacheroute.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"]]
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    return exprs + [r["expr"] for g in rules["groups"] for r in g["rules"]]


def test_dashboard_and_alert_queries_name_metrics_that_exist():
    streams_and_routers = exported_names()
    planner_source = (ROOT / "planner_svc" / "api" / "metrics.py").read_text()
    for expr in queries():
        for name in re.findall(r"\bcacheroute_\w+", expr):
            if name.startswith("cacheroute_planner_"):
                # The integration test checks these against a live scrape.
                short = name.removeprefix("cacheroute_planner_").removesuffix("_total")
                assert f'"{short}"' in planner_source, name
            else:
                assert name in streams_and_routers, name


def test_dashboard_is_well_formed():
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "cacheroute.json").read_text())
    ids = Counter(p["id"] for p in dashboard["panels"])
    assert max(ids.values()) == 1
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Plan", "Drift, staleness and rewarm", "Hit rate and balance", "Stream health"]
    source = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text()
    )
    uid = source["datasources"][0]["uid"]
    assert all(p["datasource"]["uid"] == uid for p in dashboard["panels"] if "datasource" in p)
