"""controller/Containerfile built with Debian's buildah and run with crun, as the image test does.

Nothing reaches a registry or a package index while the image is built or run. What the build
consumes is made beforehand, once per machine, from Debian's mirror and the Python package index
(as the guest images and package repositories are), and cached outside the repository::

    /var/cache/egress-proxies-tests/container-base/<key>/rootfs.tar   a Debian 12 minbase, slimmed
                                                          debs/        the Containerfile's packages
                                                          packages     (name<TAB>version)
                                                          build.log
    /var/cache/egress-proxies-tests/wheelhouses/<key>/*.whl, *.tar.gz  `build_env.sh wheelhouse`

``container-base`` keys cover tests/support/images/container_base/build.sh and the package list;
``wheelhouses`` keys cover requirements.txt, constraints.txt and build_env.sh's build backend
pin. A key directory appears only complete and a lock makes concurrent callers wait for one
build, as in guest_image.py. The image build itself (:meth:`Buildah.build`) runs in a network
namespace of its own, with nothing but a down loopback: the base's only apt source is the
``debs/`` repository bind-mounted into the build, pip installs from the wheelhouse only.

Images live in vfs storage private to the caller (a temporary directory, removed by
:meth:`Buildah.remove`). :class:`Crun` runs an image's root filesystem the way
controller/manifests/deployment.yaml runs the image: read-only root, the image's user, no
capabilities, no new privileges, tmpfs where the Deployment has emptyDir volumes. It shares the
host's network namespace so the controller reaches the test's emulator and daemons on
127.0.0.1 (and, with ``probe: none``, nothing else).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.images.cache import BUILDING_PREFIX, locked, prune
from support.process import log_tail, stop_process_group

CACHE_ROOT = Path("/var/cache/egress-proxies-tests")
BASE_SCRIPT = Path(__file__).resolve().parent / "container_base" / "build.sh"
# Where build.sh's root filesystem expects its package repository (its only apt source).
DEBS_MOUNT = "/mnt/egress-proxies-debs"
# debootstrap plus the downloads (a few minutes), or pip's downloads; for a slow mirror.
FETCH_TIMEOUT = 1800.0
# What `buildah from scratch` lacks and every Debian image sets.
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# cgroup2 mounted beside cgroup v1 (see Crun._crun).
UNIFIED = "/sys/fs/cgroup/unified"


def _run_logged(command: Sequence[str], log: Path, timeout: float, env: dict[str, str] | None = None) -> None:
    """Run ``command`` with its output in ``log``; in its own session, so a timeout stops all of it."""
    with open(log, "wb") as output:
        process = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                   start_new_session=True, env=env)
        try:
            status = process.wait(timeout=timeout)
        finally:
            if process.poll() is None:
                stop_process_group(process, timeout=30)
    if status != 0:
        raise RuntimeError(f"{shlex.join(command[:4])} ... failed with status {status}:\n{log_tail([log], lines=40)}")


def cached(cache_root: Path, key: str, make: Callable[[Path, Path], None]) -> Path:
    """``cache_root/key``, made first by ``make(staging_dir, log)`` when it does not exist yet."""
    key_dir = cache_root / key
    if not key_dir.is_dir():
        with locked(cache_root):
            # Another caller may have made it while this one waited for the lock.
            if not key_dir.is_dir():
                # Under the lock, so a leftover staging directory belongs to a build that died.
                for stale in cache_root.glob(BUILDING_PREFIX + "*"):
                    if stale.is_dir():
                        shutil.rmtree(stale)
                    else:
                        stale.unlink()
                staging = cache_root / f"{BUILDING_PREFIX}{key}"
                log = cache_root / f"{BUILDING_PREFIX}{key}.log"
                staging.mkdir()
                try:
                    make(staging, log)
                except BaseException:
                    shutil.rmtree(staging)
                    raise
                log.rename(staging / "build.log")
                staging.rename(key_dir)
                prune(cache_root, keep=key_dir)
    os.utime(key_dir)  # in use, for pruning
    return key_dir


def container_base(packages: Sequence[str], cache_root: Path = CACHE_ROOT / "container-base") -> Path:
    """The directory of a local Debian 12 base (rootfs.tar) and a repository (debs/) of ``packages``."""
    wanted = sorted(set(packages))
    key = hashlib.sha256(BASE_SCRIPT.read_bytes() + b"\0" + "\n".join(wanted).encode()).hexdigest()[:16]

    def make(staging: Path, log: Path) -> None:
        _run_logged(["bash", str(BASE_SCRIPT), str(staging), *wanted], log, FETCH_TIMEOUT)

    return cached(cache_root, key, make)


def wheelhouse(repo: Path, cache_root: Path = CACHE_ROOT / "wheelhouses") -> Path:
    """Every pinned Python requirement of the image, downloaded by ``build_env.sh wheelhouse``."""
    build_env = repo / "controller" / "build_env.sh"
    backend = re.findall(r"^BUILD_BACKEND=.*$", build_env.read_text(), re.M)
    document = [(repo / name).read_bytes() for name in ("requirements.txt", "constraints.txt")]
    key = hashlib.sha256(b"\0".join([*document, *(line.encode() for line in backend)])).hexdigest()[:16]

    def make(staging: Path, log: Path) -> None:
        # Debian's python3: the image's Python (3.11), whose wheels the image needs.
        _run_logged(["bash", str(build_env), "wheelhouse", str(repo), str(staging)], log, FETCH_TIMEOUT,
                    env={**os.environ, "PYTHON": "/usr/bin/python3"})

    return cached(cache_root, key, make)


class Buildah:
    """buildah on a private vfs storage under ``storage``, chroot isolation, never pulling."""

    def __init__(self, storage: Path) -> None:
        self.storage = storage
        self.globals = ["--root", str(storage / "root"), "--runroot", str(storage / "runroot"),
                        "--storage-driver", "vfs"]
        self.environ = {**os.environ, "BUILDAH_ISOLATION": "chroot"}

    def __call__(self, *args: str, timeout: float = 300) -> str:
        done = subprocess.run(["buildah", *self.globals, *args], capture_output=True, text=True, timeout=timeout,
                              env=self.environ, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"buildah {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
        return done.stdout

    def import_rootfs(self, rootfs_tar: Path, name: str) -> None:
        """An image ``name`` of one layer: the root filesystem in ``rootfs_tar``."""
        container = self("from", "scratch").strip()
        self("add", container, str(rootfs_tar), "/", timeout=600)
        self("config", "--env", f"PATH={BASE_PATH}", "--cmd", "bash", "--os", "linux", "--arch", "amd64", container)
        self("commit", "--quiet", "--rm", container, name, timeout=600)

    def build(self, containerfile: Path, context: Path, tag: str, log: Path, *, build_args: dict[str, str],
              build_contexts: dict[str, Path], volumes: dict[Path, str], timeout: float) -> None:
        """``buildah build`` in a new network namespace: anything the build tried to fetch would fail."""
        command = ["unshare", "--net", "buildah", *self.globals, "build", "--isolation", "chroot", "--pull=never",
                   "--file", str(containerfile), "--tag", tag]
        command += [f"--build-arg={name}={value}" for name, value in build_args.items()]
        command += [f"--build-context={name}={path}" for name, path in build_contexts.items()]
        command += [f"--volume={source}:{target}:ro" for source, target in volumes.items()]
        _run_logged([*command, str(context)], log, timeout, env=self.environ)

    def inspect(self, image: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self("inspect", "--type", "image", image))
        return found

    def size(self, image: str) -> int:
        """The image's size as `buildah images` reports it (its layers, uncompressed), in bytes: it
        prints three significant digits in decimal units ("381 MB")."""
        (found,) = json.loads(self("images", "--json", image))
        number, unit = found["size"].split()
        return round(float(number) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[unit])

    def mount(self, image: str) -> Path:
        """A working container of ``image``; its root filesystem's path."""
        container = self("from", "--pull=never", image).strip()
        return Path(self("mount", container).strip())

    def remove(self) -> None:
        """Every container and image, then the storage itself."""
        try:
            self("rm", "--all")
            self("rmi", "--all", "--force")
        finally:
            shutil.rmtree(self.storage, ignore_errors=True)


