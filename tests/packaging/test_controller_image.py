"""controller/Containerfile: read as text, then built for real with Debian's buildah and run.

The static checks read the Containerfile as the builder does: pinned base, a non-root user that
matches the Deployment, no secrets, no compilers in the final stage, the dependency layer before
the sources, and paths that agree with deployment.yaml's read-only root filesystem and volumes.

Then the image is built (buildah, vfs storage, chroot isolation) with no network at all: the
base is a Debian 12 made locally (no registry is reachable here), its apt source a repository of
the Containerfile's packages bind-mounted into the build, and the Python dependencies come from a
wheelhouse downloaded beforehand (both cached per machine: tests/support/images/container_image.py).
The built image is checked (size, labels, no pip, no compilers) and run with crun the way the
Deployment runs it: read-only root, uid/gid 65532, no capabilities, tmpfs for /tmp and
/var/lib/egress-proxies, the Deployment's own command, against the Kubernetes API emulator and a
test-driver libvirtd; its Proxies go Ready and /healthz, /readyz and /metrics answer.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from egress_proxies.resources.proxy import GROUP, PLURAL, VERSION
from support import REPO
from support.collection.provider_config import BaseImage, kvm_host, make_base_image, write_kvm_config
from support.figures import show
from support.hosts.libvirt_daemon import LibvirtTestDaemon
from support.images import container_image
from support.images.container_image import DEBS_MOUNT, Buildah, Crun, ImageConfig, bind, tmpfs
from support.images.containerfile import parse
from support.kube.emulator import KubeEmulator
from support.waiting import wait_for

CONTAINERFILE = REPO / "controller" / "Containerfile"
BUILD_ENV = REPO / "controller" / "build_env.sh"
DEPLOYMENT = REPO / "controller" / "manifests" / "deployment.yaml"
POOL_CRD = REPO / "controller" / "manifests" / "crd-proxypool.yaml"
IMAGE_PREFIX = "/opt/egress-proxies"
COMPILERS = re.compile(r"^(gcc|gcc-\d+|cpp|cpp-\d+|g\+\+|g\+\+-\d+|clang.*|binutils.*|build-essential|make|"
                       r"pkg-config|pkgconf|libc6-dev|.*-dev)$")
SECRET_NAME = re.compile(r"(TOKEN|PASSWORD|PASSWD|SECRET|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY)", re.I)
SECRET_FILE = re.compile(r"(id_(rsa|ed25519|ecdsa|dsa)|\.pem$|\.key$|known_hosts|kubeconfig|\.kube|\.ssh|"
                         r"\.env$|credentials|token)", re.I)
# The target: the first build measured 665 MB (pip, setuptools, tests and all).
MAX_IMAGE_BYTES = 400 * 1000 * 1000
# The test-driver storage pool.
POOL = "default-pool"
Obj = dict[str, Any]

FILE = parse(CONTAINERFILE.read_text())
STAGES = FILE.stages
FINAL = STAGES[-1]


def deployment() -> Obj:
    loaded: Obj = yaml.safe_load(DEPLOYMENT.read_text())
    return loaded


def container() -> Obj:
    (only,) = deployment()["spec"]["template"]["spec"]["containers"]
    result: Obj = only
    return result


def galaxy_version() -> str:
    version: str = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    return version


# -- static checks -------------------------------------------------------------------------------


def test_it_is_multi_stage_and_every_base_image_is_pinned() -> None:
    assert len(STAGES) >= 2
    for stage in STAGES:
        base = FILE.base(stage)
        name, _, digest = base.partition("@")
        repository, _, tag = name.rpartition(":")
        assert repository and "/" in repository, f"{base}: name the registry and repository in full"
        assert digest == "" or re.fullmatch(r"sha256:[0-9a-f]{64}", digest), base
        # A version down to the point release (12.11, 3.11.14), never latest or a bare major.
        assert re.match(r"^\d+\.\d+", tag), f"{base}: not pinned to a version"
    # The venv is built in one stage and run in the other: the same base, so the same python3;
    # one build argument moves both.
    assert {stage.base for stage in STAGES} == {"${BASE}"}


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


def test_the_dependency_layer_comes_before_the_sources_and_installs_offline() -> None:
    """The slow layer (pip from the wheelhouse, libvirt-python compiled) reads only the pins, so a
    source change rebuilds from `COPY . .` on; every pip call in build_env.sh's image steps is
    --no-index, the wheelhouse coming from a named build context."""
    build = STAGES[0]
    steps = [f"{keyword} {args}" for keyword, args in build.instructions if keyword in ("COPY", "RUN")]
    deps = steps.index(f"RUN bash controller/build_env.sh deps /src {IMAGE_PREFIX} /wheelhouse")
    sources = steps.index("COPY . .")
    assert deps < sources
    assert steps[sources + 1] == f"RUN bash controller/build_env.sh app /src {IMAGE_PREFIX} /wheelhouse"
    assert set(steps[:deps]) - {s for s in steps[:deps] if s.startswith("RUN apt-get")} == {
        "COPY requirements.txt constraints.txt ./", "COPY controller/build_env.sh controller/",
        "COPY --from=wheelhouse . /wheelhouse/"}
    script = BUILD_ENV.read_text()
    assert "--no-index --find-links \"$WHEELHOUSE\"" in script
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


# -- the image, built and run ----------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltImage:
    name: str
    base: str
    buildah: Buildah
    inspected: Obj
    rootfs: Path  # a working container's root filesystem
    build_seconds: float
    size: int  # bytes, as buildah reports the image
    content: int  # bytes of the root filesystem's files (du)

    @property
    def config(self) -> ImageConfig:
        return ImageConfig.from_inspect(self.inspected)


def report(config: pytest.Config, line: str) -> None:
    """A measurement, in every run's output (the issue asks for them)."""
    show(config, "controller image:", [line])


