"""controller/Containerfile, without a container engine (none runs on these machines).

The file is checked as text: pinned base images, a non-root user that matches the Deployment,
no secrets, no compilers in the final stage, and paths that agree with deployment.yaml's
read-only root filesystem and volumes. Then the Python environment it describes is built for
real, by the same controller/build_env.sh its build stage runs, on Debian 12's python3 (the
base image's), and the controller from that environment sweeps a Proxy to Ready with the root
filesystem read-only and only the image's writable paths writable (tmpfs mounts standing in
for the Deployment's emptyDir volumes), using the image's own ENV.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.ansible_modules import REPO
from support.libvirt_daemon import LibvirtTestDaemon

CONTAINERFILE = REPO / "controller" / "Containerfile"
BUILD_ENV = REPO / "controller" / "build_env.sh"
DEPLOYMENT = REPO / "controller" / "manifests" / "deployment.yaml"
# What the base image's python3 is: Debian 12's, the one this machine runs.
DEBIAN_PYTHON = "/usr/bin/python3"
IMAGE_PREFIX = "/opt/egress-proxies"
COMPILERS = re.compile(r"^(gcc|gcc-\d+|cpp|cpp-\d+|g\+\+|g\+\+-\d+|clang.*|binutils.*|build-essential|make|"
                       r"pkg-config|pkgconf|libc6-dev|.*-dev)$")
SECRET_NAME = re.compile(r"(TOKEN|PASSWORD|PASSWD|SECRET|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY)", re.I)
SECRET_FILE = re.compile(r"(id_(rsa|ed25519|ecdsa|dsa)|\.pem$|\.key$|known_hosts|kubeconfig|\.kube|\.ssh|"
                         r"\.env$|credentials|token)", re.I)
Obj = dict[str, Any]


# -- reading the Containerfile --------------------------------------------------------------------


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def env(self) -> dict[str, str]:
        result = {}
        for args in self.all("ENV"):
            for word in shlex.split(args):
                key, _, value = word.partition("=")
                result[key] = value
        return result

    def apt_packages(self) -> list[str]:
        packages = []
        for command in self.all("RUN"):
            for part in command.split("&&"):
                words = shlex.split(part)
                if "apt-get" in words and "install" in words:
                    packages += [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
        return packages


def parse(text: str) -> list[Stage]:
    """Instructions per stage: continuation lines joined, comment lines dropped (as the builder does)."""
    stages: list[Stage] = []
    logical = ""
    for line in text.splitlines():
        if line.strip().startswith("#") or not line.strip():
            continue
        logical += line.rstrip().removesuffix("\\") + " "
        if line.rstrip().endswith("\\"):
            continue
        keyword, _, args = logical.strip().partition(" ")
        logical = ""
        if keyword.upper() == "FROM":
            words = args.split()
            stages.append(Stage(words[0], words[2] if len(words) == 3 and words[1].upper() == "AS" else None))
        else:
            stages[-1].instructions.append((keyword.upper(), " ".join(args.split())))
    return stages


STAGES = parse(CONTAINERFILE.read_text())
FINAL = STAGES[-1]


def deployment() -> Obj:
    loaded: Obj = yaml.safe_load(DEPLOYMENT.read_text())
    return loaded


def container() -> Obj:
    (only,) = deployment()["spec"]["template"]["spec"]["containers"]
    result: Obj = only
    return result


# -- static checks -------------------------------------------------------------------------------


def test_it_is_multi_stage_and_every_base_image_is_pinned() -> None:
    assert len(STAGES) >= 2
    for stage in STAGES:
        name, _, digest = stage.base.partition("@")
        repository, _, tag = name.rpartition(":")
        assert repository and "/" in repository, f"{stage.base}: name the registry and repository in full"
        assert digest == "" or re.fullmatch(r"sha256:[0-9a-f]{64}", digest), stage.base
        # A version down to the point release (12.11, 3.11.14), never latest or a bare major.
        assert re.match(r"^\d+\.\d+", tag), f"{stage.base}: not pinned to a version"
    # The venv is built in one stage and run in the other: the same base, so the same python3.
    assert len({stage.base for stage in STAGES}) == 1


def test_the_final_stage_runs_as_the_deployments_non_root_user() -> None:
    (user,) = FINAL.all("USER")
    uid, _, gid = user.partition(":")
    pod = deployment()["spec"]["template"]["spec"]["securityContext"]

    assert uid.isdigit() and int(uid) != 0, "a numeric non-root uid (runAsNonRoot can check only numbers)"
    assert (int(uid), int(gid)) == (pod["runAsUser"], pod["runAsGroup"])
    assert pod["runAsNonRoot"] is True
    keywords = [keyword for keyword, _ in FINAL.instructions]
    assert "RUN" not in keywords[keywords.index("USER"):]  # the user is the image's last word on it


def test_no_secret_is_baked_in() -> None:
    for stage in STAGES:
        for keyword in ("ENV", "ARG", "LABEL"):
            for args in stage.all(keyword):
                for word in shlex.split(args):
                    assert not SECRET_NAME.search(word.partition("=")[0]), f"{keyword} {word}"
        for args in stage.all("COPY") + stage.all("ADD"):
            assert not SECRET_FILE.search(args), args
    # The final image takes only the built runtime from the build stage, never the context.
    assert FINAL.all("COPY") == [f"--from=build {IMAGE_PREFIX} {IMAGE_PREFIX}"]
    assert FINAL.all("ADD") == []


def test_the_final_stage_installs_no_compilers() -> None:
    """Neither in the packages it names nor in their dependencies (Debian's own metadata)."""
    packages = FINAL.apt_packages()
    assert {"python3", "libvirt0", "openssh-client"} <= set(packages)
    assert [p for p in packages if COMPILERS.match(p)] == []
    closure = subprocess.run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                              "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", *packages],
                             capture_output=True, text=True, check=True).stdout
    installed = {line.strip() for line in closure.splitlines() if line and not line.startswith((" ", "<"))}
    assert len(installed) > len(packages)
    assert sorted(p for p in installed if COMPILERS.match(p)) == []
    # And the build stage is where they are.
    assert {"gcc", "libvirt-dev"} <= set(STAGES[0].apt_packages())


