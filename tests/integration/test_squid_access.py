"""The operator's access policy (plugins/module_utils/squid_access.py) through real squid.

Debian 12's squid 5.7 in a network namespace of the test's own (tests/support/squid.py), with
two configurations the collection delivers:

- **drop-in**: Debian's stock /etc/squid/squid.conf, unchanged but for the path of its
  ``include /etc/squid/conf.d/*.conf``, and the files that the KVM boothook / GCP startup
  script *itself* wrote when run (in a private mount namespace over a tmpfs /etc/squid, so the
  host's squid configuration is never touched);
- **kubernetes**: the squid.conf and password file of the Pod that pods.build_pod makes, taken
  from its annotations, with the provider's default squidConfig.

For each, the matrix of issue 13 is measured and printed at the end of the module's tests:
no credentials and wrong credentials -> 407, right ones -> 204 from the target, a client
address outside allowed_sources -> 403, 127.0.0.1 and 169.254.169.254 -> 403, plus CONNECT to
a port other than 443 and the cache manager -> 403; the target sees no X-Forwarded-For or Via.
Passwords are hashed with the ``bcrypt`` library the controller uses (and SHA-512-crypt via
openssl for the second user), so basic_ncsa_auth's acceptance of both formats is what is tested.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import InstanceRequest
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.pods import (
    CONF_DIR,
    PASSWD_ANNOTATION,
    PASSWD_FILE,
    SQUID_CONF_ANNOTATION,
    build_pod,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.settings import KubernetesSettings
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import (
    DROPIN_PATH,
    PASSWORD_FILE,
    Access,
    install_script,
    parse_access,
)
from support.figures import show
from support.squid import SQUID_USER, NetworkNamespace, Squid, TargetServer

STOCK_SQUID_CONF = Path("/etc/squid/squid.conf")
STOCK_INCLUDE = "include /etc/squid/conf.d/*.conf"
STOCK_DEBIAN_CONF = Path("/etc/squid/conf.d/debian.conf")
# Test-only passwords (random enough to be realistic, never used anywhere else).
PASSWORDS = {"crawlers": "kP3v9wQ0s7R2mX8tL4cB1nY6", "legacy": "Hq5Zt8Wv2Lr0Jx7Nc4Bm9Ks1"}
REQUESTS = ("no credentials", "wrong password", "right password", "source outside allowlist",
            "to 127.0.0.1", "to 169.254.169.254", "CONNECT :8443", "cache manager")
EXPECTED = {"no credentials": 407, "wrong password": 407, "right password": 204, "source outside allowlist": 403,
            "to 127.0.0.1": 403, "to 169.254.169.254": 403, "CONNECT :8443": 403, "cache manager": 403}

MATRIX: dict[str, dict[str, int]] = {}


def _sha512_crypt(password: str) -> str:
    return subprocess.run(["openssl", "passwd", "-6", "-stdin"], input=password + "\n", capture_output=True,
                          text=True, check=True).stdout.strip()


def _access(ns: NetworkNamespace) -> Access:
    access = parse_access({
        "users": [
            {"name": "crawlers", "password_hash": bcrypt.hashpw(PASSWORDS["crawlers"].encode(),
                                                                bcrypt.gensalt(rounds=10)).decode()},
            {"name": "legacy", "password_hash": _sha512_crypt(PASSWORDS["legacy"])},
        ],
        # The test process reaches the namespace from the veth's root end, and only from there.
        "allowed_sources": [f"{ns.gateway}/32"],
    })
    assert access is not None
    return access


@dataclass
class Lab:
    ns: NetworkNamespace
    targets: TargetServer
    outsider: str  # a second address in the namespace, not in allowed_sources


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.fail("real squid in a network namespace needs root; run the tests as root, as CI does")
    with NetworkNamespace() as ns, TargetServer(ns) as targets:
        yield Lab(ns, targets, ns.add_address())
    if MATRIX:
        show(request.config, "measured (issue 13):", _matrix_lines())


def _matrix_lines() -> list[str]:
    width = max(len(name) for name in REQUESTS)
    configs = list(MATRIX)
    lines = [" " * (width + 2) + "  ".join(f"{config:>12}" for config in configs) + "  expected"]
    for name in REQUESTS:
        cells = "  ".join(f"{MATRIX[config].get(name, 0):>12}" for config in configs)
        lines.append(f"  {name:<{width}}{cells}  {EXPECTED[name]:>8}")
    return lines


def _curl(lab: Lab, proxy: str, url: str, user: str | None = None, *, source: str | None = None,
          connect: bool = False, headers: tuple[str, ...] = ()) -> int:
    """The status squid answers (curl's %{http_code}; for CONNECT, the proxy's own answer)."""
    args = ["curl", "-sS", "-o", "/dev/null", "--max-time", "15", "--proxy", f"http://{proxy}",
            "-w", "%{http_connect} %{http_code}"]
    if user is not None:
        args += ["--proxy-user", user]
    if connect:
        args += ["--proxytunnel"]
    for header in headers:
        args += ["-H", header]
    if source is not None:
        # From inside the namespace, bound to an address squid sees as the client.
        args = lab.ns.command([*args, "--interface", source])
    result = subprocess.run([*args, url], capture_output=True, text=True, timeout=30, check=False)
    connect_code, http_code = result.stdout.split()
    return int(connect_code) if connect else int(http_code)


def _measure(lab: Lab, config: str, proxy: str) -> None:
    right = f"crawlers:{PASSWORDS['crawlers']}"
    target = lab.targets.url("/generate_204")
    before = len(lab.targets.requests())
    measured = {
        "no credentials": _curl(lab, proxy, target),
        "wrong password": _curl(lab, proxy, target, "crawlers:not-the-password"),
        "right password": _curl(lab, proxy, target, right,
                                headers=("X-Forwarded-For: 198.51.100.7", "Via: 1.1 client-side")),
        "source outside allowlist": _curl(lab, proxy, target, right, source=lab.outsider),
        "to 127.0.0.1": _curl(lab, proxy, f"http://127.0.0.1:{lab.targets.http_port}/generate_204", right),
        "to 169.254.169.254": _curl(lab, proxy, "http://169.254.169.254/computeMetadata/v1/", right),
        "CONNECT :8443": _curl(lab, proxy, f"http://{lab.targets.connect_target}/", right, connect=True),
        "cache manager": _curl(lab, proxy, f"http://{proxy}/squid-internal-mgr/info", right),
    }
    MATRIX[config] = measured
    assert measured == EXPECTED
    # The second user's SHA-512-crypt hash works as well as the first one's bcrypt.
    assert _curl(lab, proxy, target, f"legacy:{PASSWORDS['legacy']}") == 204
    reached = lab.targets.requests()[before:]
    assert len(reached) == 2, reached  # the two 204s; nothing denied ever reached the target
    for request in reached:
        names = {name.lower() for name, _ in request["headers"]}
        assert "x-forwarded-for" not in names and "via" not in names, request["headers"]


def _run_install_script(tmp_path: Path, access: Access, squid_running: bool) -> tuple[Path, Path, str]:
    """Run the generated script as root in a private mount namespace whose /etc/squid is a
    fresh tmpfs (the host's squid configuration is never touched); copy out what it wrote.
    ``systemctl`` is a stub that logs its calls and says whether squid is active."""
    out = tmp_path / "written"
    out.mkdir()
    stubs = tmp_path / "bin"
    stubs.mkdir()
    calls = tmp_path / "systemctl.calls"
    (stubs / "systemctl").write_text(
        f"#!/bin/sh\necho \"$*\" >> {calls}\n"
        f"case \"$1\" in is-active) exit {0 if squid_running else 3};; esac\nexit 0\n")
    (stubs / "systemctl").chmod(0o755)
    script = tmp_path / "access.sh"
    script.write_bytes(install_script(access))
    inner = (f"mount -t tmpfs tmpfs /etc/squid && PATH={stubs}:/usr/sbin:/usr/bin:/sbin:/bin sh {script}"
             f" && cp -p /etc/squid/egress-proxies.* {DROPIN_PATH} {out}/"
             f" && stat -c '%a %U:%G %n' /etc/squid/egress-proxies.* {DROPIN_PATH}")
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", inner],
                            capture_output=True, text=True, timeout=60, check=False)
    log = result.stdout
    if access.users:
        assert result.returncode == 0, log + result.stderr
        assert f"640 root:{SQUID_USER} {PASSWORD_FILE}" in log
    else:  # an open policy has no password file: the glob matches nothing and cp fails
        assert f"wrote {PASSWORD_FILE}" not in log and "egress-proxies.passwd" not in log, log
    assert f"egress-proxies access: wrote {DROPIN_PATH}" in log, log + result.stderr
    systemctl = calls.read_text().splitlines() if calls.exists() else []
    assert systemctl == (["is-active --quiet squid", "try-reload-or-restart squid"] if squid_running
                         else ["is-active --quiet squid"])
    assert ("egress-proxies access: squid reloaded" in log) is squid_running
    return out / Path(PASSWORD_FILE).name, out / Path(DROPIN_PATH).name, log


def test_drop_in_on_stock_debian_squid_conf(lab: Lab, tmp_path: Path) -> None:
    access = _access(lab.ns)
    password_file, dropin, _ = _run_install_script(tmp_path, access, squid_running=False)
    # Debian 12: the include comes after the stock port and manager denies and before the
    # stock "http_access allow localhost" / "deny all" (the precedence docs/architecture.md states).
    stock = STOCK_SQUID_CONF.read_text()
    directives = [line for line in stock.splitlines() if line and not line.startswith("#")]
    include_at = directives.index(STOCK_INCLUDE)
    assert directives[include_at - 2:include_at + 3] == [
        "http_access allow localhost manager", "http_access deny manager", STOCK_INCLUDE,
        "http_access allow localhost", "http_access deny all"]
    conf_d = lab.ns.root / "conf.d"
    conf_d.mkdir()
    password_file = password_file.rename(lab.ns.root / "egress-proxies.passwd")
    os.chown(password_file, 0, _gid(SQUID_USER))
    (conf_d / dropin.name).write_text(dropin.read_text().replace(PASSWORD_FILE, str(password_file)))
    (conf_d / "debian.conf").write_text(STOCK_DEBIAN_CONF.read_text())
    # A user's own drop-in that would open the proxy sorts after ours and is never reached.
    (conf_d / "zz-crawlers.conf").write_text("acl crawlers src 10.0.0.0/8\nhttp_access allow crawlers\n")
    config = stock.replace(STOCK_INCLUDE, f"include {conf_d}/*.conf")
    with Squid(lab.ns, config, port=3128, name="debian") as squid:
        _measure(lab, "drop-in", f"{squid.address}:3128")


def test_generated_kubernetes_squid_conf(lab: Lab) -> None:
    access = _access(lab.ns)
    request = InstanceRequest(name="eu-1", user_data=b"", tags={"crawl.example.com/owner": "test"}, port=3129,
                              access=access)
    pod = build_pod(KubernetesSettings(namespace="egress", image="squid"), request, "egress")
    annotations = pod["metadata"]["annotations"]
    password_file = lab.ns.root / "k8s.passwd"
    password_file.write_text(annotations[PASSWD_ANNOTATION])
    password_file.chmod(0o444)  # the projected file's mode (pods.PASSWD_MODE)
    config = annotations[SQUID_CONF_ANNOTATION].replace(f"{CONF_DIR}/{PASSWD_FILE}", str(password_file))
    with Squid(lab.ns, config, port=3129, name="k8s") as squid:
        _measure(lab, "kubernetes", f"{squid.address}:3129")


def test_open_policy_script_writes_no_password_file_and_reloads_a_running_squid(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("the script test needs root (a private mount namespace)")
    access = parse_access({"open": True, "allowed_sources": ["10.0.0.0/8"]})
    assert access is not None
    script = install_script(access).decode()
    assert "http_access allow egress_sources\n" in script and "auth_param" not in script
    _run_install_script(tmp_path, access, squid_running=True)


def _gid(group: str) -> int:
    import grp

    return grp.getgrnam(group).gr_gid
