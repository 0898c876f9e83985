"""serving/credentials.py: one credential per Proxy namespace -- made once, kept in a 0600 file
(FileSecrets, for real on tmp_path) or a backend, rotated keeping the previous one -- and the
access each Proxy's instance is built with (AccessPolicy)."""

from __future__ import annotations

import logging
import stat
import threading
from collections.abc import Mapping
from pathlib import Path

import bcrypt
import pytest
import yaml

from egress_proxies.resources.proxy import Proxy
from egress_proxies.serving.credentials import AccessPolicy, Credential, Credentials, FileSecrets, new_credential


class MemorySecrets:
    """A SecretBackend in memory, with the rotation flag the Kubernetes Secret's annotation sets."""

    def __init__(self) -> None:
        self.data: dict[str, dict[str, str]] = {}
        self.rotate: set[str] = set()
        self.saves = 0

    def load(self, namespace: str) -> tuple[dict[str, str], bool] | None:
        found = self.data.get(namespace)
        return None if found is None else (dict(found), namespace in self.rotate)

    def save(self, namespace: str, data: Mapping[str, str]) -> None:
        self.saves += 1
        self.data[namespace] = dict(data)
        self.rotate.discard(namespace)


def proxy(namespace: str = "crawlers", **spec: object) -> Proxy:
    return Proxy(namespace=namespace, name="eu-1", uid="uid-1", spec={"provider": "home-kvm", **spec})


def test_a_new_credential_is_random_and_only_its_bcrypt_hash_matches() -> None:
    first, second = new_credential("crawlers"), new_credential("crawlers")
    assert first.user == "crawl-crawlers" and first.password != second.password
    assert len(first.password) >= 32  # 24 random bytes, URL-safe base64
    assert bcrypt.checkpw(first.password.encode(), first.password_hash.encode())
    assert first.password not in first.password_hash and first.generation != second.generation


def test_the_password_is_not_in_the_repr_and_the_url_quotes_it() -> None:
    credential = Credential("crawlers", "crawl-crawlers", "p@ss:w/rd", "$2b$hash", "g1")
    assert "p@ss" not in repr(credential) and "$2b$hash" not in repr(credential)
    assert credential.proxy_url("192.0.2.10:3128") == "http://crawl-crawlers:p%40ss%3Aw%2Frd@192.0.2.10:3128"


def test_a_credential_is_made_once_per_namespace_and_stored() -> None:
    backend = MemorySecrets()
    credentials = Credentials(backend)
    first = credentials.current("crawlers")
    assert credentials.current("crawlers") is first
    credentials.refresh()
    assert credentials.current("crawlers") == first  # read back, not made again
    assert backend.saves == 1 and credentials.current("other") != first