@dataclass(frozen=True)
class ImageConfig:
    """What the image's own configuration says about running it (OCI image config)."""

    user: tuple[int, int]
    env: dict[str, str]
    entrypoint: list[str]
    workdir: str

    @classmethod
    def from_inspect(cls, inspected: dict[str, Any]) -> ImageConfig:
        config = inspected["OCIv1"]["config"]
        uid, _, gid = config["User"].partition(":")
        # Numeric, as runAsNonRoot requires; a name would need the image's passwd to resolve.
        return cls(user=(int(uid), int(gid or uid)), env=dict(item.split("=", 1) for item in config["Env"]),
                   entrypoint=list(config["Entrypoint"]), workdir=config["WorkingDir"])


@dataclass(frozen=True)
class Mount:
    destination: str
    source: str
    type: str = "bind"
    options: tuple[str, ...] = ("rbind", "ro")

    def spec(self) -> dict[str, Any]:
        return {"destination": self.destination, "type": self.type, "source": self.source,
                "options": list(self.options)}


def bind(source: Path, destination: str, writable: bool = False) -> Mount:
    return Mount(destination, str(source), options=("rbind", "rw" if writable else "ro", "nosuid", "nodev"))


def tmpfs(destination: str, mode: str) -> Mount:
    """An emptyDir volume's stand-in."""
    return Mount(destination, "tmpfs", "tmpfs", ("nosuid", "nodev", f"mode={mode}", "size=512m"))


