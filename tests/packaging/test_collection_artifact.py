"""The collection as ``ansible-galaxy collection build`` packs it and ``install`` unpacks it.

The artifact must hold the collection and nothing of the repository around it (tests, caches,
the virtualenv, the controller's Python package); it must install offline next to the
dependencies the pinned ``ansible`` package provides; and the modules must run from that
install with nothing of the source tree on Ansible's search path.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml
from ansible.galaxy.dependency_resolution.versioning import meets_requirements
from ansible.release import __version__ as ansible_core_version

from support import REPO
from support.collection.artifact import GALAXY as GALAXY_COMMAND
from support.collection.artifact import InstalledCollection, build_artifact, dependencies_path
from support.collection.provider_config import OWNER_TAGS
from support.hosts.libvirt_daemon import LibvirtTestDaemon

pytestmark = pytest.mark.timeout(120)

GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())
# What users get: collection content, the controller's manifests and example Proxies (which the
# deploy playbook and the README's walk-through use), and the docs. Nothing else.
ALLOWED_TOP = {"MANIFEST.json", "FILES.json", "README.md", "CHANGELOG.md", "LICENSE", "bindep.txt", "meta", "plugins",
               "roles", "playbooks", "docs", "controller", "extensions"}
ALLOWED_CONTROLLER = {"controller/manifests", "controller/examples"}


def member_names(artifact: Path) -> list[str]:
    with tarfile.open(artifact) as tar:
        return [name.removeprefix("./") for name in tar.getnames()]


def member_files(artifact: Path) -> set[str]:
    """The artifact's files (its folders left out)."""
    with tarfile.open(artifact) as tar:
        return {member.name.removeprefix("./") for member in tar.getmembers() if not member.isdir()}


def tracked_files(checkout: Path = REPO) -> list[str]:
    """The files git tracks in ``checkout`` (its index), as the artifact would name them."""
    listed = subprocess.run(["git", "-C", str(checkout), "ls-files", "-z"], check=True, capture_output=True,
                            text=True).stdout
    return [name for name in listed.split("\0") if name]


def source_files(*folders: str) -> set[str]:
    """Tracked files under these folders, as the artifact would name them."""
    return {name for name in tracked_files() if name.startswith(tuple(f"{folder}/" for folder in folders))}


# What the documented commands leave in a checkout (scripts/setup.sh's venvs and editable installs,
# scripts/test.sh's tools, lint-imports run by hand as docs/architecture.md shows it, ansible-test,
# coverage, a build in place): each ignored by git and kept out by galaxy.yml's build_ignore.
TOOL_LEFTOVERS = [
    ".venv/bin/python", ".venv-current/bin/python", "controller/egress_proxies_controller.egg-info/PKG-INFO",
    "plugins/module_utils/__pycache__/config.cpython-311.pyc", ".mypy_cache/3.11/x.json", ".ruff_cache/CACHEDIR.TAG",
    ".pytest_cache/README.md", ".import_linter_cache/x.data.json", ".ansible/collections/x", ".cache/x",
    "tests/output/.tmp/x", ".coverage", "htmlcov/index.html", "playbooks/site.retry",
    "crawl-egress_proxies-0.1.0.tar.gz",
]


def copy_checkout(target: Path) -> Path:
    """A git checkout at ``target`` holding this one's tracked files as they are now (the index
    only, nothing committed), with git's own ignore rules."""
    target.mkdir()
    for name in tracked_files():
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target / name, follow_symlinks=False)
    subprocess.run(["git", "init", "--quiet", str(target)], check=True)
    subprocess.run(["git", "-C", str(target), "add", "--all"], check=True)
    return target


def drop(checkout: Path, names: list[str]) -> None:
    for name in names:
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text("left lying around\n")


