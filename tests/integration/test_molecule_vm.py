"""The kvm_hypervisor role on a real, fresh Debian 12 VM: the molecule scenario ``kvm_hypervisor_vm``.

Where ``test_bootstrap_role.py``'s scenario runs the role against libvirtd and sshd started on
this machine, this one boots the suite's Debian guest image under software emulation inside a
network namespace (``tests/support/hosts/hypervisor_vm.py``) and leaves the fragile paths to the role:
apt on a system that has never fetched a package list (the role's cache refresh, its
``python3-apt`` bootstrap, libvirt and QEMU from a local repository served in the namespace),
libvirtd enabled and started by systemd, the dedicated user ``egress-proxies`` in group libvirt.
It runs as ``molecule test`` exactly as from a shell and must pass every step, idempotence
included; verify connects from outside the VM with only the key the role authorized and the
known_hosts lines it wrote.

The test prints the time of each step and of the parts inside create (guest image, package
repository, VM boot), and the packages converge installed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from support import REPO
from support.collection.modules import collections_path
from support.figures import show
from support.hosts.hypervisor_host import HypervisorHost
from support.process import stop_process_group

pytestmark = pytest.mark.vm

SCENARIO = "kvm_hypervisor_vm"
STEPS = ("destroy", "create", "prepare", "converge", "idempotence", "verify")
# Under software emulation every task costs the guest seconds of CPU. Measured on 2 cores: 9 min
# for the whole sequence on a quiet machine (VM boot 96 s), 25+ min at a load average of 6-8.
# Building the guest image (2-3 min) and fetching the packages (~10 s) come on top on a
# machine's first run. The limit only stops a run that hangs.
MOLECULE_TIMEOUT = 2700
_STEP_EVENT = re.compile(rf"{SCENARIO} > (\w+)\]? (Executing|Executed: (\w+))")
_TIMING = re.compile(r"timing: ([^:\"]+): ([\d.]+) s")
# ansible.posix.profile_tasks' summary lines: "<play> : <task> ------ 12.34s".
_TASK_TIME = re.compile(r"^(.+?) -+ ([\d.]+)s$", re.MULTILINE)


def _tail(text: str, lines: int = 150) -> str:
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class MoleculeRun:
    status: int | None  # None: stopped at MOLECULE_TIMEOUT
    output: str
    steps: list[tuple[str, float]]  # each step's wall-clock seconds, in order

    def report(self) -> list[str]:
        lines = [f"{step:<12} {seconds:7.1f} s" for step, seconds in self.steps]
        lines += [f"  {what}: {float(seconds):.1f} s" for what, seconds in _TIMING.findall(self.output)]
        slowest = sorted(((float(seconds), task) for task, seconds in _TASK_TIME.findall(self.output)), reverse=True)
        lines += ["slowest tasks (every step's run of them):"]
        lines += [f"  {seconds:6.1f} s  {task}" for seconds, task in slowest[:8]]
        return lines

    def failure(self) -> str:
        ended = "timed out" if self.status is None else f"ended with {self.status}"
        return "\n".join([f"molecule {ended}; steps:", *(f"  {line}" for line in self.report()), _tail(self.output)])


def _run_molecule(env: dict[str, str]) -> MoleculeRun:
    """Run ``molecule test``, timing each step from its output as it comes."""
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "molecule"), "test", "--scenario-name", SCENARIO],
        cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    assert process.stdout is not None
    lines: list[str] = []
    steps: list[tuple[str, float]] = []
    started: dict[str, float] = {}
    # Checked at every line: molecule prints at least one per task.
    deadline = time.monotonic() + MOLECULE_TIMEOUT
    status: int | None = None
    try:
        for line in process.stdout:
            lines.append(line)
            event = _STEP_EVENT.search(line)
            if event:
                step, what = event.group(1), event.group(2)
                if what == "Executing":
                    started[step] = time.monotonic()
                elif step in started:
                    steps.append((step, time.monotonic() - started.pop(step)))
            if time.monotonic() > deadline:
                break
        else:
            status = process.wait(timeout=60)
    finally:
        process.stdout.close()
        if process.poll() is None:
            # ansible-playbook and its ssh processes too; the lab itself goes in the test.
            stop_process_group(cast("subprocess.Popen[bytes]", process))
    return MoleculeRun(status, "".join(lines), steps)


@pytest.mark.timeout(MOLECULE_TIMEOUT + 60)
def test_the_role_bootstraps_a_fresh_debian_vm(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if os.geteuid() != 0:
        pytest.fail("the VM scenario needs root (network and mount namespaces)", pytrace=False)
    state = tmp_path / "hypervisor-host.json"
    ephemeral = tmp_path / "molecule"
    bin_dir = Path(sys.executable).parent
    # ansible-playbook runs in the scenario's directory: every path it is given must be absolute.
    collections = os.pathsep.join(str(Path(path).resolve()) for path in collections_path().split(os.pathsep))
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": collections,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "MOLECULE_EPHEMERAL_DIRECTORY": str(ephemeral),
        "HYPERVISOR_HOST_STATE": str(state),
        "HYPERVISOR_VM_REPORT_DIR": str(tmp_path),
        "ANSIBLE_NOCOLOR": "1",
        "NO_COLOR": "1",
    }
    try:
        run = _run_molecule(env)
    finally:
        # Molecule destroys the lab after a failed step too; this covers molecule itself dying.
        leftover = HypervisorHost.attach(state) if state.exists() else None
        if leftover is not None:
            leftover.stop()
    # The whole log, for a failure's diagnosis and for the per-task times (profile_tasks).
    (tmp_path / "molecule.log").write_text(run.output)
    assert run.status == 0, run.failure()
    output = run.output
    for step in (*STEPS, "destroy"):
        assert f"{SCENARIO} > {step}: Executed: Successful" in output, run.failure()
    # Idempotence: molecule fails the step on any change; the step's own recap says so too
    # (its output runs from the step's "Executing" line to its "Executed" line).
    idempotence = re.search(rf"{SCENARIO} > idempotence\] Executing(.*?){SCENARIO} > idempotence[\]:] Executed",
                            output, re.DOTALL)
    assert idempotence and re.search(r"hypervisor\s+: ok=\d+\s+changed=0 ", idempotence.group(1)), run.failure()

    recorded = json.loads(state.read_text())
    assert recorded["stopped"], "molecule's destroy step did not stop the host"
    assert leftover is None
    assert not Path("/run/netns", recorded["namespace"]).exists()
    assert not Path(recorded["root"]).exists()

    installed = [line.split("\t") for line in (tmp_path / "packages-installed-by-converge.txt").read_text().split("\n")
                 if line]
    names = {name for name, _ in installed}
    assert {"libvirt-daemon-system", "qemu-system-x86", "python3-libvirt", "python3-apt"} <= names

    report = run.report()
    summary = re.search(r"package repository: ([^\n\"]+)", output)
    if summary:
        report.append(f"package repository: {summary.group(1)}")
    report.append(f"converge installed {len(installed)} packages: "
                  f"{' '.join(f'{name}={version}' for name, version in installed)}")
    show(request.config, f"molecule {SCENARIO} (Debian 12 VM, software emulation, 2 vCPU, 1.5 GiB):", report)
