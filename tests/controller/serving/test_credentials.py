"""serving/credentials.py: one credential per Proxy namespace -- made once, kept in a 0600 file
(FileSecrets, for real on tmp_path) or a backend, rotated keeping the previous one, bound to the
namespace's identity and retired a grace period after its last Proxy -- and the access each
Proxy's instance is built with (AccessPolicy)."""

from __future__ import annotations

import logging
import re
import stat
import threading
from collections.abc import Mapping
from pathlib import Path

import bcrypt
import pytest
import yaml

from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import parse_access
from egress_proxies.resources.proxy import Proxy
from egress_proxies.serving.credentials import (
    AccessPolicy,
    Credential,
    Credentials,
    SecretBackend,
    UnknownNamespace,
    new_credential,
)
from egress_proxies.sources.file_secrets import FileSecrets
from support.controller.fakes import ManualClock as Clock

# The identities of the namespaces that have Proxies in most tests (their uids on Kubernetes).
IDENTITIES = {"crawlers": "uid-crawlers", "other": "uid-other"}


class MemorySecrets:
    """A SecretBackend in memory, with the rotation flag the Kubernetes Secret's annotation sets."""

    def __init__(self) -> None:
        self.data: dict[str, dict[str, str]] = {}
        self.rotate: set[str] = set()
        self.saves = 0

    def load(self, namespace: str) -> tuple[dict[str, str], bool] | None:
        found = self.data.get(namespace)
        return None if found is None else (dict(found), namespace in self.rotate)

    def load_all(self) -> dict[str, tuple[dict[str, str], bool]]:
        return {namespace: (dict(data), namespace in self.rotate) for namespace, data in self.data.items()}

    def save(self, namespace: str, data: Mapping[str, str]) -> None:
        self.saves += 1
        self.data[namespace] = dict(data)
        self.rotate.discard(namespace)

    def delete(self, namespace: str) -> None:
        self.data.pop(namespace, None)
        self.rotate.discard(namespace)


def refreshed(backend: SecretBackend, identities: Mapping[str, str] = IDENTITIES, scope: str | None = None,
              clock: Clock | None = None) -> Credentials:
    """Credentials as a sweep leaves them: refreshed with the namespaces that have Proxies."""
    credentials = Credentials(backend, GRACE, scope=scope, clock=clock or Clock())
    credentials.refresh(identities)
    return credentials


GRACE = 600.0


def proxy(namespace: str = "crawlers", **spec: object) -> Proxy:
    return Proxy(namespace=namespace, name="eu-1", uid="uid-1", spec={"provider": "home-kvm", **spec})


def test_a_new_credential_is_random_and_only_its_bcrypt_hash_matches() -> None:
    first, second = new_credential("crawlers"), new_credential("crawlers")
    assert re.fullmatch(r"crawlers-[0-9a-f]{16}", first.user) and first.user != second.user
    assert first.password != second.password
    assert len(first.password) >= 32  # 24 random bytes, URL-safe base64
    assert bcrypt.checkpw(first.password.encode(), first.password_hash.encode())
    assert first.password not in first.password_hash and first.generation != second.generation


def test_the_password_is_not_in_the_repr_and_the_url_quotes_it() -> None:
    credential = Credential("crawlers", "crawl-crawlers", "p@ss:w/rd", "$2b$hash", "g1")
    assert "p@ss" not in repr(credential) and "$2b$hash" not in repr(credential)
    assert credential.proxy_url("192.0.2.10:3128") == "http://crawl-crawlers:p%40ss%3Aw%2Frd@192.0.2.10:3128"


def test_a_credential_is_made_once_per_namespace_and_stored() -> None:
    backend = MemorySecrets()
    credentials = refreshed(backend)
    first = credentials.current("crawlers")
    assert credentials.current("crawlers") is first
    credentials.refresh(IDENTITIES)
    assert credentials.current("crawlers") == first  # read back, not made again
    assert backend.saves == 1 and credentials.current("other") != first


def test_threads_asking_at_once_get_one_credential() -> None:
    backend = MemorySecrets()
    credentials = refreshed(backend)
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
    credential = refreshed(backend).current("crawlers")
    assert credential.password and backend.data["crawlers"]["password"] == credential.password


def test_a_rotation_asked_for_makes_a_new_one_and_keeps_the_previous() -> None:
    backend = MemorySecrets()
    credentials = refreshed(backend)
    old = credentials.current("crawlers")
    backend.rotate.add("crawlers")
    credentials.refresh(IDENTITIES)
    new = credentials.current("crawlers")
    assert new.generation != old.generation
    assert credentials.by_generation("crawlers", old.generation) == old
    assert backend.data["crawlers"]["previous.password"] == old.password  # kept for the instances built with it
    credentials.refresh(IDENTITIES)
    assert credentials.by_generation("crawlers", old.generation) == old  # also after reading it back


@pytest.mark.parametrize("generation", [None, ""])
def test_by_generation_without_one_is_none(generation: str | None) -> None:
    credentials = refreshed(MemorySecrets())
    credentials.current("crawlers")
    assert credentials.by_generation("crawlers", generation) is None  # never a guess at the password


