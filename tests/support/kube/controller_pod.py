"""The controller's Pod as a kubelet would run it from the Deployment the deploy playbook applied.

The Kubernetes API emulator stores the Deployment; nothing runs it. :func:`controller_pod` does what
a kubelet and the image would, for the real ``egress-proxies`` command:

- **volumes**: every ``configMap`` and ``secret`` volume of the Pod template is written from the
  object in the emulator (a missing optional one is an empty directory, a missing required one
  fails, as the kubelet would not start the Pod), with its ``defaultMode``; ``emptyDir`` is empty;
- **mounts**: the command runs in a mount namespace of its own where each ``volumeMount`` is bound
  at its ``mountPath`` (``readOnly`` honoured), as are the service account's token and CA
  (``/var/run/secrets/kubernetes.io/serviceaccount``) and the installed collection where the image
  has it. A mount point the host lacks (``/etc/egress-proxies``) is made in an overlay over its
  nearest existing directory, in that namespace only: nothing on the host changes;
- **network**: the Pod's network is a namespace of the test's (``netns``); the API server is
  reached as in a cluster, ``KUBERNETES_SERVICE_HOST``/``PORT`` over TLS (the test's
  :class:`~support.netns.tls_front.TlsFront` before the emulator);
- **container**: the template's command with ``$(VAR)`` expanded from its ``env`` (``fieldRef``
  and ``secretKeyRef`` resolved from the emulator), in the image's environment (controller/Containerfile's
  ``ENV``), plus ``--log-format json`` so the test reads its log.

What it does not play: the Pod's user (it runs as the test's root), its read-only root
filesystem, its resource limits and its probes.
"""

from __future__ import annotations

import base64
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support import REPO
from support.collection.artifact import dependencies_path
from support.controller.command import EGRESS_PROXIES, ControllerProcess
from support.kube.emulator import KubeEmulator
from support.netns.namespace import NetworkNamespace

Obj = dict[str, Any]
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
# The image's ENV names where the collection is (controller/Containerfile).
CONTAINERFILE = REPO / "controller" / "Containerfile"


@dataclass(frozen=True)
class Mount:
    target: str
    source: Path
    read_only: bool = True


@dataclass(frozen=True)
class ClusterAccess:
    """How a Pod reaches the API server: its address and port, and the CA its certificate is from."""

    host: str
    port: int
    ca_file: Path


def image_environment() -> dict[str, str]:
    """The last ``ENV`` instruction of controller/Containerfile, as KEY: VALUE (PATH left out: the
    image's venv is this test's interpreter)."""
    text = CONTAINERFILE.read_text().replace("\\\n", " ")
    (*_, last) = re.findall(r"^ENV (.*)$", text, re.M)
    pairs = dict(word.split("=", 1) for word in shlex.split(last))
    pairs.pop("PATH")
    return pairs


def volume_files(kube: KubeEmulator, namespace: str, volume: Obj) -> dict[str, bytes]:
    """What the kubelet writes into ``volume``: the ConfigMap's or Secret's keys, or nothing."""
    for kind, resource, name_field in (("configMap", "configmaps", "name"), ("secret", "secrets", "secretName")):
        if kind not in volume:
            continue
        source = volume[kind]
        stored = kube.get_object(resource, namespace, source[name_field])
        if stored is None:
            assert source.get("optional"), f"the Pod cannot start: its {kind} {source[name_field]} does not exist"
            return {}
        if kind == "secret":
            return {key: base64.b64decode(value) for key, value in (stored.get("data") or {}).items()}
        return {key: value.encode() for key, value in (stored.get("data") or {}).items()}
    assert "emptyDir" in volume, f"a volume kind the kubelet stand-in does not know: {volume}"
    return {}


def write_volumes(kube: KubeEmulator, namespace: str, pod: Obj, directory: Path) -> dict[str, Path]:
    """Each volume of ``pod`` written under ``directory``, by name."""
    written = {}
    for volume in pod["volumes"]:
        path = directory / volume["name"]
        path.mkdir(parents=True)
        mode = next((volume[kind].get("defaultMode", 0o644) for kind in ("configMap", "secret") if kind in volume),
                    None)
        for key, data in volume_files(kube, namespace, volume).items():
            (path / key).write_bytes(data)
            (path / key).chmod(mode or 0o644)
        written[volume["name"]] = path
    return written


