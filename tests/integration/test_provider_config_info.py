"""provider_config_info through ansible-runner, as the controller and the deploy playbook run it.

An invalid config is a successful run listing every error (valid=false); only a file that cannot
be read or is not YAML fails, and then permanent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import POLICY_VERSION
from support.collection.modules import ModuleRun, run_module

OWNER = "prod-cluster-1"
SHA = "a" * 64


def document() -> dict[str, Any]:
    """Three valid providers, one of each type."""
    return {
        "owner": OWNER,
        "providers": [
            {"name": "home-kvm", "type": "kvm", "kvm": {
                "ssh": {"keyFile": "/etc/egress-proxies/kvm-ssh/id_ed25519",
                        "knownHostsFile": "/etc/egress-proxies/kvm-ssh/known_hosts"},
                "hosts": [{"name": "beelink", "uri": "qemu+libssh://root@beelink/system"}],
                "images": {"debian-12": {"url": "https://images.example/debian-12.qcow2", "sha256": SHA}},
                "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 1024, "diskGiB": 10}},
            }},
            {"name": "gcp-eu", "type": "gcp", "allowedSources": ["198.51.100.0/24"], "gcp": {
                "project": "my-project", "zones": ["europe-west1-b"], "machineTypes": {"small": "e2-small"},
                "images": {"debian-12": "projects/debian-cloud/global/images/family/debian-12"},
            }},
            {"name": "cluster", "type": "kubernetes", "kubernetes": {"namespace": "egress",
                                                                    "image": "ubuntu/squid:latest"}},
        ],
    }


def check(path: Path, check_mode: bool = False) -> ModuleRun:
    return run_module("provider_config_info", {"provider_config": str(path)}, check_mode=check_mode)


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_valid_config(tmp_path: Path) -> None:
    data = document()
    data["providers"][1]["allowedDestinations"] = ["10.128.0.0/20"]
    run = check(write(tmp_path, data))
    assert run.status == "successful", run.result
    result = run.result
    assert result["changed"] is False
    assert (result["valid"], result["owner"], result["errors"]) == (True, OWNER, [])
    assert [{k: p[k] for k in ("name", "type", "valid", "errors")} for p in result["providers"]] == [
        {"name": "home-kvm", "type": "kvm", "valid": True, "errors": []},
        {"name": "gcp-eu", "type": "gcp", "valid": True, "errors": []},
        {"name": "cluster", "type": "kubernetes", "valid": True, "errors": []},
    ]
    # Each provider's probe settings, allowed sources and opened destinations, defaults filled in,
    # and the version of the access policy the modules deliver, for the controller.
    kvm = result["providers"][0]
    assert kvm["probe"]["enabled"] is True and kvm["probe"]["expectStatus"] == 204
    assert "10.0.0.0/8" in kvm["allowed_sources"]
    assert [p["allowed_destinations"] for p in result["providers"]] == [[], ["10.128.0.0/20"], []]
    assert result["access_policy_version"] == POLICY_VERSION


def test_two_bad_sections_report_every_error_and_the_good_provider_stays_valid(tmp_path: Path) -> None:
    data = document()
    kvm = data["providers"][0]["kvm"]
    kvm["hosts"][0]["uri"] = "qemu+SSH://root@beelink/system?no_verify=1"
    kvm["ssh"]["keyFile"] = "kvm-ssh/id_ed25519"  # relative: the module's cwd is not the operator's
    data["providers"][2]["kubernetes"]["namespace"] = "Egress"
    run = check(write(tmp_path, data), check_mode=True)
    assert run.status == "successful", run.result
    result = run.result
    assert result["valid"] is False and result["owner"] == OWNER
    kvm_errors = [
        "providers[0].kvm.ssh.keyFile: 'kvm-ssh/id_ed25519' must be an absolute path",
        ("providers[0].kvm.hosts[0].uri: 'qemu+SSH://root@beelink/system?no_verify=1' sets the query parameter "
         "'no_verify', which is refused"),
    ]
    k8s_error = "providers[2].kubernetes.namespace: 'Egress' is not a valid Kubernetes namespace name"
    by_name = {provider["name"]: provider for provider in result["providers"]}
    assert {k: by_name["gcp-eu"][k] for k in ("name", "type", "valid", "errors")} == {
        "name": "gcp-eu", "type": "gcp", "valid": True, "errors": []}
    assert by_name["home-kvm"]["valid"] is False
    assert [error[:len(expected)] for error, expected in zip(by_name["home-kvm"]["errors"], kvm_errors,
                                                            strict=True)] == kvm_errors
    assert by_name["cluster"]["valid"] is False
    (only,) = by_name["cluster"]["errors"]
    assert only.startswith(k8s_error)
    assert result["errors"] == [*by_name["home-kvm"]["errors"], only]


def test_a_root_error_makes_every_provider_unusable(tmp_path: Path) -> None:
    data = document()
    data["providers"][2]["name"] = "gcp-eu"
    data["owner"] = "Prod"
    run = check(write(tmp_path, data))
    assert run.status == "successful", run.result
    result = run.result
    assert result["valid"] is False and result["owner"] is None
    assert [error.split(":", 1)[0] for error in result["errors"]] == ["owner", "providers[2].name"]
    assert [(p["name"], p["valid"], p["errors"]) for p in result["providers"]] == [
        ("home-kvm", False, result["errors"]), ("gcp-eu", False, result["errors"])]


def test_a_file_that_is_not_yaml_fails_permanent(tmp_path: Path) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text("owner: o\nproviders: [\n  {name: lab\n")
    run = check(path)
    assert run.failed, run.result
    assert run.result["error_class"] == "permanent"
    assert run.result["msg"].startswith(f"provider_config: {path} is not valid YAML")


def test_a_file_that_cannot_be_read_fails_permanent(tmp_path: Path) -> None:
    run = check(tmp_path / "absent.yaml")
    assert run.failed, run.result
    assert run.result["error_class"] == "permanent"
    assert run.result["msg"] == f"provider_config: cannot read {tmp_path / 'absent.yaml'}: No such file or directory"


def test_public_exposure_is_explicit_and_reachability_says_who_gets_there(tmp_path: Path) -> None:
    # Issue 39 row 1: a GCP provider dialled at external addresses without allowedSources
    # admitted the private networks only, which never reach an external address: every Proxy
    # NotServing. Now it is refused naming the field and the fix; written out, the module says
    # per provider what is reachable from where, private sources that never get there included.
    data = document()
    del data["providers"][1]["allowedSources"]
    run = check(write(tmp_path, data))
    assert run.status == "successful", run.result
    (error,) = run.result["errors"]
    assert error.startswith("providers[1].allowedSources: required: gcp.externalIP is true (the default): every proxy "
                            "is dialled at its external address, which only public sources reach"), error
    assert "0.0.0.0/0 written out for any address" in error and "probeSources" in error
    gcp = run.result["providers"][1]
    assert (gcp["valid"], gcp["reachability"]) == (False, [])

    data["probeSources"] = ["192.0.2.10/32"]
    data["providers"][1]["allowedSources"] = ["198.51.100.0/24", "10.0.0.0/8"]
    run = check(write(tmp_path, data))
    assert run.result["valid"] is True, run.result
    assert run.result["providers"][1]["reachability"] == [
        "proxies: at their external IPv4 addresses, each on its Proxy's port (default 3128), from the internet",
        ("never reached from 10.0.0.0/8: private networks do not reach an external address (remove them, or set "
        "externalIP: false for crawlers inside the VPC)"),
        ("crawlers from: 10.0.0.0/8, 198.51.100.0/24 (allowedSources, or a Proxy's own spec.allowedSources; the "
        "managed firewall rule and squid admit exactly these)"),
        ("the controller's probe from: 192.0.2.10/32 (probeSources; admitted on every instance besides the crawlers' "
        "sources)")]
    assert run.result["providers"][0]["reachability"] == []  # KVM says nothing here yet
    # The probe sources are in every instance's policy: naming them changes the build hash.
    assert run.result["access_policy_version"].startswith(POLICY_VERSION + "+probe.")

    # Inside the VPC, the private default stands: nothing public is exposed.
    data["providers"][1]["gcp"]["externalIP"] = False
    del data["providers"][1]["allowedSources"]
    run = check(write(tmp_path, data))
    assert run.result["valid"] is True, run.result
    assert run.result["providers"][1]["reachability"][0].startswith(
        "proxies: at their internal addresses in network global/networks/default (externalIP: false)")
