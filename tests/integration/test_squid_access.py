"""The operator's access policy (squid_access.py, squid_install.py) through real squid.

Debian 12's squid 5.7, one per delivered policy, each in the same network namespace of the test's
own (tests/support/netns/squid.py), as an instance would run it:

- **kvm**: Debian's stock /etc/squid/squid.conf and the files the KVM boothook *itself* wrote when
  run (inside the proxy's namespace, so it found that namespace's addresses as its own, in a
  private mount namespace over tmpfs /etc/squid and /etc/systemd/system, so the host's are never
  touched), with its boot gate closed first and then opened;
- **gcp**: the same for GCP's startup-script (no gate);
- **kubernetes**: the squid.conf and password file of the Pod pods.build_pod makes, run through the
  Pod's own container command (which writes the error pages and the own addresses it is given).

Every one of them has a hostile user configuration beside the policy (HOSTILE: a conf.d drop-in on
KVM and GCP, the provider's squidConfig on Kubernetes) that redefines our ACLs, swaps the
authenticator for basic_fake_auth, trusts X-Forwarded-For, opens the cache manager and asks for
squid's own error pages, version and hostname: the measured behaviour is the policy's regardless.

Behind the proxy's namespace, a second one plays the Internet (linked by a veth pair of its own:
nothing in either routes anywhere else): a public-looking origin (198.51.100.80, TEST-NET-2) with
HTTP on 80, a TCP echo on 443 (the CONNECT target) and FTP on 21, and the same on 10.99.0.5, an
internal network the policy opens on purpose. dnsmasq in the proxy's namespace answers the test's
names and logs every query (squid's dns_nameservers points at it).

The matrix (issue 26): destinations (each internal range, the own addresses, every metadata and
loopback spelling, public) x methods (GET, CONNECT :443, ftp://) x credentials (right, wrong,
made-up, none) x source (the allowed one, a foreign one that also claims the allowed address in
X-Forwarded-For), each with its expected code; printed as measured at the end of the module.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.instance import InstanceRequest
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.pods import (
    CONF_DIR,
    CONF_FILE,
    PASSWD_ANNOTATION,
    PASSWD_FILE,
    RUN_DIR,
    SQUID_CONF_ANNOTATION,
    build_pod,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.k8s.settings import KubernetesSettings
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import (
    DIR_LISTING_TEMPLATE,
    ERROR_PAGE,
    ERROR_TEMPLATES,
    OWN_ERROR_HEADER,
    Access,
    parse_access,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_install import (
    CONFIG_PATH,
    GATE_UNIT,
    PASSWORD_FILE,
    REFRESH_PATH,
    install_script,
)
from support.figures import show
from support.netns.namespace import NetworkNamespace
from support.netns.squid import SQUID_USER, Squid
from support.netns.targets import DnsServer, TargetServer
from support.waiting import wait_for

STOCK = Path("/etc/squid")
STOCK_INCLUDE = "include /etc/squid/conf.d/*.conf"
TEMPLATES = Path("/usr/share/squid/errors/templates")
# Test-only passwords (random enough to be realistic, never used anywhere else).
PASSWORDS = {"crawlers": "kP3v9wQ0s7R2mX8tL4cB1nY6", "legacy": "Hq5Zt8Wv2Lr0Jx7Nc4Bm9Ks1"}
MADE_UP = f"u{secrets.token_hex(4)}:{secrets.token_urlsafe(12)}"
PUBLIC = "198.51.100.80"  # TEST-NET-2: exists only in the test's "Internet" namespace
OPENED = "10.99.0.5"  # internal, in the opened 10.99.0.0/16
LINK_HERE, LINK_THERE = "198.51.100.1", "198.51.100.2"  # the proxy's end of the link is an own address
NAMES = {"public.test": [PUBLIC], "internal.test": ["10.1.2.3"], "mixed.test": [PUBLIC, "10.1.2.3"],
         "metadata.google.internal": ["169.254.169.254"]}
PORTS = {"kvm": 3128, "gcp": 3130, "kubernetes": 3129, "kvm-on-a-hypervisor": 3131}
# The hypervisor a KVM guest runs on (issue 38 row 1): its public address and a source address,
# each with a service of the host's on every address (an exporter on 0.0.0.0:9100), out in the
# test's "Internet" namespace, public-looking like PUBLIC.
HYPERVISOR_ADDRESSES = ("198.51.100.10", "198.51.100.21")
HOST_SERVICE_PORT = 9100
# What a user's own squid configuration might say, meaning well or not. Every line tries to widen
# the policy (squid appends to an ACL of the same name; the last auth_param program wins; the
# first matching http_access, cachemgr_passwd or follow_x_forwarded_for line wins) or to make the
# proxy name itself; none may change what the matrix measures.
HOSTILE = """\
acl egress_foreign src 203.0.113.0/24
acl egress_sources src all
acl egress_users proxy_auth REQUIRED
acl egress_internal dst 203.0.113.0/24
acl localnet src 10.0.0.0/8
auth_param basic program /usr/lib/squid/basic_fake_auth
auth_param basic realm crawlers-team-a
follow_x_forwarded_for allow all
cachemgr_passwd none all
http_access allow localhost manager
http_access allow localnet
http_access allow localhost
visible_hostname crawlers-eu-1-3f9c2a.team-a.internal
httpd_suppress_version_string off
error_directory /usr/share/squid/errors/English
via on
forwarded_for on
ftp_user Squid@
ftp_sanitycheck off
debug_options ALL,2
url_rewrite_extras "%>a/%>A %un %>rm myip=%la myport=%lp"
"""

METHODS = ("GET", "CONNECT", "FTP")
CREDENTIALS = ("right", "wrong", "made-up", "none")
SOURCES = ("allowed", "foreign")
SERVED = {"GET": 204, "CONNECT": 200, "FTP": 200}


@dataclass(frozen=True)
class Destination:
    row: str
    host: str  # as written in a URL (an IPv6 literal in brackets)
    served: bool = False


def destinations(proxy_address: str) -> list[Destination]:
    own = [Destination("own address (in an opened network)", proxy_address),
           Destination("own address (public-looking)", LINK_HERE)]
    internal = [Destination(f"{cidr} ({host})", host) for cidr, host in (
        ("10/8", "10.0.0.1"), ("172.16/12", "172.16.0.1"), ("192.168/16", "192.168.0.1"),
        ("100.64/10", "100.64.0.1"), ("169.254/16", "169.254.1.1"), ("fc00::/7", "[fd00::1]"),
        ("fe80::/10", "[fe80::1]"), ("IPv4-mapped", "[::ffff:10.0.0.1]"), ("NAT64", "[64:ff9b::a00:1]"),
        ("name", "internal.test"), ("name, public+private", "mixed.test"))]
    loopback = [Destination(f"loopback {host}", host) for host in (
        "127.0.0.1", "127.1", "2130706433", "[::1]", "[::ffff:127.0.0.1]", "localhost", "0.0.0.0", "[::]")]
    metadata = [Destination(f"metadata {host}", host) for host in (
        "169.254.169.254", "2852039166", "0xa9fea9fe", "0251.0376.0251.0376", "169.254.43518",
        "[::ffff:169.254.169.254]", "[::ffff:a9fe:a9fe]", "[64:ff9b::a9fe:a9fe]", "metadata.google.internal",
        "[fd20:ce::254]", "[fd00:ec2::254]", "169.254.170.2", "100.100.100.200", "168.63.129.16",
        "[fe80::a9fe:a9fe]")]
    public = [Destination("public address", PUBLIC, True), Destination("public name", "public.test", True),
              Destination("opened internal network", OPENED, True)]
    return public + own + internal + loopback + metadata


@dataclass
class Lab:
    ns: NetworkNamespace  # the proxies'
    internet: NetworkNamespace
    public: TargetServer
    opened: TargetServer
    dns: DnsServer
    access: Access
    foreign: str  # a client address on the root namespace's side, outside allowed_sources
    measured: dict[str, dict[str, Counter[str]]] = field(default_factory=dict)
    seconds: dict[str, tuple[int, float]] = field(default_factory=dict)
    squids: list[Squid] = field(default_factory=list)

    def start(self, squid: Squid) -> None:
        """Start ``squid``; the lab stops it, all of them at once (each takes 2 s to stop)."""
        self.squids.append(squid)
        squid.start()


@dataclass
class Proxy:
    policy: str
    squid: Squid
    port: int
    root: Path  # where its files are (the test's copy of the instance's)

    @property
    def address(self) -> str:
        return self.squid.address


def _sha512_crypt(password: str) -> str:
    return subprocess.run(["openssl", "passwd", "-6", "-stdin"], input=password + "\n", capture_output=True,
                          text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.fail("real squid in a network namespace needs root; run the tests as root, as CI does")
    with NetworkNamespace() as ns, NetworkNamespace() as internet:
        ns.link(internet, LINK_HERE, LINK_THERE)
        ns.route("10.99.0.0/16", LINK_THERE)
        access = parse_access({
            "users": [
                # Cost 4: thousands of wrong passwords are checked; the format is what matters.
                {"name": "crawlers", "password_hash": bcrypt.hashpw(PASSWORDS["crawlers"].encode(),
                                                                    bcrypt.gensalt(rounds=4)).decode()},
                {"name": "legacy", "password_hash": _sha512_crypt(PASSWORDS["legacy"])},
            ],
            # The test process reaches the namespace from the veth's root end, and only from there.
            "allowed_sources": [f"{ns.gateway}/32"],
            # The squid's own /24 (its own address stays refused) and a network holding a metadata address.
            "allowed_destinations": ["10.99.0.0/16", ns.network, "100.100.0.0/16"],
        })
        assert access is not None
        with TargetServer(internet, address=PUBLIC, http_port=80, connect_port=443, ftp_port=21) as public, \
                TargetServer(internet, address=OPENED, http_port=80, connect_port=443, ftp_port=21) as opened, \
                DnsServer(ns, NAMES) as dns:
            lab = Lab(ns, internet, public, opened, dns, access, ns.add_outside_address())
            try:
                yield lab
            finally:
                for squid in lab.squids:
                    squid.terminate()
                for squid in lab.squids:
                    squid.stop()
    if lab.measured:
        show(request.config, "measured (issue 26): served/refused per destination, of 24 requests each "
                             "(3 methods x 4 credentials x 2 sources)", _matrix_lines(lab))


def _matrix_lines(lab: Lab) -> list[str]:
    policies = list(lab.measured)
    rows = list(next(iter(lab.measured.values())))
    width = max(len(row) for row in rows)
    lines = [" " * width + "".join(f"{policy:>12}" for policy in policies) + "    expected"]
    for row in rows:
        expected = "3/21" if any(d.row == row and d.served for d in destinations(lab.ns.address)) else "0/24"
        cells = "".join(f"{lab.measured[p][row]['served']:>8}/{lab.measured[p][row]['refused']:<3}" for p in policies)
        lines.append(f"{row:<{width}}{cells}    {expected}")
    lines.append("requests, seconds: " + ", ".join(f"{p} {n} in {s:.1f}s" for p, (n, s) in lab.seconds.items()))
    return lines


# -- the three delivered policies, one squid each ---------------------------------------------------

@dataclass
class Installed:
    root: Path  # <root>/etc/squid holds what the script wrote, with Debian's squid.conf beside it
    stubs: Path  # the systemctl and systemd-run it ran
    log: str
    systemctl: list[str]
    systemd_run: list[str]


def run_install_script(ns: NetworkNamespace, name: str, access: Access, *, boot_gate: bool,
                       squid_running: bool = False, refused_host_addresses: tuple[str, ...] = ()) -> Installed:
    """Run the generated script as root inside ``ns`` (so ``ip`` lists that namespace's addresses)
    in a private mount namespace whose /etc/squid and /etc/systemd/system are fresh tmpfs (the
    host's are never touched), and copy out what it wrote to ``<ns.root>/<name>`` (readable by
    squid's user). ``systemctl`` and ``systemd-run`` are stubs that log their calls; the first says
    whether squid is active."""
    tmp = ns.root / f"{name}-script"
    stubs, root = tmp / "bin", ns.root / name
    stubs.mkdir(parents=True)
    (root / "etc").mkdir(parents=True)
    calls = {name: tmp / f"{name}.calls" for name in ("systemctl", "systemd-run")}
    (stubs / "systemctl").write_text(f"#!/bin/sh\necho \"$*\" >> {calls['systemctl']}\n"
                                     f"case \"$1\" in is-active) exit {0 if squid_running else 3};; esac\n")
    (stubs / "systemd-run").write_text(f"#!/bin/sh\necho \"$*\" >> {calls['systemd-run']}\n")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    script = tmp / "access.sh"
    script.write_bytes(install_script(access, boot_gate=boot_gate, refused_host_addresses=refused_host_addresses))
    inner = (f"mount -t tmpfs tmpfs /etc/squid && mount -t tmpfs tmpfs /etc/systemd/system"
             f" && PATH={stubs}:/usr/sbin:/usr/bin:/sbin:/bin sh {script}"
             f" && cp -a /etc/squid {root}/etc/"
             f" && mkdir {root}/etc/systemd && cp -a /etc/systemd/system {root}/etc/systemd/")
    result = subprocess.run(ns.command(["unshare", "--mount", "--propagation", "private", "sh", "-c", inner]),
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return Installed(root, stubs, result.stdout,
                     *(p.read_text().splitlines() if p.exists() else [] for p in calls.values()))


def _instance_proxy(lab: Lab, installed: Installed, policy: str) -> Proxy:
    """Debian's stock squid.conf (its http_port aside) and conf.d next to what the script wrote,
    every path moved under the copy; squid started as the drop-in unit starts it (-f)."""
    etc = installed.root / "etc" / "squid"
    stock = (STOCK / "squid.conf").read_text()
    assert "\nhttp_port 3128\n" in stock and STOCK_INCLUDE in stock
    (etc / "squid.conf").write_text(stock.replace("\nhttp_port 3128\n", "\n"))
    (etc / "conf.d").mkdir()
    shutil.copy(STOCK / "conf.d" / "debian.conf", etc / "conf.d")
    (etc / "conf.d" / "zz-user.conf").write_text(HOSTILE)
    for path in (etc / "squid.conf", etc / "egress-proxies" / "squid.conf", etc / "egress-proxies" / "refresh"):
        path.write_text(path.read_text().replace("/etc/squid/", f"{etc}/"))
    config = (etc / "egress-proxies" / "squid.conf").read_text()
    port = PORTS[policy]
    squid = Squid(lab.ns, f"http_port {port}\n" + config, port=port, name=policy,
                  extra=f"dns_nameservers {lab.dns.address}\n")
    return Proxy(policy, squid, port, installed.root)


@pytest.fixture(scope="module")
def kvm(lab: Lab) -> tuple[Proxy, Installed]:
    installed = run_install_script(lab.ns, "kvm", lab.access, boot_gate=True)
    proxy = _instance_proxy(lab, installed, "kvm")
    lab.start(proxy.squid)
    _open_the_boot_gate(lab, proxy, installed.stubs)
    return proxy, installed


def _open_the_boot_gate(lab: Lab, proxy: Proxy, stubs: Path) -> None:
    """The boothook leaves squid refusing everything; the unit it queued (run here by hand, as
    systemd would after cloud-final) opens it and reloads squid, which then serves."""
    assert _ask(lab, proxy, "GET", PUBLIC, "right", "allowed") == 403
    refresh = proxy.root / "etc" / "squid" / "egress-proxies" / "refresh"
    subprocess.run(lab.ns.command(["env", f"PATH={stubs}:/usr/sbin:/usr/bin:/sbin:/bin", "sh", str(refresh),
                                   "open"]), check=True, timeout=30)
    proxy.squid.reconfigure()
    def serves() -> bool:
        try:
            return _ask(lab, proxy, "GET", PUBLIC, "right", "allowed") == 204
        except OSError:
            return False  # squid closes and opens its port again, and drops connections, while it reconfigures
    wait_for(serves, 20, "the boot gate to open", 0.1)


@pytest.fixture(scope="module")
def hypervisor_services(lab: Lab) -> Iterator[list[TargetServer]]:
    with TargetServer(lab.internet, address=HYPERVISOR_ADDRESSES[0], http_port=HOST_SERVICE_PORT,
                      connect_port=HOST_SERVICE_PORT + 1) as public, \
            TargetServer(lab.internet, address=HYPERVISOR_ADDRESSES[1], http_port=HOST_SERVICE_PORT,
                         connect_port=HOST_SERVICE_PORT + 1) as source:
        yield [public, source]


@pytest.fixture(scope="module")
def kvm_on_a_hypervisor(lab: Lab) -> Proxy:
    """The KVM boothook as the provider delivers it on a host with a public address and source
    addresses: the hypervisor's addresses refused (kvm/networking.py, ``host_addresses``)."""
    installed = run_install_script(lab.ns, "kvm-on-a-hypervisor", lab.access, boot_gate=True,
                                   refused_host_addresses=HYPERVISOR_ADDRESSES)
    proxy = _instance_proxy(lab, installed, "kvm-on-a-hypervisor")
    lab.start(proxy.squid)
    _open_the_boot_gate(lab, proxy, installed.stubs)
    return proxy


@pytest.fixture(scope="module")
def gcp(lab: Lab) -> tuple[Proxy, Installed]:
    installed = run_install_script(lab.ns, "gcp", lab.access, boot_gate=False)
    proxy = _instance_proxy(lab, installed, "gcp")
    lab.start(proxy.squid)
    return proxy, installed


@pytest.fixture(scope="module")
def kubernetes(lab: Lab) -> tuple[Proxy, dict[str, object]]:
    """The Pod's files where the test puts them (the projected volume's and the emptyDir's paths
    moved), squid run through the Pod's own command with the downward API's values in its env."""
    port = PORTS["kubernetes"]
    request = InstanceRequest(name="eu-1", user_data=b"", tags={"crawl.example.com/owner": "test"}, port=port,
                              access=lab.access)
    pod = build_pod(KubernetesSettings(namespace="egress", image="squid", squid_config=HOSTILE), request, "egress")
    root = lab.ns.root / "kubernetes-pod"
    projected, run = root / "etc", root / "run"
    projected.mkdir(parents=True)

    def moved(text: str) -> str:
        return text.replace(CONF_DIR, str(projected)).replace(RUN_DIR, str(run))

    annotations = pod["metadata"]["annotations"]
    (projected / PASSWD_FILE).write_text(annotations[PASSWD_ANNOTATION])
    (projected / PASSWD_FILE).chmod(0o444)  # the projected file's mode (pods.PASSWD_MODE)
    container = pod["spec"]["containers"][0]
    command = [moved(part) for part in container["command"]]
    assert command[4:] == ["squid", "-N", "-f", moved(f"{CONF_DIR}/{CONF_FILE}")]
    env = {"POD_IPS": lab.ns.address, "NODE_IP": LINK_HERE}
    assert [e["name"] for e in container["env"]] == list(env)
    squid = Squid(lab.ns, moved(annotations[SQUID_CONF_ANNOTATION]), port=port, name="kubernetes",
                  extra=f"dns_nameservers {lab.dns.address}\n", launcher=command[:4], env=env)
    lab.start(squid)
    return Proxy("kubernetes", squid, port, root), pod


POLICIES = ("kvm", "gcp", "kubernetes")


def proxy_of(request: pytest.FixtureRequest, policy: str) -> Proxy:
    proxy: Proxy = request.getfixturevalue(policy)[0]
    return proxy


# -- requests -----------------------------------------------------------------------------------

def _credential(kind: str) -> str:
    # "wrong" is another user's: squid 5.7 keeps one cache entry per user name, whose state a
    # helper answer sets whichever password it checked, so a wrong password sent while the same
    # user's right one is being checked can pass (see test_the_same_user_with_two_passwords).
    user_password = {"right": f"crawlers:{PASSWORDS['crawlers']}", "wrong": "legacy:not-the-password",
                     "made-up": MADE_UP, "legacy": f"legacy:{PASSWORDS['legacy']}",
                     "crawlers-wrong": "crawlers:not-the-password"}.get(kind)
    if user_password is None:
        return ""
    return f"Proxy-Authorization: Basic {base64.b64encode(user_password.encode()).decode()}\r\n"


def _request(method: str, host: str, headers: str) -> bytes:
    if method == "CONNECT":
        return f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n{headers}\r\n".encode()
    url = f"ftp://{host}/file.txt" if method == "FTP" else f"http://{host}/generate_204"
    return f"GET {url} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n".encode()


def _exchange(lab: Lab, proxy: Proxy, raw: bytes, source: str = "allowed") -> tuple[int, bytes]:
    """Send ``raw`` from the allowed source (the gateway) or a foreign one; the status and what
    followed (headers and body, up to 64 KiB; a CONNECT's tunnel is not read)."""
    address = lab.ns.gateway if source == "allowed" else lab.foreign
    with socket.create_connection((proxy.address, proxy.port), timeout=15, source_address=(address, 0)) as conn:
        conn.sendall(raw)
        received = b""
        while not (raw.startswith(b"CONNECT") and b"\r\n\r\n" in received) and len(received) < 65536:
            chunk = conn.recv(65536)
            if not chunk:
                break
            received += chunk
    status_line, _, rest = received.partition(b"\r\n")
    if not status_line.startswith(b"HTTP/"):
        raise ConnectionError(f"no HTTP answer from {proxy.address}:{proxy.port}: {received[:80]!r}")
    return int(status_line.split()[1]), rest


def _ask(lab: Lab, proxy: Proxy, method: str, host: str, credential: str, source: str, extra: str = "") -> int:
    # A foreign client also claims, in X-Forwarded-For, to be the allowed one.
    forwarded = f"X-Forwarded-For: {lab.ns.gateway}\r\n" if source == "foreign" else ""
    return _exchange(lab, proxy, _request(method, host, _credential(credential) + forwarded + extra), source)[0]


def expected_code(destination: Destination, method: str, credential: str, source: str) -> int:
    if source == "foreign":
        return 403  # before any credential is asked for
    if credential != "right":
        return 407  # before any destination is looked at
    return SERVED[method] if destination.served else 403


# -- the matrix ----------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", POLICIES)
def test_the_matrix(lab: Lab, request: pytest.FixtureRequest, policy: str) -> None:
    proxy = proxy_of(request, policy)
    cases = [(d, m, c, s) for d in destinations(lab.ns.address) for m in METHODS for c in CREDENTIALS for s in SOURCES]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=16) as pool:
        codes = list(pool.map(lambda case: _ask(lab, proxy, case[1], case[0].host, case[2], case[3]), cases))
    lab.seconds[policy] = (len(cases), time.monotonic() - started)
    counts: dict[str, Counter[str]] = {}
    wrong = []
    for (destination, method, credential, source), code in zip(cases, codes, strict=True):
        counts.setdefault(destination.row, Counter())["served" if code in (200, 204) else "refused"] += 1
        if code != expected_code(destination, method, credential, source):
            wrong.append(f"{destination.row} {method} {credential} {source}: {code}, expected "
                         f"{expected_code(destination, method, credential, source)}")
    lab.measured[policy] = counts
    assert not wrong, "\n".join(wrong)
    # The second user's SHA-512-crypt hash works as well as the first one's bcrypt.
    assert _ask(lab, proxy, "GET", PUBLIC, "legacy", "allowed") == 204


# -- what a client, an origin and a log see -------------------------------------------------------

def _headers(rest: bytes) -> tuple[dict[str, str], bytes]:
    head, _, body = rest.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    return {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)
            if name}, body


