"""squid_install.py without squid: the KVM/GCP install script and the Kubernetes container command,
as text and run by sh in a temporary directory; how the boothook joins KVM vendor-data.

The script run as root against real squid (files, modes, systemd calls, the gate) is
tests/integration/test_squid_access.py's.
"""

from __future__ import annotations

import email
import subprocess
from pathlib import Path
from typing import Any

from ansible_collections.crawl.egress_proxies.plugins.module_utils.cloudinit import build_vendor_data
from ansible_collections.crawl.egress_proxies.plugins.module_utils.guest_agent_script import GUEST_AGENT_SCRIPT
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import (
    DIR_LISTING_PAGE,
    DIR_LISTING_TEMPLATE,
    ERROR_PAGE,
    ERROR_TEMPLATES,
    Access,
    parse_access,
    render_password_file,
    render_policy,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_install import (
    CONFIG_PATH,
    DISTRIBUTION_CONFIG,
    GATE_CLOSED,
    GATE_OPEN,
    GATE_PATH,
    INSTANCE_PATHS,
    PASSWORD_FILE,
    UNIT,
    UNIT_DROPIN,
    boothook,
    container_command,
    error_pages_shell,
    install_script,
    instance_config,
)

BCRYPT = "$2b$12$" + "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0"
USERS = [{"name": "crawlers", "password_hash": BCRYPT}]


def access_of(**value: Any) -> Access:
    access = parse_access(value)
    assert access is not None
    return access


def heredoc_body(text: str, command: str) -> str:
    return text.split(f"{command} <<'EGRESS_PROXIES_EOF'\n", 1)[1].split("EGRESS_PROXIES_EOF\n", 1)[0]


class TestInstanceConfig:
    def test_the_gate_then_the_head_then_debians_squid_conf_then_the_tail(self) -> None:
        access = access_of(users=USERS, allowed_sources=["10.0.0.0/8"])
        policy = render_policy(access, INSTANCE_PATHS)
        assert instance_config(access) == (
            f"include {GATE_PATH}\n" + policy.head + f"include {DISTRIBUTION_CONFIG}\n" + policy.tail)

    def test_the_unit_starts_squid_with_it(self) -> None:
        assert f"ExecStartPre=\nExecStartPre=/usr/sbin/squid --foreground -z -f {CONFIG_PATH}\n" in UNIT
        assert f"ExecStart=\nExecStart=/usr/sbin/squid --foreground -sYC -f {CONFIG_PATH}\n" in UNIT


class TestScript:
    def test_posix_sh_carrying_every_file_verbatim(self) -> None:
        access = access_of(users=USERS, allowed_sources=["10.0.0.0/8"])
        script = install_script(access)
        assert script.startswith(b"#!/bin/sh\n")
        subprocess.run(["sh", "-n"], input=script, check=True)
        text = script.decode()
        assert heredoc_body(text, f"write {PASSWORD_FILE} 0640") == render_password_file(access)
        assert heredoc_body(text, f"write {CONFIG_PATH} 0644") == instance_config(access)
        assert heredoc_body(text, f"write {UNIT_DROPIN} 0644") == UNIT

    def test_boothook_is_the_gated_script_behind_the_boothook_line(self) -> None:
        access = access_of(users=USERS)
        assert boothook(access) == b"#cloud-boothook\n" + install_script(access, boot_gate=True)

    def test_the_boot_gate_is_closed_until_a_unit_after_cloud_final_opens_it(self) -> None:
        text = install_script(access_of(users=USERS), boot_gate=True).decode()
        assert heredoc_body(text, f"    write {GATE_PATH} 0644") == GATE_CLOSED
        assert "systemd-run --no-block" in text and "--property=After=cloud-final.service" in text
        # The gate is written before the configuration that includes it.
        assert text.index(f"write {GATE_PATH}") < text.index(f"write {CONFIG_PATH}")
        # GCP: open from the start (nothing would open it).
        assert heredoc_body(install_script(access_of(users=USERS)).decode(), f"write {GATE_PATH} 0644") == GATE_OPEN

    def test_open_policy_writes_no_password_file(self) -> None:
        assert PASSWORD_FILE not in install_script(access_of(open=True, allowed_sources=["10.0.0.0/8"])).decode()


def test_the_error_pages_shell_writes_every_template(tmp_path: Path) -> None:
    directory = tmp_path / "errors"
    subprocess.run(["sh", "-c", "\n".join(error_pages_shell(str(directory)))], check=True)
    assert sorted(p.name for p in directory.iterdir()) == sorted((*ERROR_TEMPLATES, DIR_LISTING_TEMPLATE))
    assert {(directory / name).read_text() for name in ERROR_TEMPLATES} == {ERROR_PAGE}
    assert (directory / DIR_LISTING_TEMPLATE).read_text() == DIR_LISTING_PAGE


def test_the_container_command_writes_what_squid_reads_then_execs_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    command = container_command(str(run), ["POD_IPS", "NODE_IP"], ["echo", "squid", "started"])
    assert command[:2] == ["/bin/sh", "-c"] and command[3:] == ["egress-proxy", "echo", "squid", "started"]
    result = subprocess.run(command, capture_output=True, text=True, check=True,
                            env={"PATH": "/usr/bin:/bin", "POD_IPS": "10.1.2.3,fd00::3", "NODE_IP": "192.0.2.9"})
    assert result.stdout == "squid started\n"
    assert (run / "own-addresses").read_text() == "10.1.2.3\nfd00::3\n192.0.2.9\n"
    assert (run / "errors" / "ERR_ACCESS_DENIED").read_text() == ERROR_PAGE
    # Without the downward API's values: no own addresses, squid still starts.
    subprocess.run(command, capture_output=True, check=True, env={"PATH": "/usr/bin:/bin"})
    assert (run / "own-addresses").read_text() == ""


class TestVendorData:
    """How the boothook joins KVM vendor-data; the user's document is not involved at all."""

    def access(self) -> bytes:
        return boothook(access_of(users=USERS))

    def parts(self, vendor_data: bytes | None) -> list[tuple[str, str | None, Any]]:
        assert vendor_data is not None and vendor_data.startswith(b"MIME-Version: 1.0\n")
        return [(part.get_content_type(), part.get_filename(), part.get_payload(decode=True))
                for part in email.message_from_bytes(vendor_data).walk() if not part.is_multipart()]

    def test_without_access_nothing_changes(self) -> None:
        assert build_vendor_data(None, True, None) == GUEST_AGENT_SCRIPT
        assert build_vendor_data(None, False, None) is None

    def test_access_alone_is_the_boothook(self) -> None:
        assert build_vendor_data(None, False, self.access()) == self.access()

    def test_agent_and_access(self) -> None:
        assert self.parts(build_vendor_data("", True, self.access())) == [
            ("text/x-shellscript", "install-qemu-guest-agent.sh", GUEST_AGENT_SCRIPT),
            ("text/cloud-boothook", "egress-proxies-access.sh", self.access())]

    def test_operator_agent_and_access(self) -> None:
        operator = "#cloud-config\nruncmd: [[touch, /run/x]]\n"
        assert self.parts(build_vendor_data(operator, True, self.access())) == [
            ("text/cloud-config", None, operator.encode()),
            ("text/x-shellscript", "install-qemu-guest-agent.sh", GUEST_AGENT_SCRIPT),
            ("text/cloud-boothook", "egress-proxies-access.sh", self.access())]