def test_the_build_stage_builds_the_runtime_with_build_env_from_the_pinned_files() -> None:
    assert f"bash controller/build_env.sh /src {IMAGE_PREFIX}" in STAGES[0].all("RUN")
    script = BUILD_ENV.read_text()
    assert '-r "$SRC/requirements.txt" -c "$SRC/constraints.txt"' in script
    assert "collection install --offline --no-deps" in script
    for pins in ("requirements.txt", "constraints.txt"):
        for line in (REPO / pins).read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                assert re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[0-9][^\s;]*", line.strip()), f"{pins}: {line}"
    # The build context keeps what build_env.sh reads.
    ignored = [line for line in (REPO / ".dockerignore").read_text().splitlines()
               if line and not line.startswith("#")]
    for needed in ("requirements.txt", "constraints.txt", "galaxy.yml", "plugins", "controller", "meta"):
        assert needed not in ignored


def test_the_image_paths_agree_with_the_deployment() -> None:
    """What the image writes lies on the Deployment's emptyDir volumes; everything else is
    read-only (readOnlyRootFilesystem)."""
    main = container()
    env = FINAL.env()
    pod_env = {item["name"]: item.get("value") for item in main["env"]}
    volumes = {v["name"]: v for v in deployment()["spec"]["template"]["spec"]["volumes"]}
    scratch = [m["mountPath"] for m in main["volumeMounts"] if "emptyDir" in volumes[m["name"]]]
    command = main["command"]
    work_dir = command[command.index("--work-dir") + 1]

    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    for name in ("HOME", "EGRESS_PROXIES_CACHE_DIR"):
        assert env[name] == pod_env[name], name
    writable = [env[name] for name in ("HOME", "ANSIBLE_HOME", "ANSIBLE_LOCAL_TEMP", "ANSIBLE_REMOTE_TEMP",
                                        "EGRESS_PROXIES_CACHE_DIR")]
    for path in [*writable, work_dir]:
        assert any(path == mount or path.startswith(mount + "/") for mount in scratch), path
    (workdir,) = FINAL.all("WORKDIR")
    assert workdir == work_dir
    assert env["ANSIBLE_COLLECTIONS_PATH"] == f"{IMAGE_PREFIX}/collections"
    assert env["PATH"].startswith(f"{IMAGE_PREFIX}/venv/bin:")
    assert json.loads(FINAL.all("ENTRYPOINT")[0]) == [command[0]]
    assert main["ports"][0]["containerPort"] == int(FINAL.all("EXPOSE")[0])


# -- the environment it describes, built and run -----------------------------------------------------


