"""The Helm chart (deploy/helm/cacheroute): `helm lint` passes, `helm template` renders with
the default values, with every part on and with the picker off, every built-in object of
each rendering passes strict kubernetes-validate, and the chart cannot drift from the
kustomize tree in deploy/k8s: the same objects, the same ConfigMap keys, the same
containers (commands, ports, probes, env names, mounts, resources), the same custom
resources. Secrets are only ever referenced (existingSecret), never rendered.

helm comes from the Go module proxy (deploy/local/run.sh builds it into .venv/bin).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_deploy import ROOT, VERSION, kustomize
from tests.unit.test_k8s_manifests import CUSTOM, K8S_VERSION

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

CHART = ROOT / "deploy" / "helm" / "cacheroute"
RELEASE = "cacheroute"  # gives the kustomize tree's object names
# rendering -> (values files, namespace, the kustomize target it must equal)
RENDERINGS: dict[str, tuple[tuple[str, ...], str]] = {
    "default": ((), "cacheroute"),
    "all-on": (("ci/all-on-values.yaml",), "llm"),
    "picker-off": (("ci/picker-off-values.yaml",), "llm"),
}
TWINS = {"default": "base", "all-on": "overlays/production"}
PICKER = "cacheroute-epp"

Doc = dict[str, Any]


def helm_binary() -> str:
    for candidate in (os.environ.get("CACHEROUTE_HELM"), str(ROOT / ".venv" / "bin" / "helm"),
                      shutil.which("helm")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    message = "helm not found (deploy/local/run.sh builds it: go install helm.sh/helm/v3/cmd/helm)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_binary(), *args], capture_output=True, text=True, cwd=CHART,
                          timeout=120)


def template(*args: str, namespace: str = "cacheroute") -> subprocess.CompletedProcess[str]:
    return helm("template", RELEASE, ".", "--namespace", namespace,
                "--kube-version", K8S_VERSION, *args)


@functools.cache
def rendered(name: str) -> tuple[Doc, ...]:
    files, namespace = RENDERINGS[name]
    done = template(*[a for f in files for a in ("-f", f)], namespace=namespace)
    assert done.returncode == 0, done.stderr
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def render_with(*sets: str) -> list[Doc]:
    done = template(*[a for s in sets for a in ("--set", s)])
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def objects(docs: Any) -> dict[tuple[str, str], Doc]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def twin(name: str) -> dict[tuple[str, str], Doc]:
    """The kustomize rendering a chart rendering must match, less the Namespace (a Helm
    release installs into its namespace)."""
    return {k: d for k, d in objects(kustomize(TWINS[name])).items() if k[0] != "Namespace"}


# --- lint and render ----------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, "ci/all-on-values.yaml", "ci/picker-off-values.yaml"])
def test_helm_lint_passes_strictly(values: str | None) -> None:
    args = ["lint", ".", "--strict", "--kube-version", K8S_VERSION]
    done = helm(*args, *(["-f", values] if values else []))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("name", list(RENDERINGS))
def test_every_built_in_object_validates_strictly(name: str) -> None:
    docs = rendered(name)
    assert docs
    for doc in docs:
        if doc["kind"] in CUSTOM:
            continue  # custom resources: checked against the kustomize tree's below
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        assert doc["metadata"]["namespace"] == RENDERINGS[name][1], doc["metadata"]["name"]


def test_validation_catches_a_misspelt_field() -> None:
    (deployment,) = [d for d in rendered("default") if d["kind"] == "Deployment"
                     and d["metadata"]["name"] == "cacheroute-gateway"]
    wrong = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, K8S_VERSION, strict=True)


# --- the chart and the kustomize tree -------------------------------------------------------


@pytest.mark.parametrize("name", list(TWINS))
def test_the_chart_renders_the_kustomize_trees_objects(name: str) -> None:
    assert set(objects(rendered(name))) == set(twin(name))


def test_the_picker_off_drops_the_picker_and_keeps_the_rest() -> None:
    all_on, picker_off = objects(rendered("all-on")), objects(rendered("picker-off"))
    assert {k for k in all_on if k[1] == PICKER} == {
        ("ConfigMap", PICKER), ("Deployment", PICKER), ("Service", PICKER),
        ("PodDisruptionBudget", PICKER), ("ServiceAccount", PICKER), ("ServiceMonitor", PICKER)}
    assert set(picker_off) == {k for k in all_on if k[1] != PICKER}
    pool = picker_off[("InferencePool", "cacheroute-pool")]["spec"]["endpointPickerRef"]
    assert pool["name"] == "other-epp" and pool["port"] == {"number": 9002}


@pytest.mark.parametrize("name", list(TWINS))
def test_configmap_keys_match_the_kustomize_tree(name: str) -> None:
    """The chart's config keys are the kustomize config maps' keys: the two cannot drift."""
    ours = {k[1]: d for k, d in objects(rendered(name)).items() if k[0] == "ConfigMap"}
    theirs = {k[1]: d for k, d in twin(name).items() if k[0] == "ConfigMap"}
    assert set(ours) == set(theirs)
    for cm in theirs:
        assert set(ours[cm]["data"]) == set(theirs[cm]["data"]), cm
        assert all(isinstance(v, str) for v in ours[cm]["data"].values()), cm


def test_configmap_values_that_are_fixed_match_the_kustomize_tree() -> None:
    """Ports, paths, topics and tunables equal the kustomize values; only the example
    destinations differ (the chart derives both lists from one `engines` value)."""
    ours = objects(rendered("all-on"))
    for key, cm in twin("all-on").items():
        if key[0] != "ConfigMap":
            continue
        for field, value in cm["data"].items():
            if field.endswith("_DESTINATIONS"):
                continue
            assert ours[key]["data"][field] == str(value), (key[1], field)
    planner = ours[("ConfigMap", "cacheroute-planner")]["data"]["CACHEROUTE_DESTINATIONS"]
    gateway = ours[("ConfigMap", "cacheroute-gateway")]["data"]["CACHEROUTE_GATEWAY_DESTINATIONS"]
    assert planner.split(",") == [d.split("=", 1)[0] for d in gateway.split(",")]


def _env_names(c: Doc) -> set[str]:
    return {e["name"] for e in c.get("env", [])}


@pytest.mark.parametrize("name", list(TWINS))
def test_containers_match_the_kustomize_tree(name: str) -> None:
    ours, theirs = objects(rendered(name)), twin(name)
    deployments = [k for k in theirs if k[0] == "Deployment"]
    assert deployments
    for key in deployments:
        a, b = ours[key]["spec"], theirs[key]["spec"]
        assert a["replicas"] == b["replicas"] and a["strategy"] == b["strategy"], key
        pa, pb = a["template"]["spec"], b["template"]["spec"]
        for field in ("securityContext", "terminationGracePeriodSeconds", "serviceAccountName",
                      "automountServiceAccountToken", "affinity"):
            if field == "affinity" and "affinity" in pb:  # selector labels differ
                terms = pa["affinity"]["podAntiAffinity"]
                assert terms.keys() == pb["affinity"]["podAntiAffinity"].keys()
                continue
            assert pa.get(field) == pb.get(field), (key, field)
        assert {v["name"] for v in pa["volumes"]} == {v["name"] for v in pb["volumes"]}, key
        assert [c["name"] for c in pa["containers"]] == [c["name"] for c in pb["containers"]]
        for ca, cb in zip(pa["containers"], pb["containers"], strict=True):
            where = (key[1], ca["name"])
            for field in ("image", "command", "ports", "readinessProbe", "livenessProbe",
                          "startupProbe", "resources", "securityContext", "volumeMounts",
                          "envFrom"):
                assert ca.get(field) == cb.get(field), (where, field)
            assert _env_names(ca) == _env_names(cb), where
        annotations = a["template"]["metadata"]["annotations"]
        for k, v in b["template"]["metadata"]["annotations"].items():
            assert annotations[k] == v, (key, k)
        for k, v in a["selector"]["matchLabels"].items():
            assert a["template"]["metadata"]["labels"][k] == v, key


@pytest.mark.parametrize("name", list(TWINS))
def test_services_budgets_and_rbac_match_the_kustomize_tree(name: str) -> None:
    ours, theirs = objects(rendered(name)), twin(name)
    for key, theirs_doc in theirs.items():
        a, b = ours[key], theirs_doc
        if key[0] == "Service":
            assert a["spec"]["ports"] == b["spec"]["ports"], key
            deployment = ours[("Deployment", key[1])]["spec"]["template"]["metadata"]["labels"]
            assert a["spec"]["selector"].items() <= deployment.items(), key
        elif key[0] == "PodDisruptionBudget":
            strip = {k: v for k, v in b["spec"].items() if k != "selector" and v is not None}
            assert {k: v for k, v in a["spec"].items() if k != "selector"} == strip, key
            deployment = ours[("Deployment", key[1])]["spec"]["template"]["metadata"]["labels"]
            assert a["spec"]["selector"]["matchLabels"].items() <= deployment.items(), key
        elif key[0] == "Role":
            assert a["rules"] == b["rules"]
        elif key[0] == "RoleBinding":
            assert a["roleRef"] == b["roleRef"] and a["subjects"] == b["subjects"]
        elif key[0] == "ServiceAccount":
            assert a.get("automountServiceAccountToken") == b.get("automountServiceAccountToken")


def test_custom_resources_match_the_kustomize_tree() -> None:
    ours, theirs = objects(rendered("all-on")), twin("all-on")
    for kind in ("InferencePool", "HTTPRoute"):
        (key,) = [k for k in theirs if k[0] == kind]
        assert ours[key]["apiVersion"] == theirs[key]["apiVersion"]
        assert ours[key]["spec"] == theirs[key]["spec"], kind
    for key, monitor in theirs.items():
        if key[0] not in ("ServiceMonitor", "PodMonitor"):
            continue
        mine = ours[key]
        assert mine["apiVersion"] == monitor["apiVersion"] == "monitoring.coreos.com/v1"
        endpoints = "endpoints" if key[0] == "ServiceMonitor" else "podMetricsEndpoints"
        assert mine["spec"][endpoints] == monitor["spec"][endpoints], key
        wanted = mine["spec"]["selector"]["matchLabels"]
        if key[0] == "ServiceMonitor":  # selects this chart's Service of that name
            service = ours[("Service", key[1])]
            assert wanted.items() <= service["metadata"]["labels"].items(), key
            ports = {p["name"] for p in service["spec"]["ports"]}
        else:
            pod = ours[("Deployment", key[1])]["spec"]["template"]
            assert wanted.items() <= pod["metadata"]["labels"].items(), key
            ports = {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
        assert {e["port"] for e in mine["spec"][endpoints]} <= ports, key


def test_the_chart_deploys_the_project_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION
    images = {c["image"] for d in rendered("all-on") if d["kind"] == "Deployment"
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {f"cacheroute:{VERSION}"}
    (other,) = {c["image"] for d in render_with("image.repository=r.example/cr", "image.tag=9")
                if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"]["containers"]}
    assert other == "r.example/cr:9"


# --- secrets ------------------------------------------------------------------------------


def secret_refs(docs: Any) -> set[tuple[str, str, str]]:
    """(deployment, secret, key) of every secretKeyRef and secret volume item."""
    refs = set()
    for d in docs:
        if d["kind"] != "Deployment":
            continue
        pod, name = d["spec"]["template"]["spec"], d["metadata"]["name"]
        for c in pod["containers"]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.add((name, ref["name"], ref["key"]))
        for v in pod.get("volumes", []):
            for item in v.get("secret", {}).get("items", []):
                refs.add((name, v["secret"]["secretName"], item["key"]))
    return refs


def test_secrets_are_referenced_never_rendered() -> None:
    for name in RENDERINGS:
        assert not [d for d in rendered(name) if d["kind"] == "Secret"], name
    refs = secret_refs(rendered("all-on"))
    assert {s for _, s, _ in refs} == {"cacheroute-secrets"}
    # the keys the kustomize tree's example Secret holds (deploy/k8s/base/secret.example.yaml)
    example = yaml.safe_load((ROOT / "deploy/k8s/base/secret.example.yaml").read_text())
    assert {k for _, _, k in refs} == set(example["stringData"])
    # no value in values.yaml looks like a secret: only Secret names and key names
    values = (CHART / "values.yaml").read_text()
    assert not re.search(r"(?i)^\s*(password|token|secret)\s*:", values, re.M)
    assert "PRIVATE KEY" not in values


def test_each_secret_group_names_its_own_existing_secret() -> None:
    docs = render_with("redis.auth.existingSecret=redis-pw", "signing.existingSecret=plan-key",
                       "snapshotSigning.existingSecret=snap-key",
                       "grpcTokens.existingSecret=tokens", "picker.enabled=true",
                       "poolSync.enabled=true", "inferencePool.enabled=true")
    by_key = {key: secret for _, secret, key in secret_refs(docs)}
    assert by_key == {
        "redis-password": "redis-pw", "router-redis-password": "redis-pw",
        "planner-signing-key.pem": "plan-key", "planner-signing-key.pub.pem": "plan-key",
        "streams-signing-key.pem": "snap-key", "streams-signing-key.pub.pem": "snap-key",
        "operator-token": "tokens", "reader-token": "tokens",
    }
    done = template("--set", "secrets.existingSecret=")
    assert done.returncode != 0 and "existingSecret" in done.stderr


def test_each_signing_key_reaches_only_its_signer_and_the_public_half_its_verifiers() -> None:
    """The planner's private key only the planner, the stream workers' only the workers; the
    planner pins the workers' public half, the routers the planner's (as the kustomize tree)."""
    refs = secret_refs(rendered("all-on"))
    readers: dict[str, set[str]] = {}
    for deployment, _, key in refs:
        readers.setdefault(key, set()).add(deployment)
    assert readers["planner-signing-key.pem"] == {"cacheroute-planner"}
    assert readers["planner-signing-key.pub.pem"] == {"cacheroute-gateway", PICKER}
    assert readers["streams-signing-key.pem"] == {"cacheroute-streams"}
    assert readers["streams-signing-key.pub.pem"] == {"cacheroute-planner"}
    assert refs == secret_refs(kustomize("overlays/production"))
    docs = render_with("snapshotSigning.privateKeyKey=w.pem", "snapshotSigning.publicKeyKey=w.pub")
    keys = {(d, k) for d, _, k in secret_refs(docs)}
    assert {("cacheroute-streams", "w.pem"), ("cacheroute-planner", "w.pub")} <= keys
    assert not {k for _, k in keys} & {"streams-signing-key.pem", "streams-signing-key.pub.pem"}


def resolved_env(docs: Any, deployment: str, container: int = 0) -> dict[str, str]:
    """A container's env as the kubelet expands it ($(NAME) of earlier entries), with
    secrets read as "pw" and the downward API as "pod"."""
    configmaps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    (pod,) = [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"
              and d["metadata"]["name"] == deployment]
    env: dict[str, str] = {}
    for e in pod["containers"][container]["env"]:
        ref = e.get("valueFrom", {})
        if "configMapKeyRef" in ref:
            value = configmaps[ref["configMapKeyRef"]["name"]][ref["configMapKeyRef"]["key"]]
        elif "secretKeyRef" in ref:
            value = "pw"
        elif "fieldRef" in ref:
            value = "pod"
        else:
            value = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], e["value"])
        env[e["name"]] = value
    return env


@pytest.mark.parametrize(("sets", "kind", "hosts", "db"), [
    ([], "single", None, 0),
    (["redis.scheme=rediss+cluster", r"redis.hostPort=r0:6379\,r1:6379"], "cluster",
     (("r0", 6379), ("r1", 6379)), 0),
    (["redis.scheme=redis+sentinel", "redis.hostPort=s0:26379", "redis.db=mymaster/2"],
     "sentinel", (("s0", 26379),), 2),
])
def test_every_redis_url_parses_as_the_topology_asked(
        sets: list[str], kind: str, hosts: Any, db: int) -> None:
    from router_client.redis_topology import parse_redis_url
    docs = render_with("picker.enabled=true", *sets)
    urls = {"cacheroute-planner": "CACHEROUTE_REDIS_URL",
            "cacheroute-gateway": "CACHEROUTE_GATEWAY_REDIS_URL",
            "cacheroute-epp": "CACHEROUTE_EPP_REDIS_URL"}
    users = {"cacheroute-planner": "cacheroute-planner",
             "cacheroute-gateway": "cacheroute-router-gateway-*",
             "cacheroute-epp": "cacheroute-router-epp-*"}
    for deployment, name in urls.items():
        topology = parse_redis_url(resolved_env(docs, deployment)[name])
        assert topology.kind == kind, deployment
        if hosts:
            assert topology.hosts == hosts and topology.db == db
            assert (topology.username, topology.password) == (users[deployment], "pw")


def test_resolved_env_equals_the_kustomize_trees() -> None:
    """Every container's env as it reaches the process (Redis URLs and ACL users, router
    ids, leader election, pool-sync's planner address) is the production overlay's."""
    ours, theirs = rendered("all-on"), kustomize("overlays/production")
    deployments = {d["metadata"]["name"]: d for d in theirs if d["kind"] == "Deployment"}
    for name, d in deployments.items():
        for i, c in enumerate(d["spec"]["template"]["spec"]["containers"]):
            assert resolved_env(ours, name, i) == resolved_env(theirs, name, i), (name, c["name"])


@pytest.mark.parametrize(("sets", "message"), [
    (["planner.replicas=2"], "planner.replicas must be 1"),
    (["inferencePool.enabled=true"], "enable picker"),
    (["httpRoute.enabled=true"], "needs inferencePool.enabled"),
    (["poolSync.enabled=true", "planner.enabled=false"], "needs planner.enabled"),
    (["engines=null"], "at least one entry in engines"),
    # values.schema.json: a misspelt value, a setting of another part, a port out of range
    (["planner.enabeld=true"], "additional properties 'enabeld' not allowed"),
    (["gateway.config.CACHEROUTE_EPP_FALLBACKS=1"], "invalid propertyName"),
    (["picker.port=70000"], "maximum"),
])
def test_inconsistent_values_fail_with_a_message(sets: list[str], message: str) -> None:
    done = template(*[a for s in sets for a in ("--set", s)])
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_every_part_can_be_switched_off() -> None:
    off = ["planner.enabled=false", "streams.enabled=false", "gateway.enabled=false"]
    done = template(*[a for s in off for a in ("--set", s)])
    assert done.returncode == 0, done.stderr
    assert not [d for d in yaml.safe_load_all(done.stdout) if d]
    gateway_only = render_with("planner.enabled=false", "streams.enabled=false")
    assert {d["metadata"]["name"] for d in gateway_only} == {"cacheroute-gateway"}


# --- documentation ------------------------------------------------------------------------


def leaves(tree: Any, prefix: str = "") -> set[str]:
    if isinstance(tree, dict) and tree:
        return set().union(*(leaves(v, f"{prefix}{k}.") for k, v in tree.items()))
    return {prefix.rstrip(".")}


def test_the_readme_values_table_lists_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    rows = set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", readme, re.M))
    assert rows, "README.md has no values table"
    documented = leaves(values)
    # a row covers a value or a whole map of free-form entries (config, resources, ...)
    for leaf in documented:
        assert any(leaf == r or leaf.startswith(r + ".") for r in rows), leaf
    for row in rows:
        assert any(leaf == row or leaf.startswith(row + ".") for leaf in documented), row
    assert "does not install Redis" in readme and "Kafka" in readme