@dataclass
class Crun:
    """Containers of one root filesystem, run by crun with state under ``state``."""

    rootfs: Path
    config: ImageConfig
    state: Path
    _count: int = 0
    _running: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def spec(self, args: Sequence[str], env: dict[str, str], mounts: Sequence[Mount]) -> dict[str, Any]:
        """The OCI runtime spec: the Deployment's securityContext, as far as a runtime spec says it."""
        uid, gid = self.config.user
        no_capabilities: dict[str, list[str]] = {kind: [] for kind in
                                                 ("bounding", "effective", "inheritable", "permitted", "ambient")}
        return {
            "ociVersion": "1.0.2",
            "process": {
                "terminal": False, "user": {"uid": uid, "gid": gid}, "args": list(args),
                "env": [f"{name}={value}" for name, value in {**self.config.env, **env}.items()],
                "cwd": self.config.workdir,
                "capabilities": no_capabilities,  # capabilities: drop [ALL]
                "noNewPrivileges": True,  # allowPrivilegeEscalation: false
            },
            "root": {"path": str(self.rootfs), "readonly": True},  # readOnlyRootFilesystem: true
            "hostname": "egress-proxies-controller",
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                 "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
                {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
                 "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
                {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                 "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
                {"destination": "/sys", "type": "bind", "source": "/sys",
                 "options": ["rbind", "ro", "nosuid", "nodev"]},
                *(mount.spec() for mount in mounts),
            ],
            "linux": {
                # No network namespace: the host's, for the test's servers on 127.0.0.1.
                "namespaces": [{"type": kind} for kind in ("pid", "ipc", "uts", "mount")],
                "maskedPaths": ["/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
                                "/proc/sched_debug", "/sys/firmware", "/proc/scsi"],
                "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
            },
        }

    def _crun(self, *args: str) -> list[str]:
        """A crun command line. The container gets no cgroup of its own (nothing here limits it,
        and this machine's hierarchy is not delegated to crun). These machines mount cgroup v1
        with a cgroup2 hierarchy beside it (/sys/fs/cgroup/unified, the hugetlb controller
        available in it), a "hybrid" setup crun 1.8 refuses outright, even with cgroups disabled:
        crun runs in a mount namespace of its own where that one mount is gone."""
        command = shlex.join(["crun", "--root", str(self.state), "--cgroup-manager=disabled", *args])
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                f"if mountpoint -q {UNIFIED}; then umount {UNIFIED}; fi && exec {command}"]

    def _bundle(self, args: Sequence[str], env: dict[str, str], mounts: Sequence[Mount]) -> tuple[str, Path]:
        self._count += 1
        name = f"egress-proxies-test-{os.getpid()}-{self._count}"
        bundle = self.state / "bundles" / name
        bundle.mkdir(parents=True)
        (bundle / "config.json").write_text(json.dumps(self.spec(args, env, mounts), indent=1))
        return name, bundle

    def run(self, args: Sequence[str], env: dict[str, str] | None = None, mounts: Sequence[Mount] = (),
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``args`` in a container to completion."""
        name, bundle = self._bundle(args, env or {}, mounts)
        try:
            return subprocess.run(self._crun("run", "--bundle", str(bundle), name), capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL, check=False)
        finally:
            subprocess.run(self._crun("delete", "--force", name), capture_output=True, check=False)

    def start(self, args: Sequence[str], output: Path, env: dict[str, str] | None = None,
              mounts: Sequence[Mount] = ()) -> tuple[str, subprocess.Popen[bytes]]:
        """Start ``args`` in a container; its stdout and stderr go to ``output``."""
        name, bundle = self._bundle(args, env or {}, mounts)
        with open(output, "wb") as out:
            process = subprocess.Popen(self._crun("run", "--bundle", str(bundle), name), stdin=subprocess.DEVNULL,
                                       stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._running[name] = process
        return name, process

    def stop(self, name: str, timeout: float = 60) -> int:
        """SIGTERM to the container's process, as the kubelet sends; its exit status."""
        process = self._running.pop(name)
        try:
            subprocess.run(self._crun("kill", name, "TERM"), capture_output=True, check=False)
            try:
                return process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                subprocess.run(self._crun("kill", name, "KILL"), capture_output=True, check=False)
                stop_process_group(process, timeout=10)
                raise
        finally:
            subprocess.run(self._crun("delete", "--force", name), capture_output=True, check=False)

    def stop_all(self) -> None:
        for name in list(self._running):
            try:
                self.stop(name, timeout=30)
            except subprocess.TimeoutExpired:
                pass


def timed(action: Callable[[], None]) -> float:
    started = time.monotonic()
    action()
    return time.monotonic() - started