# Headers squid adds that name it, or the host: never in anything the proxy answers itself.
IDENTIFYING = ("server", "x-squid-error", "x-cache", "x-cache-lookup", "via")


@pytest.mark.parametrize("policy", POLICIES)
def test_nothing_names_the_software_the_host_or_the_team(lab: Lab, request: pytest.FixtureRequest,
                                                         policy: str) -> None:
    proxy = proxy_of(request, policy)
    answers = {
        "stranger": _exchange(lab, proxy, _request("GET", PUBLIC, ""), "foreign"),
        "no credentials": _exchange(lab, proxy, _request("GET", PUBLIC, "")),
        "refused destination": _exchange(lab, proxy, _request("GET", "169.254.169.254", _credential("right"))),
        "CONNECT :8443": _exchange(lab, proxy, f"CONNECT {PUBLIC}:8443 HTTP/1.1\r\nHost: {PUBLIC}:8443\r\n"
                                                f"{_credential('right')}\r\n".encode()),
        "cache manager": _exchange(lab, proxy, _request("GET", f"{proxy.address}:{proxy.port}", _credential(
            "right")).replace(b"/generate_204", b"/squid-internal-mgr/info")),
        "no DNS answer": _exchange(lab, proxy, _request("GET", "unknown.test", _credential("right"))),
    }
    assert {name: status for name, (status, _) in answers.items()} == {
        "stranger": 403, "no credentials": 407, "refused destination": 403, "CONNECT :8443": 403,
        "cache manager": 403, "no DNS answer": 502}
    for name, (_, rest) in answers.items():
        headers, body = _headers(rest)
        assert not set(IDENTIFYING) & set(headers), (name, headers)
        assert body.decode() == ERROR_PAGE, (name, body)  # no name, version, host or reason
    assert _headers(answers["no credentials"][1])[0]["proxy-authenticate"] == 'Basic realm="proxy"'


