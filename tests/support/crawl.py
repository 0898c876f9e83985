"""``scrapy runspider`` of tests/clients/site_spider.py through EgressProxiesMiddleware, for the
crawler's tests: the crawl's exit code, its log and its stats (written by the spider as it closes).

The Scrapy is .venv's (the newest pinned); ``EGRESS_PROXIES_TEST_SCRAPY`` names another one's
``scrapy`` command to run the same crawls against it, with this checkout's client on its path:
scripts/test.sh's clients-scrapy-2.13 step points it at .venv-scrapy-2.13's (the oldest line)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.controller.discovery_server import CRAWLER_TOKEN

SCRAPY = os.environ.get("EGRESS_PROXIES_TEST_SCRAPY") or str(Path(sys.executable).parent / "scrapy")
SPIDER_DIRECTORY = Path(__file__).resolve().parents[1] / "clients"
CLIENT = Path(__file__).resolve().parents[2] / "clients" / "python"


@dataclass
class Crawl:
    returncode: int
    log: str
    stats: dict[str, Any]
    seconds: float


def crawl(discovery_url: str, start_url: str, directory: Path, *settings: str, also: str = "",
          meta: str = "{}", scope: str = "EGRESS_PROXIES_NAMESPACE=crawlers", timeout: float = 120) -> Crawl:
    """One crawl from ``start_url`` (and ``also``, comma-separated), every request with ``meta``;
    ``settings`` (``NAME=value``) after the discovery ones, so they win."""
    stats_path = directory / "stats.json"
    stats_path.unlink(missing_ok=True)
    arguments = [f"EGRESS_PROXIES_URL={discovery_url}", f"EGRESS_PROXIES_TOKEN={CRAWLER_TOKEN}", scope, *settings]
    started = time.monotonic()
    result = subprocess.run(
        [SCRAPY, "runspider", str(SPIDER_DIRECTORY / "site_spider.py"), "-a", f"start_url={start_url}",
         "-a", f"stats_path={stats_path}", "-a", f"also={also}", "-a", f"meta={meta}",
         *(word for setting in arguments for word in ("-s", setting))],
        # Ban detectors are named by their import path: tests/clients is where they are found.
        env={**os.environ, "PYTHONPATH": f"{SPIDER_DIRECTORY}{os.pathsep}{CLIENT}"}, capture_output=True, text=True,
        timeout=timeout, check=False)
    stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
    return Crawl(result.returncode, result.stderr, stats, time.monotonic() - started)
