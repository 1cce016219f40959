"""The cluster tests' Kubernetes API client: :class:`KubeApi`, the official Python client's
connection (admin bearer token, the cluster CA) with calls that take and give objects as plain
dicts, for the infrastructure's installs and any kind the typed API lacks; and the one table of
API paths for the kinds written that way. :class:`infra.kube.Cluster` adds the typed handles
the scenarios read with, on the same connection. The kubelet stand-in keeps a client of its own
(``standin``), so that it runs apart from these.
"""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path
from typing import Any, Iterable

import urllib3
from kubernetes import client

FIELD_MANAGER = "astro-cluster-tests"


class KubeError(RuntimeError):
    """An answer with a status the caller did not accept."""

    def __init__(self, method: str, path: str, status: int, body: str):
        super().__init__(f"{method} {path}: HTTP {status}: {body[:2000]}")
        self.status = status
        self.body = body


# (apiVersion, kind) -> (resource, namespaced): the kinds the infrastructure and scenarios write.
RESOURCES = {
    ("v1", "Namespace"): ("namespaces", False),
    ("v1", "ServiceAccount"): ("serviceaccounts", True),
    ("v1", "Service"): ("services", True),
    ("v1", "Endpoints"): ("endpoints", True),
    ("v1", "Pod"): ("pods", True),
    ("v1", "ConfigMap"): ("configmaps", True),
    ("v1", "Secret"): ("secrets", True),
    ("apps/v1", "Deployment"): ("deployments", True),
    ("autoscaling/v2", "HorizontalPodAutoscaler"): ("horizontalpodautoscalers", True),
    ("discovery.k8s.io/v1", "EndpointSlice"): ("endpointslices", True),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): ("clusterroles", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): ("clusterrolebindings", False),
    ("rbac.authorization.k8s.io/v1", "Role"): ("roles", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("rolebindings", True),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): ("customresourcedefinitions", False),
    ("apiregistration.k8s.io/v1", "APIService"): ("apiservices", False),
    ("keda.sh/v1alpha1", "ScaledObject"): ("scaledobjects", True),
    ("keda.sh/v1alpha1", "TriggerAuthentication"): ("triggerauthentications", True),
    ("keda.sh/v1alpha1", "ClusterTriggerAuthentication"): ("clustertriggerauthentications", False),
}


def collection_path(api_version: str, kind: str, namespace: str | None = None) -> str:
    """The API path of the collection of ``kind`` (in ``namespace`` if the kind is namespaced)."""
    try:
        resource, namespaced = RESOURCES[(api_version, kind)]
    except KeyError:
        raise ValueError(f"no API path known for {api_version} {kind}") from None
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{resource}" if namespaced else f"{prefix}/{resource}"


def object_path(obj: dict) -> str:
    """The API path of ``obj`` (one of the kinds in :data:`RESOURCES`)."""
    meta = obj["metadata"]
    return f"{collection_path(obj['apiVersion'], obj['kind'], meta.get('namespace'))}/{meta['name']}"


def condition(obj: dict | None, kind: str) -> str | None:
    """``status`` of the condition ``kind`` in ``obj['status']['conditions']``, else None."""
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c.get("status")
    return None


def write_kubeconfig(path: Path, server: str, ca_file: Path | str, user: str, token: str,
                     namespace: str | None = None) -> Path:
    """A kubeconfig (mode 0600) for ``user`` with a bearer token; JSON, which is YAML."""
    context: dict[str, str] = {"cluster": "cluster", "user": user} | ({"namespace": namespace} if namespace else {})
    Path(path).write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "default", "context": context}],
        "current-context": "default",
    }, indent=1))
    Path(path).chmod(0o600)
    return Path(path)


class KubeApi:
    """Calls to the API server with the admin identity, objects as plain dicts."""

    def __init__(self, server: str, token: str, ca_file: Path | str):
        self.server = server.rstrip("/")
        self.token = token
        config = client.Configuration()
        config.host = self.server
        config.ssl_ca_cert = str(ca_file)
        config.api_key = {"authorization": f"Bearer {token}"}
        self.api = client.ApiClient(config)

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json", *,
                token: str | None = None, headers: dict[str, str] | None = None,
                timeout: float = 30.0) -> tuple[int, Any]:
        """Status and decoded JSON body (raw text if not JSON); never raises on HTTP errors."""
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        sent = {"Authorization": f"Bearer {token or self.token}", "Accept": "application/json"}
        if data is not None:
            sent["Content-Type"] = content_type
        sent |= headers or {}
        answer = self.api.rest_client.pool_manager.request(
            method, self.server + path, body=data, headers=sent, timeout=urllib3.Timeout(total=timeout))
        text = answer.data.decode("utf-8", "replace")
        try:
            return answer.status, json.loads(text) if text else None
        except ValueError:
            return answer.status, text

    def call(self, method: str, path: str, body: Any = None, ok: Iterable[int] = (200, 201), **kw: Any) -> Any:
        """The decoded answer; :class:`KubeError` for a status not in ``ok``."""
        status, data = self.request(method, path, body, **kw)
        if status not in ok:
            raise KubeError(method, path, status, data if isinstance(data, str) else json.dumps(data))
        return data

    def get(self, path: str, **kw: Any) -> Any | None:
        """The object at ``path``, or None if it does not exist."""
        status, data = self.request("GET", path, **kw)
        if status == 404:
            return None
        if status != 200:
            raise KubeError("GET", path, status, data if isinstance(data, str) else json.dumps(data))
        return data

    def apply(self, obj: dict, field_manager: str = FIELD_MANAGER) -> dict:
        """Server-side apply (as ``kubectl apply --server-side --force-conflicts``): create or
        update, idempotent, and no size limit from the annotation client-side apply keeps."""
        query = urllib.parse.urlencode({"fieldManager": field_manager, "force": "true"})
        return self.call("PATCH", f"{object_path(obj)}?{query}", obj, content_type="application/apply-patch+yaml")

    def delete(self, obj_or_path: dict | str) -> None:
        """Delete an object; an absent one is fine."""
        path = obj_or_path if isinstance(obj_or_path, str) else object_path(obj_or_path)
        self.call("DELETE", path, ok=(200, 202, 404))

    def create_token(self, namespace: str, service_account: str, seconds: int = 86400) -> str:
        """A TokenRequest token for a ServiceAccount, as the kubelet mounts one into a pod."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds}}
        data = self.call("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token", body)
        return data["status"]["token"]