@pytest.fixture(scope="module")
def image_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's /opt/egress-proxies, built by build_env.sh into a temporary prefix (~20 s with
    pip's cache, a few minutes without)."""
    prefix = tmp_path_factory.mktemp("image") / "opt"
    # Debian's python3 and nothing of .venv; HOME kept for pip's cache of built wheels (libvirt-python).
    environ = {"PYTHON": DEBIAN_PYTHON, "PATH": "/usr/bin:/bin", "HOME": os.environ["HOME"]}
    subprocess.run(["bash", str(BUILD_ENV), str(REPO), str(prefix)], env=environ, check=True, capture_output=True,
                   text=True, timeout=900)
    return prefix


def image_environ(prefix: Path, scratch: Path, work: Path) -> dict[str, str]:
    """The final stage's ENV, its paths moved to where this test put them; TMPDIR stands for the
    image's /tmp (an emptyDir in the Deployment, the system temp dir in the container)."""
    moves = {IMAGE_PREFIX: str(prefix), "/var/lib/egress-proxies": str(work), "/tmp": str(scratch)}
    image_path = re.compile(rf"(^|:)({'|'.join(map(re.escape, moves))})(?=/|:|$)")
    environ = {name: image_path.sub(lambda m: m.group(1) + moves[m.group(2)], value)
               for name, value in FINAL.env().items()}
    return {**environ, "TMPDIR": str(scratch), "LANG": "C.UTF-8"}


@pytest.mark.timeout(900)
def test_the_built_environment_has_the_controller_and_the_installed_collection(image_env: Path,
                                                                               tmp_path: Path) -> None:
    environ = image_environ(image_env, tmp_path, tmp_path / "work")
    python = str(image_env / "venv" / "bin" / "python")

    helped = subprocess.run(["egress-proxies", "--help"], env=environ, capture_output=True, text=True, check=True)
    assert "--work-dir" in helped.stdout
    modules = "ansible_runner, libvirt, pycdlib, kubernetes, google.cloud.compute_v1, prometheus_client, egress_proxies"
    imported = subprocess.run([python, "-c", f"import {modules}; print(egress_proxies.__file__)"], env=environ,
                              capture_output=True, text=True, check=True)
    assert imported.stdout.startswith(str(image_env / "venv"))  # installed, not the source tree
    subprocess.run([python, "-m", "pip", "check"], env=environ, capture_output=True, check=True)
    listed = subprocess.run(["ansible-doc", "--list", "--json", "crawl.egress_proxies"], env=environ,
                            capture_output=True, text=True, check=True)
    assert set(json.loads(listed.stdout)) == {f"crawl.egress_proxies.{p}_proxy{s}" for p in ("kvm", "gcp", "k8s")
                                               for s in ("", "_info")} | {"crawl.egress_proxies.provider_config_info"}
    assert (image_env / "collections" / "ansible_collections" / "crawl" / "egress_proxies" / "MANIFEST.json").is_file()


@pytest.mark.timeout(900)
def test_the_controller_runs_on_a_read_only_root_filesystem(image_env: Path, testdriver_config: Path,
                                                           libvirt_test: LibvirtTestDaemon, tmp_path: Path) -> None:
    """One sweep-until-Ready of the directory source against the test-driver libvirtd, in a
    private mount namespace where / is read-only and only scratch and work are writable tmpfs
    mounts (and the Proxy dir, where the directory source writes status)."""
    scratch, work, proxies = tmp_path / "scratch", tmp_path / "work", tmp_path / "proxies"
    for directory in (scratch, work, proxies):
        directory.mkdir()
    (proxies / "ro.yaml").write_text(yaml.safe_dump({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy", "metadata": {"name": "ro", "namespace": "c"},
        "spec": {"provider": "lab", "cloudInit": "#cloud-config\n"}}))
    setup = (f"mount -t tmpfs tmpfs {scratch} && mount -t tmpfs tmpfs {work} && mount --bind {proxies} {proxies} "
             "&& mount -o remount,bind,ro / && exec \"$@\"")
    command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", setup, "sh",
               "egress-proxies", "--source", "directory", "--proxy-dir", str(proxies),
               "--provider-config", str(testdriver_config), "--work-dir", str(work), "--until-ready", "120"]
    environ = image_environ(image_env, scratch, work)
    environ["PATH"] += ":/usr/bin:/bin"  # unshare and mount, outside the image's PATH order

    done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=300, check=False)

    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^c\s+ro\s+lab\s+\S+\s+\S+\s+Ready$", done.stdout, re.M), done.stdout
    status = yaml.safe_load((proxies / "ro.status.yaml").read_text())
    assert status["status"]["phase"] == "Ready"
    assert "Read-only file system" not in done.stderr
    assert {d.name() for d in libvirt_test.connection.listAllDomains()} - {"test"}
