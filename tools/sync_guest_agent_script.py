"""Regenerate plugins/module_utils/guest_agent_script.py from the guest_agent role's script.

roles/guest_agent/files/install-qemu-guest-agent.sh is the source of truth. The
modules need the same bytes, but they run on the target through AnsiballZ,
which ships module_utils and nothing from roles/, so the script is embedded as a
bytes constant in a generated module.

    python tools/sync_guest_agent_script.py           # rewrite the module
    python tools/sync_guest_agent_script.py --check   # exit 1 when it has drifted

The paths are taken relative to this file, so the tool works from any directory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "roles" / "guest_agent" / "files" / "install-qemu-guest-agent.sh"
MODULE = ROOT / "plugins" / "module_utils" / "guest_agent_script.py"

HEADER = '''\
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# Generated file, do not edit: the long lines are the script's own.
# ruff: noqa: E501
"""The guest agent bootstrap script, byte for byte, for the modules.

Source of truth: roles/guest_agent/files/install-qemu-guest-agent.sh (the
guest_agent role runs it on existing hosts; KVM instances get it as
vendor-data). Modules run on the target through AnsiballZ, which carries
module_utils but no role files, hence this copy. After editing the script,
regenerate with ``python tools/sync_guest_agent_script.py``;
``--check`` and tests/unit/test_guest_agent_script.py fail on drift.
"""

from __future__ import annotations

'''

# Printable ASCII stands for itself; the rest is escaped.
_PRINTABLE = frozenset(range(0x20, 0x7F))
_ESCAPES = {ord("\\"): "\\\\", ord("\n"): "\\n", ord("\t"): "\\t"}


def _literal(chunk: bytes) -> str:
    """A bytes literal for ``chunk``, readable where the bytes are ASCII.

    Quoted the way ``ruff format`` quotes (double, unless single quotes need
    fewer escapes), so the generated module passes the format check unchanged.
    """
    quote = "'" if chunk.count(b'"') > chunk.count(b"'") else '"'
    escapes = {**_ESCAPES, ord(quote): "\\" + quote}

    def char(byte: int) -> str:
        if byte in escapes:
            return escapes[byte]
        return chr(byte) if byte in _PRINTABLE else f"\\x{byte:02x}"

    body = "".join(char(byte) for byte in chunk)
    return f"b{quote}{body}{quote}"


def render(script: bytes) -> str:
    """The module text: one literal per script line, so diffs stay line for line."""
    lines = script.splitlines(keepends=True)
    body = "".join(f"    {_literal(line)}\n" for line in lines) or '    b""\n'
    return HEADER + "GUEST_AGENT_SCRIPT = (\n" + body + ")\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the module is out of date; write nothing")
    args = parser.parse_args(argv)

    wanted = render(SCRIPT.read_bytes())
    current = MODULE.read_text(encoding="utf-8") if MODULE.exists() else None
    if args.check:
        if current != wanted:
            tool = Path(__file__).resolve().relative_to(ROOT)
            print(
                f"{MODULE.relative_to(ROOT)} is out of date with {SCRIPT.relative_to(ROOT)}; run python {tool}",
                file=sys.stderr,
            )
            return 1
        return 0
    if current != wanted:
        MODULE.write_text(wanted, encoding="utf-8")
        print(f"wrote {MODULE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