def test_by_generation_of_an_unknown_generation_is_none() -> None:
    assert refreshed(MemorySecrets()).by_generation("crawlers", "not-a-generation") is None


def test_the_file_is_0600_in_a_0700_directory(tmp_path: Path) -> None:
    directory = tmp_path / "credentials"
    credential = refreshed(FileSecrets(directory)).current("crawlers")
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
    credentials = refreshed(FileSecrets(directory))
    old = credentials.current("crawlers")
    (directory / "crawlers.yaml").unlink()
    credentials.refresh(IDENTITIES)
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
    credential = refreshed(FileSecrets(directory)).current("crawlers")
    assert yaml.safe_load((directory / "crawlers.yaml").read_text())["password"] == credential.password
    assert content not in caplog.text


def test_access_is_the_namespace_credential_from_the_providers_sources() -> None:
    credentials = refreshed(MemorySecrets())
    policy = AccessPolicy(credentials, {"home-kvm": ("10.0.0.0/8",)})
    credential = credentials.current("crawlers")
    request = policy.request(proxy())
    assert request.users == ((credential.user, credential.password_hash),)
    assert request.allowed_sources == ("10.0.0.0/8",) and not request.open
    assert request.generation == credential.generation
    assert credential.password not in repr(request) and credential.password not in str(request.arguments())


def test_allowed_sources_of_the_proxy_win_over_the_providers() -> None:
    policy = AccessPolicy(refreshed(MemorySecrets()), {"home-kvm": ("10.0.0.0/8",)})
    assert policy.request(proxy(allowedSources=["192.0.2.0/24"])).allowed_sources == ("192.0.2.0/24",)


def test_allowed_destinations_of_the_proxy_win_over_the_providers_and_carry_the_policy_version() -> None:
    policy = AccessPolicy(refreshed(MemorySecrets()), {}, {"home-kvm": ("192.168.122.1/32",)}, "2")
    assert policy.request(proxy()).allowed_destinations == ("192.168.122.1/32",)
    mine = policy.request(proxy(allowedDestinations=["10.128.0.0/20"], auth="none"))
    assert (mine.allowed_destinations, mine.policy_version) == (("10.128.0.0/20",), "2")


def test_auth_none_is_open_with_no_users_and_no_probe_credentials() -> None:
    backend = MemorySecrets()
    policy = AccessPolicy(refreshed(backend), {})
    request = policy.request(proxy(auth="none"))
    assert request.open and request.users == () and request.arguments()["users"] == []
    assert policy.probe_credentials(proxy(auth="none"), None) is None
    assert backend.saves == 0  # no credential made for an open proxy


def test_the_probe_authenticates_with_the_generation_the_instance_was_built_with() -> None:
    backend = MemorySecrets()
    credentials = refreshed(backend)
    policy = AccessPolicy(credentials, {})
    old = credentials.current("crawlers")
    backend.rotate.add("crawlers")
    credentials.refresh(IDENTITIES)
    probe = policy.probe_credentials(proxy(), old.generation)
    assert probe is not None and (probe.user, probe.password) == (old.user, old.password)
    assert policy.probe_credentials(proxy(), "unknown") is None


# -- bound to the namespace's identity (issue 26, row 10) -------------------------------------------


def test_a_namespace_made_again_under_its_name_gets_a_new_credential_never_the_old() -> None:
    backend = MemorySecrets()
    credentials = refreshed(backend)
    old = credentials.current("crawlers")
    backend.rotate.add("other")  # unrelated: only the re-created namespace is concerned
    credentials.refresh({**IDENTITIES, "crawlers": "uid-of-the-new-namespace"})
    new = credentials.current("crawlers")
    assert new.password != old.password and new.identity == "uid-of-the-new-namespace"
    # Nothing of the old one is kept as a previous credential: no URL, no probe with it.
    assert credentials.by_generation("crawlers", old.generation) is None
    assert not [key for key in backend.data["crawlers"] if key.startswith("previous.")]
    assert backend.data["crawlers"]["namespaceIdentity"] == "uid-of-the-new-namespace"


def test_a_stored_credential_without_an_identity_is_not_handed_to_a_namespace() -> None:
    backend = MemorySecrets()
    legacy = new_credential("crawlers")  # written before credentials recorded their namespace
    backend.data["crawlers"] = legacy.as_data() | {"namespaceIdentity": ""}
    current = refreshed(backend).current("crawlers")
    assert current.password != legacy.password and current.identity == IDENTITIES["crawlers"]


def test_no_credential_for_a_namespace_the_sweep_did_not_list() -> None:
    backend = MemorySecrets()
    credentials = refreshed(backend, {"other": "uid-other"})
    with pytest.raises(UnknownNamespace):
        credentials.current("crawlers")
    assert not credentials.knows("crawlers") and credentials.knows("other")
    assert backend.saves == 0


