"""The Kubernetes API edge: the one error mapping, loading the connection config, and what the
real client does on the wire (against the emulator, a closed port and a server that never answers)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import (
    NOT_FOUND,
    PERMANENT,
    TRANSIENT,
    NotFound,
    Permanent,
    Transient,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s import client as k8s_client
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.client import (
    AlreadyExists,
    KubeClient,
    classify,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.settings import KubernetesSettings
from support.collection.provider_config import write_kubeconfig
from support.kube.emulator import KubeEmulator


def api_error(status: int, reason: str = "", message: str = "the server says no") -> ApiException:
    body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                       "reason": reason, "code": status})
    return ApiException(status=status, reason="HTTP reason", body=body)


@pytest.mark.parametrize(
    ("status", "reason", "error_class"),
    [
        (404, "NotFound", NOT_FOUND),
        (400, "BadRequest", PERMANENT),
        (401, "Unauthorized", PERMANENT),
        (403, "Forbidden", PERMANENT),
        (405, "MethodNotAllowed", PERMANENT),
        (413, "RequestEntityTooLarge", PERMANENT),
        (415, "UnsupportedMediaType", PERMANENT),
        (422, "Invalid", PERMANENT),
        (409, "Conflict", TRANSIENT),  # a stale uid precondition: look again and retry
        (410, "Expired", TRANSIENT),
        (429, "TooManyRequests", TRANSIENT),
        (500, "InternalError", TRANSIENT),
        (503, "ServiceUnavailable", TRANSIENT),
        (504, "Timeout", TRANSIENT),
    ],
)
def test_http_statuses_map_to_error_classes(status: int, reason: str, error_class: str) -> None:
    error = classify(api_error(status, reason), "reading pod egress/p")
    assert error.error_class == error_class
    assert not isinstance(error, AlreadyExists)
    assert str(error) == f"reading pod egress/p: {status} the server says no"


def test_409_already_exists_is_its_own_class_for_create_to_resolve() -> None:
    error = classify(api_error(409, "AlreadyExists"), "creating pod egress/p")
    assert isinstance(error, AlreadyExists)
    assert error.error_class == TRANSIENT  # if a caller does not resolve it, it is retried


def test_a_body_that_is_not_a_status_falls_back_to_the_http_reason() -> None:
    error = classify(ApiException(status=502, reason="Bad Gateway", body="<html>proxy error</html>"), "listing")
    assert isinstance(error, Transient)
    assert str(error) == "listing: 502 Bad Gateway"


def test_a_tls_verification_failure_is_permanent_other_transport_errors_transient() -> None:
    tls = ApiException(status=0, reason="SSLError\n[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    assert isinstance(classify(tls, "reading pod egress/p"), Permanent)
    pool = urllib3.HTTPConnectionPool("127.0.0.1", 9)
    refused = urllib3.exceptions.MaxRetryError(pool, "/api", reason=ConnectionRefusedError(111, "refused"))
    assert isinstance(classify(refused, "reading pod egress/p"), Transient)
    assert isinstance(classify(TimeoutError("timed out"), "reading pod egress/p"), Transient)
    assert isinstance(classify(ConfigException("Invalid kube-config file."), "loading"), Permanent)
    already = NotFound("already classified")
    assert classify(already, "x") is already


# -- the connection config -------------------------------------------------------------------


def settings(kubeconfig: Path | None) -> KubernetesSettings:
    return KubernetesSettings(namespace="egress", image="squid", kubeconfig=str(kubeconfig) if kubeconfig else None)


def test_a_kubeconfig_that_is_not_there_yet_is_transient(tmp_path: Path) -> None:
    with pytest.raises(Transient, match=r"^kubernetes\.kubeconfig: .*/absent does not exist \(yet\)"):
        KubeClient(settings(tmp_path / "absent"))


@pytest.mark.parametrize(
    "content",
    ["clusters: [\n  {name: x\n", "- just\n- a list\n", "apiVersion: v1\nkind: Config\n", ""],
    ids=["not-yaml", "not-a-mapping", "no-context", "empty"],
)
def test_a_kubeconfig_that_does_not_parse_is_permanent(tmp_path: Path, content: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(content)
    with pytest.raises(Permanent, match=r"^kubernetes\.kubeconfig: .* is not a usable kubeconfig"):
        KubeClient(settings(path))


def test_no_kubeconfig_outside_a_cluster_is_permanent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(Permanent, match=r"^kubernetes\.kubeconfig: not set, and not running inside a cluster"):
        KubeClient(settings(None))


def test_in_cluster_without_a_service_account_token_is_permanent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-cluster branch for real: this machine has no /var/run/secrets/kubernetes.io."""
    assert not Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists()
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(Permanent, match="in-cluster config is not a usable kubeconfig: Service token file"):
        KubeClient(settings(None))


# -- on the wire -----------------------------------------------------------------------------


@pytest.fixture
def kube() -> Iterator[KubeEmulator]:
    with KubeEmulator(namespaces=["egress"]) as emulator:
        yield emulator


def client_for(tmp_path: Path, server: str) -> KubeClient:
    return KubeClient(settings(write_kubeconfig(tmp_path / "kubeconfig", server)))


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_answers_are_not_retried_inside_the_call(tmp_path: Path, kube: KubeEmulator,
                                                              status: int) -> None:
    """urllib3 would retry these three times, sleeping Retry-After each time; the controller
    backs off per object instead, so one answer is one request."""
    kube.fail_next("GET", r"/pods/p$", status, count=5, retry_after=1)
    # Built before the clock starts: the first client pays the kubernetes package's lazy
    # imports (measured 2.4 s on a loaded machine), which is not what is timed here.
    kube_client = client_for(tmp_path, kube.url)
    started = time.monotonic()
    with pytest.raises(Transient, match=f"^reading pod egress/p: {status} injected failure"):
        kube_client.read_pod("egress", "p")
    assert time.monotonic() - started < 1
    assert kube.requests() == [("GET", "/api/v1/namespaces/egress/pods/p")]


def test_a_closed_port_is_transient_and_quick(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(Transient, match=r"^listing pods in namespace egress: MaxRetryError"):
        client_for(tmp_path, f"http://127.0.0.1:{port}").list_pods("egress", "")
    assert time.monotonic() - started < 5  # two connect retries with a short backoff


def test_a_server_that_never_answers_times_out_transient(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(k8s_client, "REQUEST_TIMEOUT", (0.5, 0.5))
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)  # accepts (in the backlog) and never says a word
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(Transient, match=r"ReadTimeoutError|timed out"):
            client_for(tmp_path, url).read_pod("egress", "p")
    assert time.monotonic() - started < 3


def test_calls_speak_plain_json_dicts(tmp_path: Path, kube: KubeEmulator) -> None:
    client = client_for(tmp_path, kube.url)
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "squid"}]}}
    created = client.create_pod("egress", manifest)
    assert created["metadata"]["uid"] and created["status"] == {"phase": "Pending"}
    assert client.read_pod("egress", "p")["metadata"]["uid"] == created["metadata"]["uid"]
    assert [pod["metadata"]["name"] for pod in client.list_pods("egress", "a=b")] == ["p"]
    assert client.list_pods("egress", "a=c") == []
    with pytest.raises(Transient, match="409"):  # a uid precondition that no longer holds
        client.delete_pod("egress", "p", "0000-not-the-uid")
    client.delete_pod("egress", "p", created["metadata"]["uid"])
    with pytest.raises(NotFound):
        client.read_pod("egress", "p")
    client.close()