@pytest.fixture(scope="module")
def built_image(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[BuiltImage]:
    """The image, built from this tree: minutes; the base and the wheelhouse come from the cache
    (made once per machine, several minutes more the first time)."""
    packages = [p for stage in STAGES for p in stage.apt_packages()]
    base_dir = container_image.container_base(packages)
    wheels = container_image.wheelhouse(REPO)
    work = tmp_path_factory.mktemp("image")
    buildah = Buildah(work / "storage")
    base = f"localhost/egress-proxies-test-base:{base_dir.name}"
    name = f"localhost/egress-proxies-controller:{galaxy_version()}-test"
    try:
        buildah.import_rootfs(base_dir / "rootfs.tar", base)
        started = time.monotonic()
        buildah.build(CONTAINERFILE, REPO, name, work / "build.log", build_args={"BASE": base},
                      build_contexts={"wheelhouse": wheels}, volumes={base_dir / "debs": DEBS_MOUNT}, timeout=1200)
        seconds = time.monotonic() - started
        rootfs = buildah.mount(name)
        content, runtime = (int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True,
                                               check=True).stdout.split()[0])
                            for path in (rootfs, rootfs / IMAGE_PREFIX.lstrip("/")))
        image = BuiltImage(name, base, buildah, buildah.inspect(name), rootfs, seconds, buildah.size(name), content)
        report(pytestconfig, f"built in {seconds:.0f} s; size {image.size / 1e6:.0f} MB (buildah), "
                             f"files {content / 1e6:.0f} MB, of which {IMAGE_PREFIX} {runtime / 1e6:.0f} MB")
        yield image
    finally:
        buildah.remove()


@pytest.fixture(scope="module")
def crun(built_image: BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Crun]:
    runtime = Crun(built_image.rootfs, built_image.config, tmp_path_factory.mktemp("crun"))
    yield runtime
    runtime.stop_all()