def container_environment(kube: KubeEmulator, namespace: str, pod_name: str, container: Obj) -> dict[str, str]:
    """The container's ``env``: values, the Pod's fields and Secret keys (a missing optional one unset)."""
    fields = {"metadata.namespace": namespace, "metadata.name": pod_name}
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "fieldRef" in item["valueFrom"]:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            secret = kube.get_object("secrets", namespace, ref["name"])
            if secret is None or ref["key"] not in (secret.get("data") or {}):
                assert ref.get("optional"), f"the Pod cannot start: Secret {ref['name']} has no key {ref['key']}"
                continue
            env[item["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
    return env


def missing_ancestor(target: Path) -> tuple[Path, Path] | None:
    """For a mount point the host lacks: its nearest existing directory (symlinks resolved) and
    the path below it to make; None when it exists."""
    if target.exists():
        return None
    ancestor = target
    while not ancestor.exists():
        ancestor = ancestor.parent
    return Path(os.path.realpath(ancestor)), target.relative_to(ancestor)


def mount_script(mounts: list[Mount], scratch: Path) -> str:
    """Shell lines that bind each mount at its target in the current (private) mount namespace."""
    lines = ["set -e", "mount --make-rprivate /"]
    overlays: dict[Path, Path] = {}
    for mount in mounts:
        target = Path(mount.target)
        parent = next((other for other in mounts if other is not mount
                       and target.is_relative_to(other.target)), None)
        if parent is not None:  # a mount inside another volume: its directory made there, as the kubelet does
            (parent.source / target.relative_to(parent.target)).mkdir(parents=True, exist_ok=True)
        elif (missing := missing_ancestor(target)) is not None:
            ancestor, below = missing
            layer = overlays.setdefault(ancestor, scratch / f"overlay{len(overlays)}")
            (layer / "upper" / below).mkdir(parents=True, exist_ok=True)
            (layer / "work").mkdir(exist_ok=True)
    for ancestor, layer in overlays.items():
        lines.append(f"mount -t overlay overlay -o lowerdir={ancestor},upperdir={layer / 'upper'},"
                     f"workdir={layer / 'work'} {ancestor}")

    def order(mount: Mount) -> tuple[bool, int]:
        # Parents before children; a mount that would hide another's source (/tmp) last.
        hides = any(other.source.is_relative_to(mount.target) for other in mounts if other is not mount)
        return hides, len(Path(mount.target).parts)

    for mount in sorted(mounts, key=order):
        lines.append(f"mount --bind {shlex.quote(str(mount.source))} {shlex.quote(mount.target)}")
        if mount.read_only:
            lines.append(f"mount -o remount,bind,ro {shlex.quote(mount.target)}")
    return "\n".join([*lines, 'exec "$@"'])


def controller_pod(kube: KubeEmulator, namespace: str, deployment: str, netns: NetworkNamespace,
                   api: ClusterAccess, collections: Path, directory: Path) -> ControllerProcess:
    """The Deployment's controller Pod, not started (a context manager: ``with controller_pod(...)``)."""
    stored = kube.get_object("deployments.apps", namespace, deployment)
    assert stored is not None, f"no Deployment {namespace}/{deployment}"
    pod = stored["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    pod_name = f"{deployment}-0"
    volumes = write_volumes(kube, namespace, pod, directory / "volumes")
    account = directory / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("a-projected-service-account-token")
    (account / "ca.crt").write_bytes(api.ca_file.read_bytes())
    (account / "namespace").write_text(namespace)
    image = image_environment()
    mounts = [Mount(item["mountPath"], volumes[item["name"]], bool(item.get("readOnly")))
              for item in container["volumeMounts"]]
    mounts += [Mount(SERVICE_ACCOUNT, account), Mount(image["ANSIBLE_COLLECTIONS_PATH"], collections)]
    scratch = directory / "mounts"
    scratch.mkdir()
    env = {**container_environment(kube, namespace, pod_name, container), "PATH": os.environ["PATH"],
           "KUBERNETES_SERVICE_HOST": api.host, "KUBERNETES_SERVICE_PORT": str(api.port)}
    command = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], word) for word in container["command"]]
    assert command[0] == "egress-proxies", command
    process = ControllerProcess(command[1:])
    process.args = netns.command(["sh", "-c", mount_script(mounts, scratch), "sh", EGRESS_PROXIES, *command[1:],
                                  "--log-format", "json"])
    # The image's environment, then the container's; the Python packages' collections beside the image's.
    process.env = {**image, **env, "ANSIBLE_COLLECTIONS_PATH": os.pathsep.join(
        [image["ANSIBLE_COLLECTIONS_PATH"], dependencies_path()])}
    return process