@pytest.mark.parametrize("policy", POLICIES)
def test_the_origin_sees_only_what_the_client_sent(lab: Lab, request: pytest.FixtureRequest, policy: str) -> None:
    proxy = proxy_of(request, policy)
    before = len(lab.public.requests())
    sent = "X-Forwarded-For: 198.51.100.7\r\nVia: 1.1 client-side\r\nUser-Agent: crawler/1\r\n"
    status, rest = _exchange(lab, proxy, _request("GET", PUBLIC, _credential("right") + sent))
    no_cache = _exchange(lab, proxy, _request("GET", PUBLIC, _credential("right") + "Cache-Control: no-cache\r\n"))
    # A file of its own: the matrix's may be in squid's cache.
    ftp = _exchange(lab, proxy, _request("FTP", PUBLIC, _credential("right")).replace(
        b"/file.txt", f"/{policy}.txt".encode()))
    assert (status, no_cache[0], ftp[0]) == (204, 204, 200)
    assert b"egress-proxies test file\n" in _headers(ftp[1])[1]  # chunked
    reached = lab.public.requests()[before:]
    first, second = (r for r in reached if r["method"] == "GET")
    # The client's own headers but the two that name hops; nothing squid adds: no Via, no
    # X-Forwarded-For, no Cache-Control: max-age=259200 (squid's refresh_pattern maximum).
    assert {name.lower() for name, _ in first["headers"]} == {"host", "user-agent", "connection"}
    assert ["Cache-Control", "no-cache"] in second["headers"]  # the client's own, kept
    # squid's FTP login names nothing ("Squid@" is its default password).
    assert [r["command"] for r in reached if r.get("command", "").startswith(("USER", "PASS"))] == [
        "USER anonymous", "PASS anonymous@"]
    # The origin's own response headers reach the client unchanged, nothing of squid's beside them.
    headers, _ = _headers(rest)
    assert headers["server"].startswith("BaseHTTP/")
    assert not {"x-cache", "x-cache-lookup", "via", "x-squid-error"} & set(headers), headers