@pytest.mark.timeout(2400)
def test_the_image_is_small_labelled_and_has_no_pip_or_compilers(built_image: BuiltImage) -> None:
    rootfs = built_image.rootfs
    assert built_image.size <= MAX_IMAGE_BYTES, f"{built_image.size / 1e6:.0f} MB"
    assert built_image.content <= MAX_IMAGE_BYTES, f"{built_image.content / 1e6:.0f} MB"
    labels = built_image.inspected["OCIv1"]["config"]["Labels"]
    assert labels["org.opencontainers.image.title"] == "egress-proxies-controller"
    assert labels["org.opencontainers.image.version"] == galaxy_version()
    assert labels["org.opencontainers.image.licenses"] == "GPL-3.0-or-later"
    assert labels["org.opencontainers.image.base.name"] == built_image.base
    assert labels["org.opencontainers.image.description"]

    site = rootfs / IMAGE_PREFIX.lstrip("/") / "venv" / "lib" / "python3.11" / "site-packages"
    assert (site / "egress_proxies").is_dir() and (site / "libvirt.py").is_file()
    for gone in ("pip", "setuptools", "_distutils_hack", "pkg_resources", "wheel", "ansible_test",
                 "kubernetes/aio", "kubernetes/test", "kubernetes/e2e_test"):
        assert not (site / gone).exists(), gone
    assert not list(site.glob("pip-*")) and not list(site.glob("setuptools-*"))
    assert not (rootfs / "usr" / "bin" / "pip3").exists()
    # No compiler, in files or in dpkg's record; nothing of the build stage but /opt/egress-proxies.
    for tool in ("gcc", "cc", "cpp", "ld", "as", "make", "pkg-config"):
        assert not (rootfs / "usr" / "bin" / tool).exists(), tool
    status = (rootfs / "var" / "lib" / "dpkg" / "status").read_text()
    installed = re.findall(r"^Package: (\S+)\n(?:.+\n)*?Status: install ok installed$", status, re.M)
    assert {"python3", "libvirt0", "openssh-client"} <= set(installed)
    assert sorted(p for p in installed if COMPILERS.match(p)) == []
    for leftover in ("src", "wheelhouse"):
        assert not (rootfs / leftover).exists(), leftover
    assert list((rootfs / "var" / "lib" / "apt" / "lists").iterdir()) == []


@pytest.mark.timeout(2400)
def test_the_image_config_is_what_the_deployment_runs(built_image: BuiltImage) -> None:
    config = built_image.config
    pod = deployment()["spec"]["template"]["spec"]["securityContext"]
    assert config.user == (pod["runAsUser"], pod["runAsGroup"]) == (65532, 65532)
    assert config.entrypoint == [container()["command"][0]]
    assert config.workdir == "/var/lib/egress-proxies"
    assert config.env == FINAL.env()
    assert "8080/tcp" in built_image.inspected["OCIv1"]["config"]["ExposedPorts"]
    # The passwd entry Ansible expands ~ from, and the work dir the user owns.
    passwd = (built_image.rootfs / "etc" / "passwd").read_text()
    assert "egress-proxies:x:65532:65532::/tmp:/usr/sbin/nologin" in passwd.splitlines()
    work = (built_image.rootfs / "var" / "lib" / "egress-proxies").stat()
    assert (work.st_uid, work.st_gid) == (65532, 65532)


