"""Private by default, the controller's half (issue 13): a credential per Proxy namespace, kept
where only the controller reads it, delivered to instances as a hash, rotated make-before-break;
``spec.auth: none`` warned; a proxy the probe finds open never handed out; discovery scoped by
token, with credential URLs only for the token's own namespaces; the password nowhere else.

The squid side (407/403/204 through the delivered configuration) is proven through real squid in
tests/integration/test_squid_access.py; here the reconciler runs with the fakes of
tests/support/controller/fakes.py, the Secrets on the Kubernetes API emulator, the files for real.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import stat
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml
from kubernetes import client

from egress_proxies.cli import proxy_url
from egress_proxies.health import SweepHealth
from egress_proxies.http_server import ControllerHTTPServer, DiscoveryAccess, TokenScopes
from egress_proxies.serving.credentials import Credentials
from egress_proxies.serving.monitor import ServingMonitor
from egress_proxies.sources.file_secrets import FileSecrets
from egress_proxies.sources.kube import KubeSecrets
from egress_proxies.sweep.backoff import Backoff
from egress_proxies.sweep.reconcile import Reconciler, SweepParts
from support.controller.fakes import FakeRunner, MemoryStore, ScriptedProber, probe_settings
from support.kube.emulator import KubeEmulator

SPEC = {"provider": "home-kvm", "cloudInit": "#cloud-config\n"}
NOW = datetime.datetime(2026, 12, 3, tzinfo=datetime.UTC)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump({"owner": "test-owner", "providers": [
        {"name": "home-kvm", "type": "kvm", "allowedSources": ["10.20.0.0/16"], "kvm": {}}]}))
    return path


def created_access(runner: FakeRunner) -> list[dict[str, Any]]:
    return [op.args["access"] for call in runner.calls if call.verb == "create" for op in call.operations]


def test_a_namespace_credential_is_made_once_kept_private_and_delivered_as_a_hash(tmp_path: Path,
                                                                                   config: Path) -> None:
    secrets = FileSecrets(tmp_path / "credentials")
    credentials = Credentials(secrets)
    store, runner = MemoryStore(), FakeRunner()
    store.add("eu-1", SPEC)
    store.add("eu-2", SPEC)
    store.add("other", SPEC, namespace="team-b")
    Reconciler(store, runner, str(config), parts=SweepParts(backoff=Backoff(), credentials=credentials)).sweep()
    stored = tmp_path / "credentials" / "crawlers.yaml"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "credentials").stat().st_mode) == 0o700
    crawlers = credentials.current("crawlers")
    assert len(crawlers.password) >= 32  # 24 random bytes, url-safe base64: 192 bits
    assert crawlers.password != credentials.current("team-b").password
    accesses = created_access(runner)
    assert len(accesses) == 3
    for access in accesses:
        assert access["allowed_sources"] == ["10.20.0.0/16"] and access["open"] is False
        # The namespace's user, and the probe's identity for this instance (the same password).
        user, identity = access["users"]
        assert bcrypt.checkpw(credentials.current(user["name"].rsplit("-", 1)[0]).password.encode(),
                              user["password_hash"].encode())
        assert identity["name"].startswith("probe-") and identity["password_hash"] == user["password_hash"]
    # The password itself went nowhere: not in any module argument, status or Event.
    everything = json.dumps([c.operations for c in runner.calls], default=repr) + repr(store.objects) + repr(
        store.events)
    assert crawlers.password not in everything
    # A second controller process reads the same credential back.
    second = Credentials(FileSecrets(tmp_path / "credentials"))
    second.refresh(store.namespace_identities({"crawlers"}))
    assert second.current("crawlers") == crawlers


def test_rotation_replaces_instances_make_before_break(tmp_path: Path, config: Path) -> None:
    credentials = Credentials(FileSecrets(tmp_path / "credentials"))
    store, runner = MemoryStore(), FakeRunner()
    store.add("eu-1", SPEC)
    rec = Reconciler(store, runner, str(config), parts=SweepParts(backoff=Backoff(), credentials=credentials))
    rec.sweep()
    before = credentials.current("crawlers")
    (old,) = runner.instances
    (tmp_path / "credentials" / "crawlers.yaml").unlink()  # the operator rotates
    rec.sweep()
    after = credentials.current("crawlers")
    assert after.generation != before.generation and after.password != before.password
    # The old generation still answers (discovery keeps handing out what the old instance accepts)
    # until the successor, built with the new one, is Ready and the old one retired.
    assert credentials.by_generation("crawlers", before.generation) == before
    (new,) = runner.instances
    assert new != old
    assert store.get("eu-1").status["credentialGeneration"] == after.generation
    assert [r for r in store.reasons() if r in ("Replacing", "Replaced")] == ["Replacing", "Replaced"]


def test_auth_none_is_open_with_a_warning_and_explicit_sources(tmp_path: Path, config: Path) -> None:
    credentials = Credentials(FileSecrets(tmp_path / "credentials"))
    store, runner = MemoryStore(), FakeRunner()
    store.add("open", {**SPEC, "auth": "none", "allowedSources": ["0.0.0.0/0"]})
    rec = Reconciler(store, runner, str(config), parts=SweepParts(backoff=Backoff(), credentials=credentials))
    rec.sweep()
    (access,) = created_access(runner)
    assert access == {"users": [], "allowed_sources": ["0.0.0.0/0"], "allowed_destinations": [], "open": True}
    proxy = store.get("open")
    assert proxy.status["phase"] == "Ready"
    private = next(c for c in proxy.status["conditions"] if c["type"] == "Private")
    assert (private["status"], private["reason"]) == ("False", "AuthDisabled")
    rec.sweep()
    assert store.reasons("crawlers/open").count("AuthDisabled") == 1  # one Warning, not one per sweep


def test_internal_destinations_are_opened_by_the_proxy_else_by_its_provider(tmp_path: Path) -> None:
    """Like allowedSources: the Proxy's list wins, else the provider's; a change replaces the
    instance; a value that is not a network fails that Proxy alone, naming the field."""
    config = tmp_path / "providers.yaml"
    config.write_text(yaml.safe_dump({"owner": "test-owner", "providers": [
        {"name": "home-kvm", "type": "kvm", "allowedDestinations": ["192.168.122.1/32"], "kvm": {}}]}))
    credentials = Credentials(FileSecrets(tmp_path / "credentials"))
    store, runner = MemoryStore(), FakeRunner()
    store.add("provider-default", SPEC)
    store.add("own-list", {**SPEC, "allowedDestinations": ["10.128.0.0/20"]})
    store.add("bad", {**SPEC, "allowedDestinations": ["10.128.0.1/20"]})
    rec = Reconciler(store, runner, str(config), parts=SweepParts(backoff=Backoff(), credentials=credentials))
    rec.sweep()
    assert sorted(a["allowed_destinations"] for a in created_access(runner)) == [["10.128.0.0/20"],
                                                                               ["192.168.122.1/32"]]
    (ready,) = [c for c in store.get("bad").status["conditions"] if c["type"] == "Ready"]
    assert ready["reason"] == "InvalidSpec"
    assert ready["message"].startswith("spec.allowedDestinations[0]: must be a network in CIDR notation"), ready
    (before,) = [i for i in runner.instances if "own-list" in i]
    store.update_spec("own-list", allowedDestinations=["10.128.0.0/20", "10.129.0.0/20"])
    rec.sweep()
    (after,) = [i for i in runner.instances if "own-list" in i]
    assert after != before


def test_a_new_access_policy_replaces_every_instance_make_before_break(tmp_path: Path, config: Path) -> None:
    """An upgrade whose collection delivers a newer policy (provider_config_info's
    access_policy_version) replaces the instances built with the older one, as a rotation does."""
    credentials = Credentials(FileSecrets(tmp_path / "credentials"))
    store, runner = MemoryStore(), FakeRunner(policy_version="1")
    store.add("eu-1", SPEC)
    Reconciler(store, runner, str(config), parts=SweepParts(backoff=Backoff(), credentials=credentials)).sweep()
    (old,) = runner.instances
    runner.policy_version = "2"  # the controller restarts with the upgraded collection
    Reconciler(store, runner, str(config), parts=SweepParts(backoff=Backoff(), credentials=credentials)).sweep()
    (new,) = runner.instances
    assert new != old
    assert [r for r in store.reasons() if r in ("Replacing", "Replaced")] == ["Replacing", "Replaced"]


def test_a_proxy_that_serves_without_credentials_is_never_handed_out(tmp_path: Path, config: Path) -> None:
    credentials = Credentials(FileSecrets(tmp_path / "credentials"))
    store = MemoryStore()
    runner = FakeRunner(probe=probe_settings(tmp_path / "probe-key"))
    prober = ScriptedProber()
    prober.private["192.0.2.10"] = False  # it serves without credentials too: an open relay
    monitor = ServingMonitor(prober)  # type: ignore[arg-type]
    store.add("eu-1", SPEC)
    rec = Reconciler(store, runner, str(config),
                     parts=SweepParts(backoff=Backoff(), credentials=credentials, monitor=monitor))
    rec.sweep()
    monitor.probe_now()
    rec.sweep()
    (target,) = prober.targets
    assert target.expect_private and target.credentials is not None
    assert target.credentials.password == credentials.current("crawlers").password
    proxy = store.get("eu-1")
    assert proxy.status["phase"] == "Provisioning" and proxy.status["conditions"][0]["reason"] == "NotPrivate"
    assert rec.discovery.swept == [] and "NotPrivate" in store.reasons()


def test_secrets_rotate_by_annotation_on_the_kubernetes_secret(kube: KubeEmulator, api: client.ApiClient) -> None:
    kube.create_namespace("egress-proxies")
    backend = KubeSecrets(api, "egress-proxies")

    def sweeping() -> Credentials:
        credentials = Credentials(backend)
        credentials.refresh({"crawlers": "uid-of-crawlers"})
        return credentials

    first = sweeping().current("crawlers")
    core = client.CoreV1Api(api)
    secret = core.read_namespaced_secret(KubeSecrets.secret_name("crawlers"), "egress-proxies")
    assert secret.type == "Opaque" and "password" in (secret.data or {})
    assert sweeping().current("crawlers") == first  # read back, not made again
    core.patch_namespaced_secret(KubeSecrets.secret_name("crawlers"), "egress-proxies",
                                 {"metadata": {"annotations": {KubeSecrets.ROTATE_ANNOTATION: "please"}}})
    rotated = sweeping()
    second = rotated.current("crawlers")
    assert second.generation != first.generation
    assert rotated.by_generation("crawlers", first.generation) == first
    secret = core.read_namespaced_secret(KubeSecrets.secret_name("crawlers"), "egress-proxies")
    assert secret.metadata is not None and KubeSecrets.ROTATE_ANNOTATION not in (secret.metadata.annotations or {})
    assert sweeping().current("crawlers") == second


def test_discovery_is_scoped_by_token_and_only_scoped_tokens_get_credentials(
        tmp_path: Path, config: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    credentials = Credentials(FileSecrets(tmp_path / "credentials"))
    store, runner = MemoryStore(), FakeRunner()
    store.add("eu-1", SPEC)
    store.add("other", SPEC, namespace="team-b")
    rec = Reconciler(store, runner, str(config), parts=SweepParts(backoff=Backoff(), credentials=credentials))
    rec.sweep()
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump([{"name": "crawlers-team", "namespaces": ["crawlers"],
                                       "sha256": hashlib.sha256(b"team-token").hexdigest()}]))
    health = SweepHealth(60)
    health.sweep_started()
    health.sweep_finished(True)
    rec.discovery.serve_sweeps(True)  # a leader whose sweep has published
    server = ControllerHTTPServer(health, rec.discovery,
                                  DiscoveryAccess("operator-token", TokenScopes(tokens), proxy_url(credentials)))
    server.start("127.0.0.1", 0)

    def discovery(token: str, path: str = "/v1/proxies") -> tuple[int, str]:
        request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}",
                                         headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, ""

    try:
        current = credentials.current("crawlers")
        user, password = current.user, current.password
        code, body = discovery("team-token")
        (entry,) = json.loads(body)["proxies"]
        assert code == 200 and entry["namespace"] == "crawlers"
        assert entry["url"] == f"http://{user}:{password}@192.0.2.10:3128"
        assert discovery("team-token", "/v1/proxies.txt")[1] == f"http://{user}:{password}@192.0.2.10:3128\n"
        code, body = discovery("operator-token")
        assert code == 200 and len(json.loads(body)["proxies"]) == 2 and password not in body
        assert discovery("someone-else")[0] == 401
    finally:
        server.stop()
    assert password not in caplog.text
    assert password not in json.dumps([p.status for p in rec.discovery.swept])