@pytest.mark.parametrize("policy", POLICIES)
def test_a_request_refused_for_its_source_or_credentials_costs_no_dns_lookup(
        lab: Lab, request: pytest.FixtureRequest, policy: str) -> None:
    proxy = proxy_of(request, policy)
    refused = {f"{kind}-{policy}.dns.test": (credential, source) for kind, credential, source in (
        ("stranger", "right", "foreign"), ("no-credentials", "none", "allowed"),
        ("wrong", "wrong", "allowed"), ("made-up", "made-up", "allowed"))}
    for name, (credential, source) in refused.items():
        for method in METHODS:
            assert _ask(lab, proxy, method, name, credential, source) == (403 if source == "foreign" else 407)
    bearer = _ask(lab, proxy, "GET", f"bearer-{policy}.dns.test", "none", "allowed",
                  "Proxy-Authorization: Bearer abc\r\n")
    assert bearer == 407
    # The right credentials make squid resolve the name (dnsmasq refuses it: 502).
    assert _ask(lab, proxy, "GET", f"right-{policy}.dns.test", "right", "allowed") == 502
    queries = lab.dns.queries()
    assert f"A right-{policy}.dns.test" in queries
    assert not [q for q in queries if f"-{policy}.dns.test" in q and f"right-{policy}" not in q], queries
    # Nor a reverse lookup of any client (squid's default helper extras ask for one per connection).
    assert not [q for q in queries if q.startswith("PTR")], queries


