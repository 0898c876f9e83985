"""The collection in an execution environment: what ansible-builder reads from the built artifact.

ansible-builder collects every installed collection's meta/execution-environment.yml (here: the
Python requirements in meta/ee-requirements.txt and the system packages in bindep.txt) with
``ansible-builder introspect``, the step an image build runs; ``ansible-builder create`` writes the
build context of an EE holding the artifact. Both are the real tool (pinned in
requirements-test.txt); neither needs a registry or a container engine. bindep (ansible-builder's
own dependency) checks the system packages against this Debian machine, which scripts/setup.sh
gave every one of them: a misspelt Debian name would be reported missing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support import REPO
from support.collection.artifact import InstalledCollection

pytestmark = pytest.mark.timeout(180)

BIN = Path(sys.executable).parent
FROM = "  # from collection crawl.egress_proxies"


def requirement_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def run(*command: str | Path, cwd: Path) -> str:
    done = subprocess.run([str(part) for part in command], cwd=cwd, capture_output=True, text=True, timeout=150,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_introspection_of_the_installed_artifact_finds_every_requirement(
        installed_collection: InstalledCollection, tmp_path: Path) -> None:
    meta = yaml.safe_load((installed_collection.root / "meta" / "execution-environment.yml").read_text())
    assert meta == {"version": 1, "dependencies": {"python": "meta/ee-requirements.txt", "system": "bindep.txt"}}

    found = yaml.safe_load(run(BIN / "ansible-builder", "introspect", "--sanitize",
                               installed_collection.collections_path, cwd=tmp_path).split("\n", 1)[1])

    # --sanitize drops what ansible-core itself brings (PyYAML): the rest is there, as written.
    python = [line for line in requirement_lines(REPO / "meta" / "ee-requirements.txt")
              if not line.lower().startswith("pyyaml")]
    assert found["python"] == [line + FROM for line in python]
    assert found["system"] == [line + FROM for line in requirement_lines(REPO / "bindep.txt")]
    # What the modules import and cannot do without is among them.
    assert {line.split(">=")[0] for line in python} == {"libvirt-python", "pycdlib", "kubernetes",
                                                        "google-cloud-compute"}


def test_ansible_builder_creates_the_build_context_of_an_ee_with_the_artifact(
        installed_collection: InstalledCollection, tmp_path: Path) -> None:
    definition = {
        "version": 3,
        # Never pulled: `create` only writes the context a container engine would build.
        "images": {"base_image": {"name": "registry.example/ee-minimal:latest"}},
        "dependencies": {
            "ansible_core": {"package_pip": "ansible-core==2.19.14"},
            "ansible_runner": {"package_pip": "ansible-runner==2.4.3"},
            # A file collection is installed inside the build, from the context: its path is relative to it.
            "galaxy": {"collections": [{"name": f"_build/collections/{installed_collection.artifact.name}",
                                        "type": "file"}]},
        },
        "additional_build_files": [{"src": str(installed_collection.artifact), "dest": "collections"}],
    }
    (tmp_path / "execution-environment.yml").write_text(yaml.safe_dump(definition))

    output = run(BIN / "ansible-builder", "create", "--file", "execution-environment.yml",
                 "--context", "context", "--output-filename", "Containerfile", cwd=tmp_path)

    assert "Complete!" in output, output
    context = tmp_path / "context"
    containerfile = (context / "Containerfile").read_text()
    assert "FROM $EE_BASE_IMAGE" in containerfile and "ansible-galaxy collection install" in containerfile
    galaxy = yaml.safe_load((context / "_build" / "requirements.yml").read_text())
    assert galaxy["collections"] == [{"name": f"_build/collections/{installed_collection.artifact.name}",
                                      "type": "file"}]
    assert (context / "_build" / "collections" / installed_collection.artifact.name).read_bytes() == (
        installed_collection.artifact.read_bytes())


def test_bindep_names_real_debian_packages(tmp_path: Path) -> None:
    """Every dpkg package bindep.txt names (run time and compile) is installed here by scripts/setup.sh."""
    listed = run(BIN / "bindep", "--file", REPO / "bindep.txt", "--list_all", "newline", "default", "compile",
                 cwd=tmp_path).split()
    assert set(listed) == {"libvirt-dev", "pkg-config", "gcc", "python3-dev", "libvirt0", "openssh-client"}
    run(BIN / "bindep", "--file", REPO / "bindep.txt", "default", "compile", cwd=tmp_path)  # none missing
