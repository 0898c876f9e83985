"""cli.py, the ``egress-proxies`` command line: argument errors (through the installed command and
in this process), the pieces it builds, and what it prints."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest
import yaml

from egress_proxies.cli import (
    Settings,
    build_parser,
    build_pools,
    build_store,
    check_config,
    parse_args,
    print_proxies,
    proxy_url,
)
from egress_proxies.providers.runner import AnsibleRunner
from egress_proxies.resources.proxy import Proxy
from egress_proxies.serving.credentials import Credentials
from egress_proxies.sources.directory import DirectoryStore
from egress_proxies.sources.directory_pools import DirectoryPools
from egress_proxies.sources.file_secrets import FileSecrets
from support.controller.fakes import FakeRunner

EGRESS_PROXIES = str(Path(sys.executable).parent / "egress-proxies")


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--log-level", "foo"], "--log-level: invalid choice"),
    (["--interval", "-5"], "--interval: '-5' must be at least 0.1"),
    (["--interval", "abc"], "--interval: 'abc' is not a number of seconds"),
    (["--listen", "[::1]:x"], "--listen: '[::1]:x' is not HOST:PORT"),
    (["--listen", "::1:8080"], "write an IPv6 host in brackets"),
    (["--keep-artifacts", "-1"], "--keep-artifacts: '-1' must be at least 0"),
    (["--batch-size", "0"], "--batch-size: '0' must be at least 1"),
    (["--listen", "host:65536"], "--listen: 'host:65536' is not HOST:PORT with a port 0-65535"),
    (["--listen", ":8080"], "write an IPv6 host in brackets"),
    (["--interval", "nan"], "--interval: 'nan' must be at least 0.1"),
    (["--max-runners", "2.5"], "--max-runners: '2.5' is not a whole number"),
    (["--credential-grace", "-1"], "--credential-grace: '-1' must be at least 0"),
    (["--metrics-listen", "9090"], "--metrics-listen: '9090' is not HOST:PORT"),
    (["probe-target", "--key-file", "k", "--controller-network", "10.0.0.1/8"],
     "--controller-network: '10.0.0.1/8' is not a network in CIDR form"),
    (["probe-target", "--key-file", "k", "--max-per-source", "0"], "--max-per-source: '0' must be at least 1"),
    (["probe-target", "--key-file", "k", "--connection-lifetime", "x"],
     "--connection-lifetime: 'x' is not a number of seconds"),
    (["probe-target", "--key-file", "k", "--control-listen", "127.0.0.1:8081"],
     "--control-listen needs --controller-network CIDR"),
    (["probe-target", "--key-file", "k", "--control-listen", "8081"], "--control-listen: '8081' is not HOST:PORT"),
])
def test_bad_command_line_values_are_argparse_errors(argv: list[str], fragment: str) -> None:
    result = subprocess.run([EGRESS_PROXIES, *argv], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert fragment in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_version_and_absolute_paths(tmp_path: Path) -> None:
    result = subprocess.run([EGRESS_PROXIES, "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0 and result.stdout.startswith("egress-proxies 0.")
    os.chdir(tmp_path)
    settings = parse_args(["--provider-config", "providers.yaml", "--listen", "[::1]:9090"])
    assert settings.provider_config == tmp_path / "providers.yaml"
    assert settings.listen == ("::1", 9090)


def test_kubernetes_source_without_a_cluster_says_so_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(tmp_path)
    result = subprocess.run([EGRESS_PROXIES, "--once", "--work-dir", str(tmp_path / "work"), "--provider-config",
                             str(tmp_path / "p.yaml")], capture_output=True, text=True, timeout=120, check=False,
                            env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "no kubeconfig" in result.stderr



# -- in this process: parsing, the pieces the command builds, and what it prints --------------------


@pytest.mark.usefixtures("root_logging")
def test_the_defaults_are_a_deployments_with_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = parse_args(["--proxy-dir", "proxies", "--work-dir", "work", "--log-level", "debug"])
    assert (settings.proxy_dir, settings.work_dir) == (tmp_path / "proxies", tmp_path / "work")
    assert settings.provider_config == Settings.provider_config and settings.provider_config.is_absolute()
    assert (settings.source, settings.interval_seconds, settings.listen) == ("kubernetes", 60.0, ("0.0.0.0", 8080))
    assert logging.getLogger().level == logging.DEBUG


@pytest.mark.parametrize(("listen", "parsed"), [
    ("0.0.0.0:8080", ("0.0.0.0", 8080)), ("[::1]:0", ("::1", 0)), ("localhost:65535", ("localhost", 65535)),
])
def test_listen_takes_host_and_port(listen: str, parsed: tuple[str, int]) -> None:
    assert build_parser().parse_args(["--listen", listen]).listen == parsed


def test_the_directory_source_keeps_credentials_under_the_work_dir(tmp_path: Path) -> None:
    (tmp_path / "proxies").mkdir()
    store, elector, secrets = build_store(Settings(source="directory", proxy_dir=tmp_path / "proxies",
                                                   work_dir=tmp_path / "work"))
    assert isinstance(store, DirectoryStore)
    try:
        assert elector is None
        assert isinstance(secrets, FileSecrets) and secrets.directory == tmp_path / "work" / "credentials"
        assert isinstance(build_pools(Settings(), store), DirectoryPools)
    finally:
        store.close()


def test_the_credential_grace_is_ten_minutes_unless_set() -> None:
    assert parse_args([]).credential_grace_seconds == 600.0
    assert parse_args(["--credential-grace", "0"]).credential_grace_seconds == 0.0


def test_discovery_urls_carry_the_credentials_the_instance_was_built_with(tmp_path: Path) -> None:
    credentials = Credentials(FileSecrets(tmp_path))
    credentials.refresh({"crawlers": "uid-of-crawlers"})
    url = proxy_url(credentials)
    credential = credentials.current("crawlers")

    def served(status: dict[str, str], **spec: str) -> Proxy:
        return Proxy("crawlers", "eu-1", "uid-1", {"provider": "lab", **spec}, status=dict(status))

    endpoint = {"endpoint": "192.0.2.10:3128"}
    assert url(served({})) is None
    assert url(served(endpoint, auth="none")) == "http://192.0.2.10:3128"
    assert url(served({**endpoint, "credentialGeneration": credential.generation})) == credential.proxy_url(
        "192.0.2.10:3128")
    assert url(served({**endpoint, "credentialGeneration": "retired"})) is None  # never a wrong password


def test_print_proxies_is_an_aligned_table(capsys: pytest.CaptureFixture[str]) -> None:
    print_proxies([Proxy("crawlers", "eu-1", "u1", {"provider": "lab", "location": "h1"},
                         status={"ip": "192.0.2.10", "phase": "Ready"}),
                   Proxy("crawlers", "a-much-longer-name", "u2", {"provider": "lab"})])
    assert capsys.readouterr().out.splitlines() == [
        "NAMESPACE  NAME                PROVIDER  LOCATION  IP          PHASE",
        "crawlers   eu-1                lab       h1        192.0.2.10  Ready",
        "crawlers   a-much-longer-name  lab       -         -           Pending",
    ]


def test_check_config_prints_every_provider_and_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump({"owner": "o", "providers": [{"name": "lab", "type": "kvm"},
                                                                {"name": "cloud", "type": "gcp"}]}))
    runner = FakeRunner(invalid_providers={"cloud": ["providers[1].gcp.project: is required"]})
    assert check_config(cast(AnsibleRunner, runner), path) == 1
    assert capsys.readouterr().out.splitlines() == [
        "provider lab (kvm): ok", "provider cloud (gcp): INVALID", "  providers[1].gcp.project: is required",
        f"{path}: 1 error(s)"]
    runner.invalid_providers.clear()
    assert check_config(cast(AnsibleRunner, runner), path) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"{path}: valid"
    assert check_config(cast(AnsibleRunner, runner), tmp_path / "missing.yaml") == 1
    assert capsys.readouterr().out.startswith("INVALID: provider config ")


def test_check_config_asks_the_backends_and_a_backend_problem_fails_it(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # A GCP provider whose credentials lack the Compute scope is valid as written, but unusable.
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump({"owner": "o", "providers": [{"name": "cloud", "type": "gcp"}]}))
    problem = "providers[0].gcp: listing zone z: 403 Request had insufficient authentication scopes.; grant ..."
    runner = FakeRunner(backend_errors={"cloud": [problem]})
    assert check_config(cast(AnsibleRunner, runner), path) == 1
    assert capsys.readouterr().out.splitlines() == ["provider cloud (gcp): NOT USABLE", f"  {problem}",
                                                    f"{path}: 1 error(s)"]