@pytest.mark.parametrize("policy", POLICIES)
def test_no_credential_of_any_scheme_reaches_a_log(lab: Lab, request: pytest.FixtureRequest, policy: str) -> None:
    proxy = proxy_of(request, policy)
    secret = {scheme: f"SECRET-{scheme}-{secrets.token_hex(8)}" for scheme in (
        "bearer", "negotiate", "digest", "basic", "badchars", "nul", "ntlm")}
    basic = base64.b64encode(f"crawlers:{secret['basic']}".encode()).decode()
    for header in (f"Bearer {secret['bearer']}", f"Negotiate {secret['negotiate']}", f"NTLM {secret['ntlm']}",
                   f'Digest username="crawlers", realm="proxy", response="{secret["digest"]}"',
                   f"Basic {basic}", f"Basic !{secret['badchars']}!"):
        assert _ask(lab, proxy, "GET", PUBLIC, "none", "allowed", f"Proxy-Authorization: {header}\r\n") == 407
    # A NUL byte in the header block: squid logs the whole block when it may (section 55).
    nul = _request("GET", PUBLIC, f"Proxy-Authorization: Bearer {secret['nul']}\r\nX-Odd: a\0b\r\n")
    assert _exchange(lab, proxy, nul)[0] in (400, 407)
    logs = {"cache.log": proxy.squid.cache_log(), "access.log": "\n".join(proxy.squid.access_log()),
            "stdout and stderr": (proxy.squid.directory / "squid.out").read_text(errors="replace")}
    for name, text in logs.items():
        found = [s for s in (*secret.values(), basic) if s in text]
        assert not found, f"{name} holds {found}"


