"""Many idle TCP connections to one address, from addresses of a test's network namespace: what a
stranger does to lock others out of a server (issue 38 row 4). ``Flood`` runs one process inside
the namespace that opens ``per_source`` connections from each source address (in batches, so the
kernel's queues are not what refuses them), sends nothing, and keeps a count of those still open
(the server may reset or close them) in a status file the test reads.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from support.netns.namespace import NamespacedProcess, NetworkNamespace
from support.waiting import wait_for

FLOOD = r"""
import asyncio, json, os, sys

host, port, per_source, status_path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
sources = sys.argv[5:]
state = {"attempted": 0, "connected": 0, "refused": 0, "open": 0, "done": False}

def report():
    with open(status_path + ".tmp", "w") as out:
        json.dump(state, out)
    os.replace(status_path + ".tmp", status_path)

async def hold(source):
    state["attempted"] += 1
    try:
        reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
    except OSError:
        state["refused"] += 1
        return
    state["connected"] += 1
    state["open"] += 1
    try:
        await reader.read()  # b"" or an error: the server ended it
    except OSError:
        pass
    state["open"] -= 1
    writer.transport.abort()

async def reporter():
    while True:
        report()
        await asyncio.sleep(0.1)

async def main():
    asyncio.ensure_future(reporter())
    holders = []
    for source in sources:
        for start in range(0, per_source, 250):
            batch = [asyncio.ensure_future(hold(source)) for _ in range(min(250, per_source - start))]
            holders += batch
            await asyncio.wait(batch, timeout=0.5)
    state["done"] = True
    await asyncio.gather(*holders)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


class Flood(NamespacedProcess):
    """``per_source`` idle connections from each of ``sources`` to ``host:port`` (a context manager)."""

    def __init__(self, netns: NetworkNamespace, host: str, port: int, sources: Sequence[str], per_source: int,
                 name: str = "flood") -> None:
        super().__init__(netns)
        self.directory = netns.root / name
        self.args = [host, str(port), str(per_source)]
        self.sources = list(sources)
        self.total = per_source * len(self.sources)

    def start(self) -> None:
        self.directory.mkdir(exist_ok=True)
        self.launch([sys.executable, "-c", FLOOD, *self.args, str(self.directory / "status.json"), *self.sources],
                    self.directory / "out.log")

    def status(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.directory / "status.json").read_text()))
        except (FileNotFoundError, ValueError):
            return {"attempted": 0, "connected": 0, "refused": 0, "open": 0, "done": False}

    def settle(self, lowest: int, highest: int | None = None, seconds: float = 60) -> dict[str, Any]:
        """Wait until every connection was tried and the count still open stays put for a second
        (resets of the ones beyond a limit arrive after their handshake) within ``lowest`` to
        ``highest`` (default: exactly ``lowest``); the flood's status then."""
        since: list[tuple[float, int]] = []
        top = lowest if highest is None else highest

        def settled() -> dict[str, Any] | None:
            status = self.status()
            if not (status["done"] and status["attempted"] == self.total and lowest <= status["open"] <= top):
                since.clear()
                return None
            if since and since[0][1] != status["open"]:
                since.clear()
            since.append((time.monotonic(), status["open"]))
            return status if since[-1][0] - since[0][0] >= 1.0 else None
        status = wait_for(settled, seconds, f"{self.total} connections tried, {lowest}-{top} of them held open",
                          0.1, lambda: f"flood: {self.status()}", process=self._process)
        assert status is not None  # wait_for returns what held
        return status