def test_threads_asking_at_once_get_one_credential() -> None:
    backend = MemorySecrets()
    credentials = Credentials(backend)
    seen: list[Credential] = []
    threads = [threading.Thread(target=lambda: seen.append(credentials.current("crawlers"))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert backend.saves == 1 and len({c.generation for c in seen}) == 1


def test_incomplete_stored_fields_are_made_anew() -> None:
    backend = MemorySecrets()
    backend.data["crawlers"] = {"user": "crawl-crawlers"}
    credential = Credentials(backend).current("crawlers")
    assert credential.password and backend.data["crawlers"]["password"] == credential.password


def test_a_rotation_asked_for_makes_a_new_one_and_keeps_the_previous() -> None:
    backend = MemorySecrets()
    credentials = Credentials(backend)
    old = credentials.current("crawlers")
    backend.rotate.add("crawlers")
    credentials.refresh()
    new = credentials.current("crawlers")
    assert new.generation != old.generation
    assert credentials.by_generation("crawlers", old.generation) == old
    assert backend.data["crawlers"]["previous.password"] == old.password  # kept for the instances built with it
    credentials.refresh()
    assert credentials.by_generation("crawlers", old.generation) == old  # also after reading it back


@pytest.mark.parametrize("generation", [None, ""])
def test_by_generation_without_one_is_the_current(generation: str | None) -> None:
    credentials = Credentials(MemorySecrets())
    assert credentials.by_generation("crawlers", generation) == credentials.current("crawlers")


def test_by_generation_of_an_unknown_generation_is_none() -> None:
    assert Credentials(MemorySecrets()).by_generation("crawlers", "not-a-generation") is None


def test_the_file_is_0600_in_a_0700_directory(tmp_path: Path) -> None:
    directory = tmp_path / "credentials"
    credential = Credentials(FileSecrets(directory)).current("crawlers")
    path = directory / "crawlers.yaml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert yaml.safe_load(path.read_text())["password"] == credential.password
    assert [p.name for p in directory.iterdir()] == ["crawlers.yaml"]  # no temporary file left


def test_a_directory_made_too_wide_is_narrowed_on_save(tmp_path: Path) -> None:
    directory = tmp_path / "credentials"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    FileSecrets(directory).save("crawlers", {"user": "u"})
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


def test_deleting_the_file_rotates_and_keeps_the_previous(tmp_path: Path) -> None:
    directory = tmp_path / "credentials"
    credentials = Credentials(FileSecrets(directory))
    old = credentials.current("crawlers")
    (directory / "crawlers.yaml").unlink()
    credentials.refresh()
    new = credentials.current("crawlers")
    assert new.password != old.password
    assert credentials.by_generation("crawlers", old.generation) == old
    assert yaml.safe_load((directory / "crawlers.yaml").read_text())["previous.generation"] == old.generation


@pytest.mark.parametrize("content", ["[unclosed", "just a string", "- a\n- list\n"])
def test_an_unreadable_file_is_made_anew_without_logging_its_content(tmp_path: Path, content: str,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    directory = tmp_path / "credentials"
    directory.mkdir()
    (directory / "crawlers.yaml").write_text(content)
    credential = Credentials(FileSecrets(directory)).current("crawlers")
    assert yaml.safe_load((directory / "crawlers.yaml").read_text())["password"] == credential.password
    assert content not in caplog.text


def test_access_is_the_namespace_credential_from_the_providers_sources() -> None:
    credentials = Credentials(MemorySecrets())
    policy = AccessPolicy(credentials, {"home-kvm": ("10.0.0.0/8",)})
    credential = credentials.current("crawlers")
    request = policy.request(proxy())
    assert request.users == ((credential.user, credential.password_hash),)
    assert request.allowed_sources == ("10.0.0.0/8",) and not request.open
    assert request.generation == credential.generation
    assert credential.password not in repr(request) and credential.password not in str(request.arguments())


def test_allowed_sources_of_the_proxy_win_over_the_providers() -> None:
    policy = AccessPolicy(Credentials(MemorySecrets()), {"home-kvm": ("10.0.0.0/8",)})
    assert policy.request(proxy(allowedSources=["192.0.2.0/24"])).allowed_sources == ("192.0.2.0/24",)


def test_allowed_destinations_of_the_proxy_win_over_the_providers_and_carry_the_policy_version() -> None:
    policy = AccessPolicy(Credentials(MemorySecrets()), {}, {"home-kvm": ("192.168.122.1/32",)}, "2")
    assert policy.request(proxy()).allowed_destinations == ("192.168.122.1/32",)
    mine = policy.request(proxy(allowedDestinations=["10.128.0.0/20"], auth="none"))
    assert (mine.allowed_destinations, mine.policy_version) == (("10.128.0.0/20",), "2")


def test_auth_none_is_open_with_no_users_and_no_probe_credentials() -> None:
    backend = MemorySecrets()
    policy = AccessPolicy(Credentials(backend), {})
    request = policy.request(proxy(auth="none"))
    assert request.open and request.users == () and request.arguments()["users"] == []
    assert policy.probe_credentials(proxy(auth="none"), None) is None
    assert backend.saves == 0  # no credential made for an open proxy


def test_the_probe_authenticates_with_the_generation_the_instance_was_built_with() -> None:
    backend = MemorySecrets()
    credentials = Credentials(backend)
    policy = AccessPolicy(credentials, {})
    old = credentials.current("crawlers")
    backend.rotate.add("crawlers")
    credentials.refresh()
    probe = policy.probe_credentials(proxy(), old.generation)
    assert probe is not None and (probe.user, probe.password) == (old.user, old.password)
    assert policy.probe_credentials(proxy(), "unknown") is None
