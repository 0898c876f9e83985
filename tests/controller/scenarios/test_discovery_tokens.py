"""Discovery tokens through the real ``egress-proxies`` command (issue 26, rows 8 and 12): the
tokens file is validated at start-up (a bad entry, the hash of an empty token, ``namespaces`` as
a string: the controller does not start, naming the entry and the field) and when it changes
while running (bad entries refused, good ones kept); an empty bearer token never gets anything;
a query string never reaches the log; the README's recipe cannot write the empty token's hash.

The controller serves a directory of Proxies on libvirt's test driver (a libvirtd), so discovery
has a Ready proxy with its credentials to hand out or to withhold.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.controller.command import ControllerProcess, proxy_document, recorded_status, run_refused

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[3]
# What hashing an unset variable gives: the hash no tokens file may hold.
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
TEAM_TOKEN = "team-token-0123456789abcdef0123456789abcdef"
OTHER_TOKEN = "other-token-0123456789abcdef0123456789abcdef"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def write_tokens(path: Path, entries: Any) -> None:
    """Write the tokens file with a modification time of its own (the controller reloads on change)."""
    before = path.stat().st_mtime if path.exists() else 0.0
    path.write_text(yaml.safe_dump(entries))
    os.utime(path, (before + 2, before + 2))


def command(tmp_path: Path, config: Path, tokens: Path) -> list[str]:
    return ["--source", "directory", "--proxy-dir", str(tmp_path / "proxies"), "--provider-config", str(config),
            "--work-dir", str(tmp_path / "work"), "--interval", "2", "--discovery-tokens", str(tokens)]


@pytest.mark.parametrize(("entries", "named"), [
    ([{"name": "crawlers", "namespaces": ["crawlers"], "sha256": EMPTY_SHA256}],
     "entry[0] (crawlers): sha256: is the hash of an empty token"),
    ([{"name": "crawlers", "namespaces": ["crawlers"], "sha256": digest(TEAM_TOKEN)},
      {"name": "shouty", "namespaces": ["crawlers"], "sha256": EMPTY_SHA256.upper()}],
     "entry[1] (shouty): sha256: is the hash of an empty token"),
    ([{"name": "team-b", "namespaces": "team-b", "sha256": digest(TEAM_TOKEN)}],
     "entry[0] (team-b): namespaces: must be a list of namespace names, not the string 'team-b'"),
    ([{"name": "team-b", "namespaces": ["../team-b"], "sha256": digest(TEAM_TOKEN)}],
     "entry[0] (team-b): namespaces[0]: must be a DNS-1123 label"),
    ([{"name": "team-b", "namespace": ["team-b"], "sha256": digest(TEAM_TOKEN)}],
     "entry[0] (team-b): namespace: unknown field"),
    ([{"name": "team-b", "namespaces": ["team-b"], "sha256": "not-hex"}],
     "entry[0] (team-b): sha256: must be the 64 hex digits"),
    ({"team-b": digest(TEAM_TOKEN)}, "must be a YAML list of entries {name, sha256, namespaces}, not dict"),
    (None, "must be a YAML list of entries"),
])
def test_a_bad_tokens_file_stops_the_controller_naming_the_entry_and_field(tmp_path: Path, entries: Any,
                                                                           named: str) -> None:
    tokens = tmp_path / "tokens.yaml"
    write_tokens(tokens, entries)
    (tmp_path / "proxies").mkdir()
    refused = run_refused(command(tmp_path, tmp_path / "providers.yaml", tokens))
    assert refused.returncode == 2, refused.stderr
    assert named in refused.stderr and str(tokens) in refused.stderr
    assert "does not start" in refused.stderr and "Traceback" not in refused.stderr


def test_a_missing_tokens_file_stops_the_controller(tmp_path: Path) -> None:
    (tmp_path / "proxies").mkdir()
    refused = run_refused(command(tmp_path, tmp_path / "providers.yaml", tmp_path / "nowhere.yaml"))
    assert refused.returncode == 2 and "nowhere.yaml: cannot be read" in refused.stderr, refused.stderr


def test_check_config_checks_the_tokens_file_without_starting(tmp_path: Path, testdriver_config: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    write_tokens(tokens, [{"name": "crawlers", "namespaces": "crawlers", "sha256": EMPTY_SHA256}])
    checked = run_refused(["--check-config", "--provider-config", str(testdriver_config), "--discovery-tokens",
                           str(tokens), "--work-dir", str(tmp_path / "work")], timeout=120)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert f"{testdriver_config}: valid" in checked.stdout  # the provider config is fine; the tokens are not
    assert "entry[0] (crawlers): sha256: is the hash of an empty token" in checked.stdout
    assert "entry[0] (crawlers): namespaces: must be a list of namespace names" in checked.stdout
    write_tokens(tokens, [{"name": "crawlers", "namespaces": ["crawlers"], "sha256": digest(TEAM_TOKEN)}])
    checked = run_refused(["--check-config", "--provider-config", str(testdriver_config), "--discovery-tokens",
                           str(tokens), "--work-dir", str(tmp_path / "work")], timeout=120)
    assert checked.returncode == 0 and f"{tokens}: valid" in checked.stdout, checked.stdout + checked.stderr


def test_empty_tokens_and_bad_entries_while_the_controller_runs(
        tmp_path: Path, testdriver_config: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    team = {"name": "crawlers", "namespaces": ["crawlers"], "sha256": digest(TEAM_TOKEN)}
    write_tokens(tokens, [team])
    (tmp_path / "proxies").mkdir()
    (tmp_path / "proxies" / "eu-1.yaml").write_text(yaml.safe_dump(proxy_document("eu-1")))
    with ControllerProcess([*command(tmp_path, testdriver_config, tokens), "--listen", "127.0.0.1:0"]) as controller:
        controller.wait_for(lambda: recorded_status(tmp_path / "proxies", "eu-1").get("phase") == "Ready", 180,
                            "the Proxy to be Ready")
        password = yaml.safe_load((tmp_path / "work" / "credentials" / "crawlers.yaml").read_text())["password"]
        code, body = controller.http("GET", "/v1/proxies.txt", authorization=f"Bearer {TEAM_TOKEN}")
        assert code == 200
        assert re.fullmatch(rf"http://crawlers-[0-9a-f]{{16}}:{re.escape(password)}@[0-9.]+:3128\n", body)

        # Row 8: an empty bearer token is no token, even once the file holds the empty token's
        # hash (read when it changed: that entry is refused, the others stay in force).
        write_tokens(tokens, [team, {"name": "empty", "namespaces": ["crawlers"], "sha256": EMPTY_SHA256},
                              {"name": "letters", "namespaces": "crawlers", "sha256": digest(OTHER_TOKEN)}])
        for authorization in ("Bearer ", "Bearer", "Bearer    ", "bearer \t"):
            code, body = controller.http("GET", "/v1/proxies.txt", authorization=authorization)
            assert (code, password in body) == (401, False), (authorization, code, body)
        # Row 12: `namespaces: crawlers` is no set of letters: that entry is refused as a whole.
        assert controller.http("GET", "/v1/proxies", authorization=f"Bearer {OTHER_TOKEN}")[0] == 401
        assert controller.http("GET", "/v1/proxies", authorization=f"Bearer {TEAM_TOKEN}")[0] == 200
        controller.wait_for(lambda: "entry[1] (empty): sha256: is the hash of an empty token" in controller.log()
                            and "entry[2] (letters): namespaces: must be a list" in controller.log(), 10,
                            "the ERROR naming the bad entries")
    assert password not in controller.output()


def test_a_query_string_never_reaches_the_log(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    write_tokens(tokens, [{"name": "crawlers", "namespaces": ["crawlers"], "sha256": digest(TEAM_TOKEN)}])
    (tmp_path / "proxies").mkdir()
    # No provider config: the sweeps fail, the HTTP port serves all the same.
    with ControllerProcess([*command(tmp_path, tmp_path / "providers.yaml", tokens), "--log-level",
                            "DEBUG", "--listen", "127.0.0.1:0"]) as controller:
        # A token in a query string (where none is ever read) is no token, and is never logged.
        code, _ = controller.http("GET", f"/v1/proxies.txt?token={OTHER_TOKEN}&access_token={TEAM_TOKEN}")
        assert code == 401
        assert controller.http("GET", f"/healthz?{OTHER_TOKEN}")[0] in (200, 503)
        controller.wait_for(lambda: '"GET /v1/proxies.txt' in controller.log() and '"GET /healthz' in
                            controller.log(), 10, "the requests' log lines")
    assert OTHER_TOKEN not in controller.output() and TEAM_TOKEN not in controller.output()
    assert '"GET /v1/proxies.txt" 401' in controller.log()  # the path, nothing after it


README_RECIPE = re.compile(r"^TEAM_TOKEN=.*?> tokens\.yaml[^\n]*$", re.M | re.S)


@pytest.mark.parametrize("openssl_works", [True, False])
def test_the_readme_recipe_never_writes_the_empty_tokens_hash(tmp_path: Path, openssl_works: bool) -> None:
    found = README_RECIPE.search((REPO / "README.md").read_text())
    assert found is not None, "the README's token recipe moved: update this test"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if not openssl_works:  # a variable left empty: openssl missing or failing, or a typo
        (bin_dir / "openssl").write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / "openssl").chmod(0o755)
    subprocess.run(["bash", "-c", found.group(0)], cwd=tmp_path, check=False, capture_output=True, timeout=30,
                   env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    written = tmp_path / "tokens.yaml"
    if not openssl_works:
        assert not written.exists() or EMPTY_SHA256 not in written.read_text()
        return
    from egress_proxies.http_server import parse_tokens  # what the controller reads the file with

    entries, problems = parse_tokens(yaml.safe_load(written.read_text()))
    assert problems == [] and len(entries) == 1 and EMPTY_SHA256 not in entries