def test_the_artifact_holds_the_collection_and_nothing_else(installed_collection: InstalledCollection) -> None:
    names = member_names(installed_collection.artifact)
    files = {name for name in names if not name.endswith("/")}

    assert {name.split("/")[0] for name in names} <= ALLOWED_TOP
    assert {"/".join(name.split("/")[:2]) for name in names if name.startswith("controller/")} - {
        "controller/"} <= ALLOWED_CONTROLLER
    for name in names:
        parts = set(name.split("/"))
        assert not parts & {"tests", "__pycache__", ".venv", ".ansible", ".git", "bench", "scripts", "tools",
                            "egress_proxies"}, name
        assert not name.endswith((".pyc", ".tar.gz", ".egg-info")), name
    # Everything that is collection content is there.
    expected = source_files("plugins", "roles", "playbooks", "meta", "controller/manifests", "controller/examples")
    assert expected - files == set()
    assert "playbooks/deploy_controller.yml" in files
    # The licence text and what an execution environment needs (meta/execution-environment.yml names them).
    assert {"LICENSE", "bindep.txt", "meta/execution-environment.yml", "meta/ee-requirements.txt"} <= files


def test_the_artifact_holds_tracked_files_only_whatever_lies_in_the_checkout(tmp_path: Path) -> None:
    """Untracked files anywhere in a checkout (a scratch module beside the real ones, notes, every
    tool cache) stay out of what scripts/build_collection.sh builds, and a tracked file deleted in
    the working tree is left out rather than failing the build. Before: `ansible-galaxy collection
    build` packed whatever build_ignore did not name (.import_linter_cache went out in the artifact)."""
    checkout = copy_checkout(tmp_path / "checkout")
    untracked = ["plugins/modules/scratch_proxy.py", "roles/kvm_hypervisor/tasks/wip.yml", "docs/notes.md",
                 "notes.txt", "meta/.draft.yml"]
    drop(checkout, untracked + TOOL_LEFTOVERS)
    (checkout / "docs" / "contract.md").unlink()
    (tmp_path / "dist").mkdir()

    files = member_files(build_artifact(tmp_path / "dist", checkout))

    assert files.isdisjoint(untracked + TOOL_LEFTOVERS), sorted(files & set(untracked + TOOL_LEFTOVERS))
    assert "docs/contract.md" not in files
    assert {"plugins/modules/kvm_proxy.py", "roles/kvm_hypervisor/tasks/main.yml", "docs/architecture.md",
            "meta/runtime.yml"} <= files
    assert files - {"MANIFEST.json", "FILES.json"} <= set(tracked_files())


def test_every_cache_a_documented_command_writes_is_ignored_by_git_and_by_the_build(tmp_path: Path) -> None:
    """Each leftover is ignored by git (so it is never tracked, and so never built by
    scripts/build_collection.sh) and named by build_ignore (so a plain `ansible-galaxy collection
    build` in a checkout, as older instructions had it, leaves it out too)."""
    checkout = copy_checkout(tmp_path / "checkout")
    drop(checkout, TOOL_LEFTOVERS)
    ignored = subprocess.run(["git", "-C", str(checkout), "check-ignore", "--no-index", *TOOL_LEFTOVERS],
                             capture_output=True, text=True).stdout.split()
    subprocess.run([str(GALAXY_COMMAND), "collection", "build", "--output-path", str(tmp_path), str(checkout)],
                   check=True, capture_output=True, text=True)
    (artifact,) = tmp_path.glob("crawl-egress_proxies-*.tar.gz")
    built = member_files(artifact)

    assert sorted(set(TOOL_LEFTOVERS) - set(ignored)) == []
    assert built.isdisjoint(TOOL_LEFTOVERS), sorted(built & set(TOOL_LEFTOVERS))


def test_the_manifest_carries_galaxy_yml(installed_collection: InstalledCollection) -> None:
    manifest = json.loads((installed_collection.root / "MANIFEST.json").read_text())["collection_info"]

    assert (manifest["namespace"], manifest["name"], manifest["version"]) == (
        GALAXY["namespace"], GALAXY["name"], GALAXY["version"])
    assert manifest["dependencies"] == GALAXY["dependencies"]
    runtime = yaml.safe_load((installed_collection.root / "meta" / "runtime.yml").read_text())
    assert meets_requirements(ansible_core_version, runtime["requires_ansible"]), (
        f"ansible-core {ansible_core_version} (what the tests run) is outside requires_ansible")
    # The current line, which scripts/test.sh also runs (.venv-current), is inside it too.
    (current,) = re.findall(r"^ansible-core==(\S+)$", (REPO / "requirements-current.txt").read_text(), re.M)
    assert meets_requirements(current, runtime["requires_ansible"]), (current, runtime["requires_ansible"])


