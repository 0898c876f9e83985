"""The one error mapping, and how credentials are chosen and loaded (no network involved)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.api_core import exceptions as api_exceptions
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials
from google.oauth2 import service_account

from ansible_collections.crawl.egress_proxies.plugins.module_utils.errors import NotFound, Permanent, Transient
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.client import (
    classify,
    classify_exception,
    load_credentials,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.gcp.settings import GcpSettings


class ResumableRefreshError(auth_exceptions.RefreshError):
    """What google-auth raises when the token endpoint may answer later."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True)  # type: ignore[no-untyped-call]


@pytest.mark.parametrize(
    ("status", "reasons", "missing", "expected"),
    [
        (404, ["notFound"], "not_found", NotFound),
        (404, ["RESOURCE_NOT_FOUND"], "permanent", Permanent),  # an operation's image/network is missing
        (400, ["invalid"], "not_found", Permanent),
        (403, ["forbidden"], "not_found", Permanent),
        (409, ["alreadyExists"], "not_found", Permanent),
        (403, ["rateLimitExceeded"], "not_found", Transient),  # Google's rate limits are 403s
        (403, ["QUOTA_EXCEEDED"], "not_found", Transient),
        (429, ["rateLimitExceeded"], "not_found", Transient),
        (500, [], "not_found", Transient),
        (503, ["ZONE_RESOURCE_POOL_EXHAUSTED"], "permanent", Transient),
        (None, [], "not_found", Transient),
    ],
)
def test_status_and_reason_map_to_one_class(status: int | None, reasons: list[str], missing: str,
                                            expected: type) -> None:
    error = classify(status, reasons, "context: details", missing=missing)
    assert type(error) is expected
    assert str(error) == "context: details"


@pytest.mark.parametrize(
    ("kind", "args", "expected"),
    [
        (api_exceptions.NotFound, ("gone",), NotFound),
        (api_exceptions.Forbidden, ("no", [{"reason": "forbidden"}]), Permanent),
        (api_exceptions.Forbidden, ("slow down", [{"reason": "userRateLimitExceeded"}]), Transient),
        (api_exceptions.BadRequest, ("bad",), Permanent),
        (api_exceptions.TooManyRequests, ("429",), Transient),
        (api_exceptions.ServiceUnavailable, ("503",), Transient),
        (api_exceptions.InternalServerError, ("500",), Transient),
        (requests.exceptions.ConnectTimeout, ("timed out",), Transient),
        (requests.exceptions.ConnectionError, ("refused",), Transient),
        (auth_exceptions.TransportError, ("token endpoint down",), Transient),
        (auth_exceptions.RefreshError, ("invalid_grant",), Permanent),
        (ResumableRefreshError, ("try later",), Transient),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) and issubclass(value, Exception) else "",
)
def test_sdk_exceptions_are_classified(kind: type[Exception], args: tuple[Any, ...], expected: type) -> None:
    error = classify_exception(kind(*args), "getting instance x")
    assert type(error) is expected
    assert str(error).startswith("getting instance x: ")


def test_a_refused_token_never_quotes_the_sdk_text() -> None:
    refused: type[Exception] = auth_exceptions.RefreshError
    error = classify_exception(refused("invalid_grant: secret-ish detail"), "ctx")
    assert "secret-ish" not in str(error)


def settings(**overrides: Any) -> GcpSettings:
    values: dict[str, Any] = {"project": "test-project", "zones": ("europe-west1-b",),
                              "machine_types": {"small": "e2-small"}, "images": {"d": "projects/x/global/images/y"},
                              "default_machine_type": "small", "default_image": "d", **overrides}
    return GcpSettings(**values)


def service_account_key() -> dict[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return {"type": "service_account", "project_id": "test-project", "private_key_id": "k1", "private_key": pem,
            "client_email": "proxies@test-project.iam.gserviceaccount.com", "client_id": "1",
            "token_uri": "https://oauth2.googleapis.com/token"}


def test_a_service_account_key_file_is_loaded(tmp_path: Path) -> None:
    path = tmp_path / "key.json"
    path.write_text(json.dumps(service_account_key()))
    credentials = load_credentials(settings(credentials_file=str(path), api_endpoint="http://127.0.0.1:9"))
    assert isinstance(credentials, service_account.Credentials)  # the file wins over the emulator rule
    assert credentials.service_account_email == "proxies@test-project.iam.gserviceaccount.com"


def test_a_missing_key_file_is_transient(tmp_path: Path) -> None:
    with pytest.raises(Transient, match=r"^gcp\.credentialsFile: .*does not exist"):
        load_credentials(settings(credentials_file=str(tmp_path / "not-yet-mounted.json")))


@pytest.mark.parametrize("content", ["not json {", json.dumps({"type": "service_account", "private_key": "x"}),
                                     json.dumps({"type": "martian"})], ids=["not-json", "incomplete", "unknown-type"])
def test_a_key_file_that_does_not_parse_is_permanent_and_not_quoted(tmp_path: Path, content: str) -> None:
    path = tmp_path / "key.json"
    path.write_text(content)
    with pytest.raises(Permanent, match=r"^gcp\.credentialsFile: ") as caught:
        load_credentials(settings(credentials_file=str(path)))
    assert content not in str(caught.value)


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:8085", "http://localhost:8085", "http://[::1]:8085"])
def test_a_loopback_emulator_gets_anonymous_credentials(endpoint: str) -> None:
    assert isinstance(load_credentials(settings(api_endpoint=endpoint)), AnonymousCredentials)


def test_an_instance_in_transition_is_transient() -> None:
    # instances.delete answers 400 resourceNotReady while the instance is being created or deleted.
    assert type(classify(400, ["resourceNotReady"], "deleting instance x: 400 not ready")) is Transient


def test_an_unknown_zone_is_not_found_only_where_the_instance_was_asked_for() -> None:
    # The API's answer for a zone that does not exist: 400 invalid, "... Unknown zone." (not a 404).
    message = "getting instance x in zone z: 400 Invalid value for field 'zone': 'z'. Unknown zone."
    assert type(classify(400, ["invalid"], message)) is NotFound
    assert type(classify(400, ["invalid"], message, missing="permanent")) is Permanent


def test_missing_application_default_credentials_are_permanent_with_the_fix(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on: no metadata server
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no `gcloud auth application-default login` file
    monkeypatch.setenv("GCE_METADATA_IP", f"127.0.0.1:{port}")  # google-auth's GCE probe reads it per call
    with pytest.raises(Permanent) as caught:
        load_credentials(settings())
    message = str(caught.value)
    assert "gcp.credentialsFile" in message and "Workload Identity" in message