@pytest.mark.parametrize("policy", POLICIES)
def test_the_cache_manager_is_refused_on_the_instance_itself(lab: Lab, request: pytest.FixtureRequest,
                                                            policy: str) -> None:
    """Debian's stock squid.conf allows the manager from localhost, before its conf.d, and the
    hostile configuration sets no password for it: the request comes from the instance itself."""
    proxy = proxy_of(request, policy)
    result = subprocess.run(lab.ns.command([
        "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10",
        f"http://127.0.0.1:{proxy.port}/squid-internal-mgr/info"]), capture_output=True, text=True, check=False)
    assert result.stdout == "403"


@pytest.mark.parametrize("policy", POLICIES)
def test_a_wrong_password_for_the_user_is_refused(lab: Lab, request: pytest.FixtureRequest, policy: str) -> None:
    """One at a time (the matrix's "wrong" is another user's; see _credential)."""
    proxy = proxy_of(request, policy)
    assert _ask(lab, proxy, "GET", PUBLIC, "crawlers-wrong", "allowed") == 407
    assert _ask(lab, proxy, "GET", PUBLIC, "right", "allowed") == 204
    assert _ask(lab, proxy, "GET", PUBLIC, "crawlers-wrong", "allowed") == 407


@pytest.mark.parametrize("policy", POLICIES)
def test_the_proxys_own_errors_are_marked_for_credential_holders_only(lab: Lab, request: pytest.FixtureRequest,
                                                                      policy: str) -> None:
    """Issue 41 row 1: a crawler tells the proxy's own refusal from a site's ban by the marker,
    which names squid's error; strangers, clients without credentials and every origin's own
    answer never carry it (the hostile configuration beside the policy changes none of it)."""
    proxy = proxy_of(request, policy)
    marker = OWN_ERROR_HEADER.lower()

    def marked(raw: bytes, source: str = "allowed") -> tuple[int, str | None]:
        status, rest = _exchange(lab, proxy, raw, source)
        return status, _headers(rest)[0].get(marker)

    right = _credential("right")
    refused_port = f"GET http://{PUBLIC}:25/ HTTP/1.1\r\nHost: {PUBLIC}:25\r\n{right}Connection: close\r\n\r\n"
    assert marked(refused_port.encode()) == (403, "ERR_ACCESS_DENIED")
    assert marked(_request("GET", "169.254.169.254", right)) == (403, "ERR_ACCESS_DENIED")
    status, error = marked(_request("GET", "unknown.test", right))  # squid could not reach a site
    assert status == 502 and error is not None and error.startswith("ERR_") and error != "ERR_ACCESS_DENIED"
    assert marked(refused_port.replace(right, "").encode()) == (407, None)
    assert marked(_request("GET", "169.254.169.254", _credential("made-up"))) == (407, None)
    assert marked(_request("GET", "169.254.169.254", right), "foreign") == (403, None)
    assert marked(_request("GET", PUBLIC, right)) == (204, None)  # the origin's answer