def test_discovery_only_reads_and_never_makes_a_credential() -> None:
    backend, clock = MemorySecrets(), Clock()
    leader = refreshed(backend)
    made = leader.current("crawlers")
    standby = Credentials(backend, clock=clock)  # never refreshed: a standby serving discovery
    assert standby.by_generation("crawlers", made.generation) == made
    assert standby.by_generation("crawlers", "other-generation") is None
    assert standby.by_generation("team-b", "any") is None and standby.by_generation("../x", "any") is None
    assert backend.saves == 1 and set(backend.data) == {"crawlers"}
    backend.rotate.add("crawlers")  # the leader rotates: the standby follows after a while
    leader.refresh(IDENTITIES)
    rotated = leader.current("crawlers")
    assert standby.by_generation("crawlers", rotated.generation) is None
    clock.now += 10
    assert standby.by_generation("crawlers", rotated.generation) == rotated
    assert standby.by_generation("crawlers", made.generation) == made  # the previous one, for its instances


# -- retired a grace period after the namespace's last Proxy ------------------------------------------


def test_a_credential_outlives_the_last_proxy_of_its_namespace_by_the_grace_period_only() -> None:
    backend, clock = MemorySecrets(), Clock()
    credentials = refreshed(backend, clock=clock)
    first = credentials.current("crawlers")
    credentials.refresh({})  # the last Proxy of the namespace is gone
    assert backend.data["crawlers"]["unusedSince"]
    clock.now += GRACE - 1
    credentials.refresh(IDENTITIES)  # one came back in time: same credential, no longer marked
    assert credentials.current("crawlers") == first and "unusedSince" not in backend.data["crawlers"]
    credentials.refresh({})
    clock.now += GRACE - 1
    credentials.refresh({})
    assert "crawlers" in backend.data
    clock.now += 1
    credentials.refresh({})
    assert "crawlers" not in backend.data
    credentials.refresh(IDENTITIES)  # a namespace of that name, later, even with the same identity
    again = credentials.current("crawlers")
    assert again.password != first.password and credentials.by_generation("crawlers", first.generation) is None


def test_a_rotation_asked_for_an_unused_credential_removes_it_at_once() -> None:
    backend = MemorySecrets()
    credentials = refreshed(backend)
    credentials.current("crawlers")
    backend.rotate.add("crawlers")
    credentials.refresh({"other": "uid-other"})
    assert "crawlers" not in backend.data


def test_a_controller_watching_one_namespace_retires_only_its_own() -> None:
    backend, clock = MemorySecrets(), Clock()
    refreshed(backend, {"crawlers": "a", "other": "b", "team-b": "c"}).current("other")
    backend.data["team-b"] = new_credential("team-b", "c").as_data()
    credentials = refreshed(backend, {}, scope="team-b", clock=clock)
    clock.now += GRACE
    credentials.refresh({})
    assert set(backend.data) == {"other"}  # another controller's namespace is not this one's to retire


# -- the file store takes namespace names only (issue 26, row 9) ------------------------------------


@pytest.mark.parametrize("namespace", ["../../x", "../crawlers", "a/b", "", ".hidden", "UPPER", "x" * 64])
def test_the_file_store_refuses_a_namespace_that_is_no_namespace_name(tmp_path: Path, namespace: str) -> None:
    directory = tmp_path / "store" / "credentials"
    directory.mkdir(parents=True)
    (tmp_path / "store" / "x.yaml").write_text("kept: as it was\n")
    secrets = FileSecrets(directory)
    with pytest.raises(ValueError, match="DNS-1123 label"):
        secrets.save(namespace, {"user": "u"})
    with pytest.raises(ValueError, match="DNS-1123 label"):
        secrets.load(namespace)
    with pytest.raises(ValueError, match="DNS-1123 label"):
        secrets.delete(namespace)
    assert (tmp_path / "store" / "x.yaml").read_text() == "kept: as it was\n"
    assert sorted(p.name for p in (tmp_path / "store").rglob("*")) == ["credentials", "x.yaml"]


def test_the_file_store_lists_only_namespace_files(tmp_path: Path) -> None:
    directory = tmp_path / "credentials"
    secrets = FileSecrets(directory)
    secrets.save("crawlers", {"user": "u"})
    (directory / "Not_A_Namespace.yaml").write_text("user: x\n")
    (directory / "notes.txt").write_text("hello\n")
    assert secrets.load_all() == {"crawlers": ({"user": "u"}, False)}
    secrets.delete("crawlers")
    secrets.delete("crawlers")  # gone already: fine
    assert secrets.load_all() == {}


def test_a_user_name_is_as_unguessable_as_the_password() -> None:
    """squid caches one authentication state per user name: a stranger must not be able to name one."""
    first, second = new_credential("crawlers"), new_credential("crawlers")
    assert first.user != second.user
    assert first.user.startswith("crawlers-") and len(first.user) == len("crawlers-") + 16
    longest = new_credential("n" * 63)
    assert len(longest.user) <= 64 and longest.user.startswith("n" * 47 + "-")
    # What the modules' access option takes as a user name.
    assert parse_access({"users": [{"name": longest.user, "password_hash": longest.password_hash}]}) is not None