@pytest.mark.timeout(2400)
def test_the_image_runs_the_controller_and_the_installed_collection(crun: Crun) -> None:
    """As uid 65532 on the read-only root: the command, every import the modules and the
    controller need, and the collection Ansible finds."""
    scratch = [tmpfs("/tmp", "1777"), tmpfs("/var/lib/egress-proxies", "0777")]
    version = crun.run(["egress-proxies", "--version"], mounts=scratch)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"egress-proxies {galaxy_version()}"
    modules = "ansible_runner, libvirt, pycdlib, kubernetes, google.cloud.compute_v1, prometheus_client, bcrypt"
    imported = crun.run(["python3", "-c", f"import {modules}, egress_proxies; print(egress_proxies.__file__)"],
                        mounts=scratch)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.startswith(f"{IMAGE_PREFIX}/venv/")
    no_pip = crun.run(["python3", "-m", "pip", "--version"], mounts=scratch)
    assert no_pip.returncode != 0 and "No module named pip" in no_pip.stderr
    listed = crun.run(["ansible-doc", "--list", "--json", "crawl.egress_proxies"], mounts=scratch)
    assert listed.returncode == 0, listed.stderr
    assert set(json.loads(listed.stdout)) == {f"crawl.egress_proxies.{p}_proxy{s}" for p in ("kvm", "gcp", "k8s")
                                               for s in ("", "_info")} | {"crawl.egress_proxies.provider_config_info"}
    # The same root without the tmpfs volumes: nothing is writable (the Deployment's volumes are needed).
    readonly = crun.run(["sh", "-c", "touch /tmp/x || touch /var/lib/egress-proxies/x || touch /x"])
    assert readonly.returncode != 0 and "Read-only file system" in readonly.stderr


# -- the image running the controller against the cluster and a hypervisor -------------------------


@pytest.fixture(scope="module")
def shared_libvirtd(built_image: BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LibvirtTestDaemon]:
    """A test-driver libvirtd the container's user may use; the container sees its socket alone,
    bind-mounted. The session's daemon will not do: its socket is root's only, and libvirtd
    looks up every local client's uid (from the socket's peer credentials) in its passwd and
    group files, failing the connection for a uid it does not know ("Failed to find user record
    for uid '65532'"). In a cluster the controller reaches libvirtd over qemu+ssh as the SSH
    user, so this is the test's arrangement only: the daemon's private mount namespace gets
    passwd and group files with the image's own entries for its user added, this machine's
    files untouched."""
    uid, gid = built_image.config.user
    work = tmp_path_factory.mktemp("libvirtd-users")
    for name, number in (("passwd", uid), ("group", gid)):
        image_entries = (built_image.rootfs / "etc" / name).read_text().splitlines()
        (entry,) = [line for line in image_entries if line.split(":")[2] == str(number)]
        (work / name).write_text(Path("/etc", name).read_text() + entry + "\n")
        (work / name).chmod(0o644)
    with LibvirtTestDaemon() as daemon:
        daemon.socket_path.chmod(0o666)
        pid = (daemon.root / "libvirtd.pid").read_text().strip()
        subprocess.run(["nsenter", "--target", pid, "--mount", "sh", "-c",
                        f"mount --bind {work / 'passwd'} /etc/passwd && mount --bind {work / 'group'} /etc/group"],
                       check=True, capture_output=True, text=True)
        yield daemon


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return 0, ""


def deployment_command(listen: str, metrics_listen: str, kubeconfig: str) -> tuple[list[str], dict[str, str]]:
    """The Deployment's command and env, as the kubelet would run them here: $(VAR) expanded,
    --listen and --metrics-listen on loopback only (the host's network), the API server from a
    kubeconfig instead of the in-cluster service account (the emulator speaks plain HTTP)."""
    main = container()
    env = {"POD_NAMESPACE": "egress-proxies", "POD_NAME": "egress-proxies-controller-0"}
    env |= {item["name"]: item["value"] for item in main["env"] if "value" in item}
    command = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], word) for word in main["command"]]
    command[command.index("--listen") + 1] = listen
    command[command.index("--metrics-listen") + 1] = metrics_listen
    return [*command, "--kubeconfig", kubeconfig], env


def phases(objects: client.CustomObjectsApi, namespace: str) -> dict[str, str]:
    listed = objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    assert isinstance(listed, dict)
    return {item["metadata"]["name"]: (item.get("status") or {}).get("phase", "") for item in listed["items"]}


