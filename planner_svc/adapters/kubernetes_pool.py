"""Reading an InferencePool and its pods, or a Service's EndpointSlices, from the Kubernetes
API (the official client).

The only module of the planner that talks to Kubernetes; it needs the `k8s` extra and a
ServiceAccount allowed to get/list pods and inferencepools in the namespace (the
gateway-api overlay's Role). Errors are translated here: an API server that cannot be
reached is `Unavailable`, a missing pool is `NotFound`.
"""

from __future__ import annotations

import json
from typing import Any

from planner_svc.errors import NotFound, Unavailable

# The Gateway API Inference Extension's pool resource (GIE v1).
POOL_GROUP, POOL_VERSION, POOL_PLURAL = "inference.networking.k8s.io", "v1", "inferencepools"


def _configured_client() -> Any:
    """The official client's `kubernetes.client`, configured from the pod's ServiceAccount
    (in a cluster) or the user's kubeconfig (outside one)."""
    try:
        from kubernetes import client, config
    except ImportError as exc:  # pragma: no cover - install hint
        raise SystemExit("reading Kubernetes needs its client: "
                         "pip install 'cacheroute[k8s]'") from exc
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client


class KubernetesPool:
    def __init__(self, namespace: str, pool: str, *, timeout_s: float = 10.0) -> None:
        client = _configured_client()
        self._core = client.CoreV1Api()
        self._custom = client.CustomObjectsApi()
        self._exc = client.exceptions.ApiException
        self.namespace, self.pool, self.timeout_s = namespace, pool, timeout_s

    def read_pool(self) -> dict[str, Any]:
        try:
            return dict(self._custom.get_namespaced_custom_object(
                POOL_GROUP, POOL_VERSION, self.namespace, POOL_PLURAL, self.pool,
                _request_timeout=self.timeout_s))
        except self._exc as exc:
            if exc.status == 404:
                raise NotFound(f"no InferencePool {self.namespace}/{self.pool}") from exc
            raise Unavailable(f"the Kubernetes API refused: {exc.status} {exc.reason}") from exc
        except OSError as exc:
            raise Unavailable(f"the Kubernetes API is unreachable: {exc}") from exc

    def list_pods(self, label_selector: str) -> list[dict[str, Any]]:
        try:
            raw = self._core.list_namespaced_pod(
                self.namespace, label_selector=label_selector, _preload_content=False,
                _request_timeout=self.timeout_s)
        except self._exc as exc:
            raise Unavailable(f"the Kubernetes API refused: {exc.status} {exc.reason}") from exc
        except OSError as exc:
            raise Unavailable(f"the Kubernetes API is unreachable: {exc}") from exc
        items = json.loads(raw.data).get("items", [])  # the API's JSON, camelCase
        return [i for i in items if isinstance(i, dict)]


class KubernetesService:
    """The EndpointSlices of a Service (`discovery.k8s.io/v1`): what kube-proxy routes to.
    Needs get/list on endpointslices in the namespace."""

    def __init__(self, namespace: str, service: str, *, timeout_s: float = 10.0) -> None:
        client = _configured_client()
        self._api = client.DiscoveryV1Api()
        self._exc = client.exceptions.ApiException
        self.namespace, self.service, self.timeout_s = namespace, service, timeout_s

    def list_endpoint_slices(self) -> list[dict[str, Any]]:
        try:
            raw = self._api.list_namespaced_endpoint_slice(
                self.namespace, label_selector=f"kubernetes.io/service-name={self.service}",
                _preload_content=False, _request_timeout=self.timeout_s)
        except self._exc as exc:
            raise Unavailable(f"the Kubernetes API refused: {exc.status} {exc.reason}") from exc
        except OSError as exc:
            raise Unavailable(f"the Kubernetes API is unreachable: {exc}") from exc
        items = json.loads(raw.data).get("items", [])
        return [i for i in items if isinstance(i, dict)]