def test_dependencies_are_satisfied_by_the_pinned_ansible_package(installed_collection: InstalledCollection) -> None:
    """An offline install resolves every dependency against what is already installed, so each
    declared range holds the version the tests run."""
    for name, requirement in GALAXY["dependencies"].items():
        namespace, collection = name.split(".")
        manifest = Path(dependencies_path()) / "ansible_collections" / namespace / collection / "MANIFEST.json"
        installed = json.loads(manifest.read_text())["collection_info"]["version"]
        assert meets_requirements(installed, requirement), (name, installed, requirement)
        assert f"'{name}:{installed}' is already installed" in installed_collection.install_log


def test_ansible_finds_the_modules_in_the_install(installed_collection: InstalledCollection, tmp_path: Path) -> None:
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), "--json",
                           "crawl.egress_proxies.kvm_proxy_info"], env=installed_collection.env(tmp_path),
                          capture_output=True, text=True, check=True)
    (doc,) = json.loads(done.stdout).values()

    assert Path(doc["doc"]["filename"]) == installed_collection.root / "plugins" / "modules" / "kvm_proxy_info.py"


def test_the_installed_modules_create_and_list_a_proxy(installed_collection: InstalledCollection, tmp_path: Path,
                                                       testdriver_config: Path, libvirt_test: LibvirtTestDaemon,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """kvm_proxy and kvm_proxy_info from the install, through the controller's runner, against the
    test-driver libvirtd: module_utils, the seed ISO and the placement all come from the artifact."""
    from egress_proxies.providers.runner import AnsibleRunner, Operation

    env = installed_collection.env(tmp_path)
    for name in ("ANSIBLE_COLLECTIONS_SCAN_SYS_PATH", "HOME", "TMPDIR"):
        monkeypatch.setenv(name, env[name])
    runner = AnsibleRunner(tmp_path / "work", timeout_seconds=120, max_concurrent=1,
                           collections_path=env["ANSIBLE_COLLECTIONS_PATH"])
    common = {"provider_config": str(testdriver_config), "provider": "lab"}
    tags = {**OWNER_TAGS, "crawl.example.com/proxy": "crawlers/installed"}

    created, listed = runner.run("lab", "packaging", [
        Operation("kvm_proxy", {**common, "name": "installed-3f9c2a", "tags": tags, "user_data": "#cloud-config\n",
                                "image_cache_dir": str(tmp_path / "cache")}),
        Operation("kvm_proxy_info", {**common, "tags": OWNER_TAGS}),
    ])

    assert created.ok, created.result
    assert created.result["provider_id"] == "kvm://hosts/h1/domains/installed-3f9c2a"
    assert listed.ok, listed.result
    assert [i["provider_id"] for i in listed.result["instances"]] == ["kvm://hosts/h1/domains/installed-3f9c2a"]
    assert "installed-3f9c2a" in {d.name() for d in libvirt_test.connection.listAllDomains()}


def test_one_version_everywhere() -> None:
    """galaxy.yml's version is the release: the newest CHANGELOG entry, the controller package, the
    crawler client package, the image tag the Deployment runs, and the artifact and image names the
    README tells users to use."""
    version = GALAXY["version"]
    changelog = (REPO / "CHANGELOG.md").read_text()
    newest = re.search(r"^## (\S+) - (\d{4}-\d{2}-\d{2})$", changelog, re.M)
    deployment = yaml.safe_load((REPO / "controller" / "manifests" / "deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    readme = (REPO / "README.md").read_text()

    assert newest is not None and newest.group(1) == version
    assert tomllib.loads((REPO / "controller" / "pyproject.toml").read_text())["project"]["version"] == version
    # The client's version has one home (pyproject.toml reads it dynamically): its version.py.
    client = tomllib.loads((REPO / "clients" / "python" / "pyproject.toml").read_text())
    assert client["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "egress_proxies_client.version.__version__"}
    client_version = re.search(r'^__version__ = "([^"]+)"$', (
        REPO / "clients" / "python" / "egress_proxies_client" / "version.py").read_text(), re.M)
    assert client_version is not None and client_version.group(1) == version
    assert container["image"].rpartition(":")[2] == version
    assert set(re.findall(r"crawl-egress_proxies-(\d[^\s/]*?)\.tar\.gz", readme)) == {version}
    assert set(re.findall(r"egress-proxies-controller:(\d\S*)", readme)) == {version}
