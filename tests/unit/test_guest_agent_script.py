"""The guest agent bootstrap: one script, its embedded copy, and what it does on a host.

The behaviour tests run the real vendor-data bytes with /bin/sh in a scratch
directory whose PATH holds only stub commands; each stub logs its argv (and
DEBIAN_FRONTEND) and exits as told, so the order of the steps is observable.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.crawl.egress_proxies.plugins.module_utils.cloudinit import build_vendor_data
from ansible_collections.crawl.egress_proxies.plugins.module_utils.guest_agent_script import (
    GUEST_AGENT_SCRIPT,
)

ROOT = Path(__file__).resolve().parents[2]
ROLE_SCRIPT = ROOT / "roles" / "guest_agent" / "files" / "install-qemu-guest-agent.sh"
SYNC_TOOL = ROOT / "tools" / "sync_guest_agent_script.py"
EMBEDDED = ROOT / "plugins" / "module_utils" / "guest_agent_script.py"
PREFIX = "egress-proxies guest-agent: "
INSTALL = ["install", "-y", "--no-install-recommends", "qemu-guest-agent"]


class TestEmbeddedCopy:
    def test_embedded_script_equals_the_role_file(self) -> None:
        assert ROLE_SCRIPT.read_bytes() == GUEST_AGENT_SCRIPT, "run python tools/sync_guest_agent_script.py"

    def test_sync_check_passes_on_the_tree(self) -> None:
        result = subprocess.run([sys.executable, str(SYNC_TOOL), "--check"], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr

    def test_sync_check_fails_on_drift_and_sync_repairs_it(self, tmp_path: Path) -> None:
        for path in (ROLE_SCRIPT, SYNC_TOOL, EMBEDDED):
            copy = tmp_path / path.relative_to(ROOT)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, copy)
        script = tmp_path / ROLE_SCRIPT.relative_to(ROOT)
        script.write_bytes(script.read_bytes() + b"# an edit\n")
        tool = [sys.executable, str(tmp_path / SYNC_TOOL.relative_to(ROOT))]

        drifted = subprocess.run([*tool, "--check"], capture_output=True, text=True)
        assert drifted.returncode == 1
        assert "out of date" in drifted.stderr
        assert subprocess.run(tool, capture_output=True).returncode == 0
        assert subprocess.run([*tool, "--check"], capture_output=True).returncode == 0
        namespace: dict[str, object] = {}
        exec((tmp_path / EMBEDDED.relative_to(ROOT)).read_text(encoding="utf-8"), namespace)
        assert namespace["GUEST_AGENT_SCRIPT"] == script.read_bytes()

    def test_script_is_posix_sh(self) -> None:
        subprocess.run(["sh", "-n", str(ROLE_SCRIPT)], check=True)
        assert GUEST_AGENT_SCRIPT.startswith(b"#!/bin/sh\n")


class Host:
    """A scratch directory with stub commands on an otherwise empty PATH."""

    def __init__(self, root: Path) -> None:
        self.bin = root / "bin"
        self.bin.mkdir()
        self.log = root / "calls.log"
        self.log.touch()
        self.script = root / "vendor-data"
        vendor_data = build_vendor_data(None, True)
        assert vendor_data is not None
        self.script.write_bytes(vendor_data)

    def stub(self, name: str, body: str = "exit 0") -> None:
        """A command that logs ``name args|DEBIAN_FRONTEND`` and then runs ``body``."""
        path = self.bin / name
        path.write_text(f"#!/bin/sh\nprintf '%s\\n' \"{name} $*|${{DEBIAN_FRONTEND-}}\" >> '{self.log}'\n{body}\n")
        path.chmod(0o755)

    def stub_installer(self, name: str) -> None:
        """A package manager whose install creates ``qemu-ga``, as a real install would."""
        agent = self.bin / "qemu-ga"
        self.stub(name, f'case "$*" in *install*) printf "#!/bin/sh\\n" > "{agent}"; /bin/chmod +x "{agent}";; esac')

    def run(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["/bin/sh", str(self.script)],
            env={"PATH": str(self.bin)},
            capture_output=True,
            text=True,
            timeout=30,
        )

    def calls(self) -> list[list[str]]:
        return [line.split("|", 1)[0].split() for line in self.log.read_text().splitlines()]

    def frontends(self, command: str) -> set[str]:
        return {line.split("|", 1)[1] for line in self.log.read_text().splitlines() if line.startswith(command + " ")}


@pytest.fixture
def host(tmp_path: Path) -> Host:
    # The script also looks for the agent at absolute paths; on a machine that has
    # it, every install test would see "already installed".
    present = [
        p
        for p in ("/usr/sbin/qemu-ga", "/usr/bin/qemu-ga", "/usr/local/sbin/qemu-ga", "/usr/local/bin/qemu-ga")
        if os.path.exists(p)
    ]
    if present:
        pytest.fail(f"qemu-ga is installed on this machine ({present[0]}); these tests need a machine without it")
    return Host(tmp_path)


def logged(result: subprocess.CompletedProcess[str]) -> list[str]:
    lines = result.stdout.splitlines()
    assert lines, "the script logged nothing"
    assert all(line.startswith(PREFIX) for line in lines), lines
    return [line[len(PREFIX) :] for line in lines]


class TestScriptBehaviour:
    def test_skips_when_the_agent_is_present(self, host: Host) -> None:
        host.stub("qemu-ga")
        host.stub("apt-get")
        host.stub("systemctl")
        result = host.run()
        assert result.returncode == 0
        assert logged(result) == ["qemu-guest-agent already installed; nothing to do"]
        assert host.calls() == []

    def test_apt_get_updates_installs_then_enables(self, host: Host) -> None:
        host.stub("apt-get")
        host.stub("dnf")  # apt-get wins when both exist
        host.stub("systemctl")
        result = host.run()
        assert result.returncode == 0, result.stdout + result.stderr
        assert host.calls() == [
            ["apt-get", "-o", "DPkg::Lock::Timeout=300", "update"],
            ["apt-get", "-o", "DPkg::Lock::Timeout=300", *INSTALL],
            ["systemctl", "enable", "--now", "qemu-guest-agent"],
        ]
        assert host.frontends("apt-get") == {"noninteractive"}
        assert logged(result)[-1] == "qemu-guest-agent started"

    def test_second_run_is_a_no_op(self, host: Host) -> None:
        host.stub_installer("apt-get")
        host.stub("systemctl")
        assert host.run().returncode == 0
        calls = len(host.calls())
        second = host.run()
        assert second.returncode == 0
        assert "qemu-guest-agent already installed; nothing to do" in logged(second)
        assert len(host.calls()) == calls

    def test_failed_install_exits_non_zero_and_says_so(self, host: Host) -> None:
        host.stub("apt-get", 'case "$*" in *install*) echo "E: Unable to locate package" >&2; exit 100;; esac')
        host.stub("systemctl")
        result = host.run()
        assert result.returncode == 1
        assert logged(result)[-1] == ("FAILED: could not install qemu-guest-agent (are the package mirrors reachable?)")
        assert [call[0] for call in host.calls()] == ["apt-get", "apt-get"]

    def test_failed_update_still_tries_the_install(self, host: Host) -> None:
        host.stub("apt-get", 'case "$*" in *update*) exit 100;; esac')
        host.stub("systemctl")
        result = host.run()
        assert result.returncode == 0
        assert "apt-get update failed; trying the install with the current package lists" in logged(result)
        assert host.calls()[1] == ["apt-get", "-o", "DPkg::Lock::Timeout=300", *INSTALL]

    def test_static_unit_falls_back_to_start(self, host: Host) -> None:
        host.stub("apt-get")
        host.stub("systemctl", 'case "$1" in enable) exit 1;; esac')
        result = host.run()
        assert result.returncode == 0
        assert host.calls()[-2:] == [
            ["systemctl", "enable", "--now", "qemu-guest-agent"],
            ["systemctl", "start", "qemu-guest-agent"],
        ]

    def test_service_that_will_not_start_fails(self, host: Host) -> None:
        host.stub("apt-get")
        host.stub("systemctl", "exit 1")
        result = host.run()
        assert result.returncode == 1
        assert logged(result)[-1].startswith("FAILED: installed qemu-guest-agent but could not start qemu-guest-agent")

    @pytest.mark.parametrize(
        ("manager", "install"),
        [
            ("dnf", ["dnf", "install", "-y", "qemu-guest-agent"]),
            ("yum", ["yum", "install", "-y", "qemu-guest-agent"]),
            ("zypper", ["zypper", "--non-interactive", "install", "qemu-guest-agent"]),
            ("apk", ["apk", "add", "--update-cache", "qemu-guest-agent"]),
        ],
    )
    def test_other_package_managers(self, host: Host, manager: str, install: list[str]) -> None:
        host.stub(manager)
        host.stub("systemctl")
        result = host.run()
        assert result.returncode == 0
        assert host.calls() == [install, ["systemctl", "enable", "--now", "qemu-guest-agent"]]

    def test_openrc_without_systemctl(self, host: Host) -> None:
        host.stub("apk")
        host.stub("rc-update")
        host.stub("rc-service")
        result = host.run()
        assert result.returncode == 0
        assert host.calls()[1:] == [
            ["rc-update", "add", "qemu-guest-agent", "default"],
            ["rc-service", "qemu-guest-agent", "start"],
        ]

    def test_sysv_service_without_systemctl_or_openrc(self, host: Host) -> None:
        host.stub("apt-get")
        host.stub("service")
        result = host.run()
        assert result.returncode == 0
        assert host.calls()[-1] == ["service", "qemu-guest-agent", "start"]

    def test_no_package_manager_fails_cleanly(self, host: Host) -> None:
        host.stub("systemctl")
        result = host.run()
        assert result.returncode == 1
        assert logged(result)[-1].startswith("FAILED: no supported package manager")
        assert host.calls() == []


class TestRole:
    """The guest_agent role runs the same script and reports changed only when it installed."""

    def play(self, host: Host, tmp_path: Path) -> int:
        """Run the role once; the number of changed tasks from the play recap."""
        playbook = tmp_path / "play.yml"
        playbook.write_text(
            "- hosts: localhost\n"
            "  gather_facts: false\n"
            "  environment:\n"
            f"    PATH: {host.bin}\n"
            "  roles:\n"
            f"    - role: {ROOT / 'roles' / 'guest_agent'}\n"
        )
        env = {
            **os.environ,
            "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"),
            "ANSIBLE_REMOTE_TEMP": str(tmp_path / "ansible-remote"),
        }
        result = subprocess.run(
            [str(Path(sys.executable).parent / "ansible-playbook"), "-c", "local", "-i", "localhost,", str(playbook)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        recap = re.search(r"^localhost\s*: ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=0", result.stdout, re.M)
        assert recap, result.stdout
        return int(recap.group(1))

    def test_installs_once_then_reports_no_change(self, host: Host, tmp_path: Path) -> None:
        host.stub_installer("apt-get")
        host.stub("systemctl")
        assert self.play(host, tmp_path) == 1
        assert host.calls()[-1] == ["systemctl", "enable", "--now", "qemu-guest-agent"]
        calls = len(host.calls())
        assert self.play(host, tmp_path) == 0
        assert len(host.calls()) == calls