@pytest.mark.timeout(2400)
def test_the_image_runs_the_deployments_command_until_its_proxies_are_ready(
        crun: Crun, kube: KubeEmulator, api: client.ApiClient, shared_libvirtd: LibvirtTestDaemon,
        tmp_path: Path, pytestconfig: pytest.Config) -> None:
    names = ["crawler-a", "crawler-b", "crawler-c"]
    kube.create_namespace("egress-proxies")  # the controller's: its Lease and the credentials' Secrets
    kube.create_namespace("crawlers")
    kube.install_crd(yaml.safe_load(POOL_CRD.read_text()))  # deploy_controller.yml applies both CRDs
    objects = client.CustomObjectsApi(api)
    for name in names:
        objects.create_namespaced_custom_object(GROUP, VERSION, "crawlers", PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Proxy", "metadata": {"name": name, "namespace": "crawlers"},
            "spec": {"provider": "lab", "cloudInit": "#cloud-config\n"}})

    # What the container sees, at its own paths: the provider config as the ConfigMap volume,
    # the kubeconfig, the libvirt socket and the base image (mounted alone, read-only).
    image = make_base_image(tmp_path)
    image.path.chmod(0o644)
    config_dir = tmp_path / "provider-config"
    config_dir.mkdir(mode=0o755)
    socket_in = "/run/egress-proxies-test/libvirt-sock"
    image_in = BaseImage(Path("/srv/egress-proxies-test/base.qcow2"), image.sha256)
    write_kvm_config(config_dir / "providers.yaml", [kvm_host("h1", f"test+unix:///default?socket={socket_in}",
                                                             pool=POOL)], image_in).chmod(0o644)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": kube.url}}],
        "users": [{"name": "controller", "user": {}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "controller"}}]}))
    kubeconfig.chmod(0o644)
    port, metrics_port = free_port(), free_port()
    command, env = deployment_command(f"127.0.0.1:{port}", f"127.0.0.1:{metrics_port}",
                                      "/etc/egress-proxies-test/kubeconfig")
    mounts = [
        bind(config_dir, "/etc/egress-proxies"),
        bind(kubeconfig, "/etc/egress-proxies-test/kubeconfig"),
        bind(shared_libvirtd.socket_path, socket_in),
        bind(image.path, str(image_in.path)),
        tmpfs("/var/lib/egress-proxies", "0777"),
        tmpfs("/tmp", "1777"),
    ]
    output = tmp_path / "controller.log"

    started = time.monotonic()
    name, process = crun.start(command, output, env=env, mounts=mounts)
    try:
        def ready() -> bool:
            assert process.poll() is None, f"the controller exited ({process.returncode}):\n{output.read_text()}"
            return set(phases(objects, "crawlers").values()) == {"Ready"}

        wait_for(ready, 240, "the Proxies to be Ready", interval=0.2,
                 diagnostics=lambda: f"{phases(objects, 'crawlers')}\n{output.read_text()[-4000:]}")
        to_ready = time.monotonic() - started
        report(pytestconfig, f"started to {len(names)} Proxies Ready in {to_ready:.1f} s")
        wait_for(lambda: http_get(port, "/readyz")[0] == 200, 60, "/readyz to answer 200")
        assert http_get(port, "/healthz") == (200, "ok\n")
        assert http_get(port, "/metrics")[0] == 404  # never on the discovery port (contract change 38)
        status, metrics = http_get(metrics_port, "/metrics")
        assert status == 200
        assert re.search(r'^egress_proxies_proxies\{phase="Ready"\} 3\.0$', metrics, re.M), metrics
        assert re.search(r"^leader_election_master_status\{name=\"[^\"]+\"\} 1\.0$", metrics, re.M)
        assert re.search(rf'^egress_proxies_build_info\{{(.*,)?version="{re.escape(galaxy_version())}"', metrics, re.M)
        for proxy in names:
            found = objects.get_namespaced_custom_object(GROUP, VERSION, "crawlers", PLURAL, proxy)
            assert isinstance(found, dict)
            assert found["status"]["location"] == "h1"
    finally:
        status_code = crun.stop(name)
    log = output.read_text()
    assert status_code == 0, log
    domains = {d.name() for d in shared_libvirtd.connection.listAllDomains()} - {"test"}
    assert len(domains) == len(names)
    assert "Read-only file system" not in log and "Traceback" not in log, log