# -- the install script and the Pod ----------------------------------------------------------------

@pytest.mark.parametrize("policy", ["kvm", "gcp"])
def test_the_install_script_writes_the_policy_and_points_squid_at_it(
        lab: Lab, request: pytest.FixtureRequest, policy: str) -> None:
    installed: Installed = request.getfixturevalue(policy)[1]
    written = installed.root / "etc"
    modes = {str(path.relative_to(written)): (oct(path.stat().st_mode & 0o777), path.group())
             for path in written.rglob("*") if path.is_file() and "errors/" not in str(path)}
    assert modes == {
        "squid/egress-proxies/squid.conf": ("0o644", "root"), "squid/egress-proxies/gate.conf": ("0o644", "root"),
        "squid/egress-proxies/passwd": ("0o640", SQUID_USER), "squid/egress-proxies/refresh": ("0o755", "root"),
        "squid/egress-proxies/own-addresses": ("0o644", "root"),
        "systemd/system/squid.service.d/egress-proxies.conf": ("0o644", "root"),
    } | {f"squid/{name}": ("0o644", "root") for name in ("squid.conf", "conf.d/debian.conf", "conf.d/zz-user.conf")}
    unit = (written / "systemd" / "system" / "squid.service.d" / "egress-proxies.conf").read_text()
    assert f"ExecStart=/usr/sbin/squid --foreground -sYC -f {CONFIG_PATH}\n" in unit
    errors = sorted(p.name for p in (written / "squid" / "egress-proxies" / "errors").iterdir())
    assert errors == sorted((*ERROR_TEMPLATES, DIR_LISTING_TEMPLATE))
    # Its own addresses, found in the namespace it ran in (loopback is refused anyway).
    own = (written / "squid" / "egress-proxies" / "own-addresses").read_text().split()
    assert lab.ns.address in own and LINK_HERE in own and "127.0.0.1" not in own
    # A new unit: systemd reloaded; squid not running yet, so nothing restarted.
    assert installed.systemctl == [f"reset-failed {GATE_UNIT}.service", "daemon-reload", "is-active --quiet squid"] \
        if policy == "kvm" else ["daemon-reload", "is-active --quiet squid"]
    gate = (f"--no-block --unit={GATE_UNIT} --property=Type=oneshot --property=After=cloud-final.service "
            f"/bin/sh {REFRESH_PATH} open")
    assert installed.systemd_run == ([gate] if policy == "kvm" else [])
    assert f"egress-proxies access: wrote {PASSWORD_FILE}" in installed.log


