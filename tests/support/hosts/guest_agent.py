"""Run commands and read files inside a guest through its QEMU guest agent, as an operator would
with ``virsh qemu-agent-command``: ``guest-exec`` starts the process, ``guest-exec-status`` is
polled until it has exited and carries its exit code and base64 output.

This is how the end-to-end test looks inside a VM that has no SSH server and whose only
network is the hypervisor's isolated one.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import libvirt
import libvirt_qemu

from support.waiting import wait_for

# Seconds libvirt waits for the agent to answer one command.
AGENT_COMMAND_TIMEOUT = 10


@dataclass(frozen=True)
class GuestProcess:
    exit_code: int
    stdout: str
    stderr: str


def agent_command(domain: libvirt.virDomain, command: str, **arguments: Any) -> Any:
    """One guest agent command; its ``return`` value."""
    request = {"execute": command, **({"arguments": arguments} if arguments else {})}
    reply = json.loads(libvirt_qemu.qemuAgentCommand(domain, json.dumps(request), AGENT_COMMAND_TIMEOUT, 0))
    return reply["return"]


def guest_exec(domain: libvirt.virDomain, argv: Sequence[str], timeout: float = 60.0) -> GuestProcess:
    """Run ``argv`` in the guest and wait for it to exit."""
    started = agent_command(domain, "guest-exec", path=argv[0], arg=list(argv[1:]), **{"capture-output": True})

    def exited() -> dict[str, Any]:
        status: dict[str, Any] = agent_command(domain, "guest-exec-status", pid=started["pid"])
        return status if status["exited"] else {}
    status = wait_for(exited, timeout, f"{list(argv)} to exit in the guest", interval=0.5, error=TimeoutError)
    return GuestProcess(
        exit_code=int(status.get("exitcode", -1)),
        stdout=base64.b64decode(status.get("out-data", "")).decode(errors="replace"),
        stderr=base64.b64decode(status.get("err-data", "")).decode(errors="replace"),
    )


def read_guest_file(domain: libvirt.virDomain, path: str) -> bytes:
    """A file's exact bytes, read through the agent's file API (no shell, no decoding)."""
    handle = agent_command(domain, "guest-file-open", path=path, mode="r")
    chunks: list[bytes] = []
    try:
        while True:
            chunk = agent_command(domain, "guest-file-read", handle=handle, count=65536)
            chunks.append(base64.b64decode(chunk["buf-b64"]))
            if chunk["eof"]:
                return b"".join(chunks)
    finally:
        agent_command(domain, "guest-file-close", handle=handle)


def agent_answers(domain: libvirt.virDomain) -> bool:
    """True once the agent inside the guest responds to a ping."""
    try:
        agent_command(domain, "guest-ping")
    except libvirt.libvirtError:
        return False
    return True