def test_an_open_policy_writes_no_password_file_and_restarts_a_running_squid(lab: Lab) -> None:
    access = parse_access({"open": True, "allowed_sources": ["10.0.0.0/8"]})
    assert access is not None
    script = install_script(access).decode()
    assert "http_access allow all\n" in script and "auth_param" not in script
    installed = run_install_script(lab.ns, "open", access, boot_gate=False, squid_running=True)
    assert not (installed.root / "etc" / "squid" / "egress-proxies" / "passwd").exists()
    # The unit changed (a new -f): a running squid is restarted, not reloaded.
    assert installed.systemctl == ["daemon-reload", "is-active --quiet squid", "try-restart squid"]
    assert "egress-proxies access: squid restarted" in installed.log


def test_the_error_templates_are_every_one_squid_ships() -> None:
    shipped = {path.name for path in TEMPLATES.iterdir() if path.name.startswith("ERR_")}
    assert shipped == {*ERROR_TEMPLATES, DIR_LISTING_TEMPLATE}


def test_the_pod_writes_its_own_addresses_and_error_pages(lab: Lab, kubernetes: tuple[Proxy, object]) -> None:
    proxy, _ = kubernetes
    run = proxy.root / "run"
    assert (run / "own-addresses").read_text().split() == [lab.ns.address, LINK_HERE]
    assert sorted(p.name for p in (run / "errors").iterdir()) == sorted((*ERROR_TEMPLATES, DIR_LISTING_TEMPLATE))
    assert (run / "errors" / "ERR_ACCESS_DENIED").read_text() == ERROR_PAGE


def test_the_hypervisors_addresses_are_refused(lab: Lab, kvm: tuple[Proxy, Installed],
                                               kvm_on_a_hypervisor: Proxy,
                                               hypervisor_services: list[TargetServer]) -> None:
    """Issue 38 row 1: a crawler with valid credentials asks a KVM proxy for a service of its
    hypervisor at the host's public and source addresses. The policy as delivered before (the
    guest's own addresses only) served it; with the host's addresses it is refused, in every
    spelling squid would connect to, and nothing reaches the host's service."""
    for server in hypervisor_services:
        target = f"{server.address}:{HOST_SERVICE_PORT}"
        assert _ask(lab, kvm[0], "GET", target, "right", "allowed") == 204  # before: the host's service answered
        served = len(server.requests())
        nat64 = f"[64:ff9b::{ipaddress.IPv6Address(int(ipaddress.IPv4Address(server.address))).exploded[-9:]}]"
        for host in (server.address, f"[::ffff:{server.address}]", nat64):
            assert _ask(lab, kvm_on_a_hypervisor, "GET", f"{host}:{HOST_SERVICE_PORT}", "right", "allowed") == 403
            assert _ask(lab, kvm_on_a_hypervisor, "CONNECT", host, "right", "allowed") == 403, host
        assert len(server.requests()) == served
    # Everything else is as before: a public origin is served.
    assert _ask(lab, kvm_on_a_hypervisor, "GET", PUBLIC, "right", "allowed") == 204
