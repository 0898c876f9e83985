"""The pure parts of a sweep at 100,000 objects (docs/scaling.md): what one controller's CPU and
memory would pay for them, and how each grows from 10,000.

Measured in this process, nothing started, nothing sent anywhere: every object is made up here.
For each size (``--sizes``, default 10,000 and 100,000) it prints, per part, the wall and CPU
seconds of one pass and the cost per object:

- **decide**: ``sweep.verdict.judge`` for every Proxy (a serving instance, Ready, probed), as
  ``live.LivePath.observe`` applies it once per Proxy per sweep and per changed probe verdict;
  and ``sweep.flapping.chronic`` over each instance's window of 30 verdicts;
- **publish**: what discovery does with the Ready set: the view (``uid -> Proxy``), then one
  answer to the operator's token: sorting, ``proxy_entry`` per Proxy, the JSON body and its ETag
  (what ``ControllerHTTPServer._discovery`` does per request that is not a 304), and the
  ``.txt`` form;
- **pool placement**: ``Member.of`` for every member of one ProxyPool of that size over three
  placements, then ``pool.decide`` in the steady state (all Ready), with a tenth of the members
  past ``maxAge`` (a rotation), and with one placement's provider broken (a failover);
- **memory**: the bytes the Proxy objects themselves hold (``tracemalloc``), per Proxy, and the
  process's peak RSS.

It asserts nothing and is not a test: ``.venv/bin/python bench/scale_bench.py`` (about a minute
at 100,000 on 2 cores, ~1.5 GiB peak). Figures are loaded or quiet as ``uptime`` says: the
bench prints the load beside them.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import json
import os
import resource
import sys
import time
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from egress_proxies.providers.client import Instance
from egress_proxies.resources.pool import Placement, PoolSpec
from egress_proxies.resources.proxy import Proxy
from egress_proxies.serving.discovery import proxy_entry
from egress_proxies.serving.probe import ProbeOutcome, ProbeReason
from egress_proxies.sweep import placement
from egress_proxies.sweep.flapping import chronic
from egress_proxies.sweep.placement import Member
from egress_proxies.sweep.verdict import Observation, judge

NOW = "2026-12-06T12:00:00Z"
NOW_EPOCH = datetime(2026, 12, 6, 12, tzinfo=UTC).timestamp()
PROBED_AT = datetime(2026, 12, 6, 11, 59, 55, tzinfo=UTC)
PLACEMENTS = (Placement("home-kvm"), Placement("gcp", "europe-west4-a"), Placement("cluster"))


def say(text: str) -> None:
    """One line of the report, at once (a long run shows its figures as they come)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def made_up_proxy(n: int) -> Proxy:
    """A Ready, serving Proxy as the Kubernetes source holds it (the fields a steady fleet's
    status has, and the object as read, ``raw``)."""
    provider_id = f"kvm://hosts/h{n % 1000}/domains/p-crawlers-proxy-{n}-0a1b2c"
    ip = f"10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}"
    conditions = [
        {"type": kind, "status": "True", "reason": reason, "message": message,
         "lastTransitionTime": "2026-12-06T09:00:00Z", "observedGeneration": 1}
        for kind, reason, message in (
            ("Ready", "Serving", (f"instance {provider_id} at {ip}:3128 serves: requests through it reached the "
                                  "probe target (12 ms)")),
            ("Serving", "Serving", f"instance {provider_id} at {ip}:3128 serves"),
            ("Private", "CredentialsRequired", "requests need the crawlers credentials, from 10.0.0.0/8"))]
    placement = PLACEMENTS[n % 3]
    obj = {
        "metadata": {"namespace": "crawlers", "name": f"proxy-{n}", "uid": f"uid-{n:08d}", "generation": 1,
                     "resourceVersion": str(n), "creationTimestamp": "2026-12-06T08:00:00Z",
                     # A member of the pool "fleet" at its placement.
                     "labels": {"crawl.example.com/pool": "fleet", "crawl.example.com/pool-placement": str(n % 3)},
                     "annotations": {"crawl.example.com/spec-hash": "0123456789abcdef"},
                     "finalizers": ["crawl.example.com/cleanup"]},
        "spec": {"provider": placement.provider, **({"location": placement.location} if placement.location else {}),
                 "port": 3128, "cloudInit": "#cloud-config\n"},
        "status": {"phase": "Ready", "providerID": provider_id, "ip": ip, "endpoint": f"{ip}:3128",
                   "location": f"h{n % 1000}", "readyProviderID": provider_id, "readySince": "2026-12-06T09:00:00Z",
                   "egressIP": ip, "credentialGeneration": "g1", "observedGeneration": 1,
                   "probe": {"latencySeconds": 0.012, "lastProbeTime": "2026-12-06T11:59:55Z",
                             "servedProviderID": provider_id},
                   "conditions": conditions}}
    proxy = Proxy.from_object(obj)
    proxy.raw = obj  # as the Kubernetes source keeps it (labels are read from it)
    return proxy


def timed(what: str, count: int, action: Callable[[], object],
          note: Callable[[Any], str] | None = None) -> tuple[str, float, float, float]:
    """(what, wall seconds, CPU seconds, microseconds of CPU per object) of one run of ``action``;
    ``note`` says what the run decided, after ``what``."""
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    result = action()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return (f"{what} ({note(result)})" if note else what), wall, cpu, cpu / count * 1e6


def decide_parts(proxies: list[Proxy]) -> list[tuple[str, float, float, float]]:
    outcome = ProbeOutcome(True, ProbeReason.SERVING, "ok", 0.012, "198.51.100.7", True, "refused", PROBED_AT)
    seen = [Observation(Instance(provider_id=p.status["providerID"], name=p.name, location=p.status["location"],
                                 state="running", ip=p.status["ip"]), 3128, probed=True, outcome=outcome,
                        built_private=("True", "CredentialsRequired", "m"), credential_generation="g1")
            for p in proxies]
    windows = [tuple(i % 7 != n % 7 for i in range(30)) for n in range(len(proxies))]

    def judge_all() -> None:
        for proxy, observation in zip(proxies, seen, strict=True):
            judge(proxy.status, observation, NOW)

    def chronic_all() -> None:
        for window in windows:
            chronic(window, 30, 25)

    return [timed("decide: verdict.judge, every Proxy", len(proxies), judge_all),
            timed("decide: flapping.chronic, a 30-probe window each", len(proxies), chronic_all)]


def publish_parts(proxies: list[Proxy]) -> list[tuple[str, float, float, float]]:
    view: dict[str, Proxy] = {}

    def build_view() -> None:
        view.update({p.uid: p for p in proxies})

    def answer(as_text: bool) -> Callable[[], bytes]:
        def run() -> bytes:
            ready = sorted(view.values(), key=lambda p: (p.namespace, p.name))
            entries = [proxy_entry(p) for p in ready]
            if as_text:
                body = "".join(f"{e['ip']}:{e['port']}\n" for e in entries).encode()
            else:
                body = json.dumps({"proxies": entries}).encode()
            hashlib.sha256(body).hexdigest()
            return body
        return run

    parts = [timed("publish: the Ready view (uid -> Proxy)", len(proxies), build_view)]
    size = len(answer(False)())
    parts.append(timed(f"publish: one JSON answer + ETag ({size / 1e6:.1f} MB)", len(proxies), answer(False)))
    parts.append(timed("publish: one .txt answer + ETag", len(proxies), answer(True)))
    return parts


def pool_parts(proxies: list[Proxy]) -> list[tuple[str, float, float, float]]:
    count = len(proxies)
    spec = PoolSpec(replicas=count, template={"cloudInit": "#cloud-config\n", "port": 3128}, placements=PLACEMENTS,
                    max_age_seconds=86400.0, max_surge=max(1, count // 100))
    members: list[Member] = []

    def members_of() -> None:
        members.extend(Member.of(p, spec, NOW_EPOCH) for p in proxies)

    parts = [timed("pool: Member.of, every member", count, members_of)]
    aged = [dataclasses.replace(m, ready_age=90000.0) if i % 10 == 0 else m for i, m in enumerate(members)]
    def decided(decision: placement.Decision) -> str:
        return f"{len(decision.creates)} create, {len(decision.retire)} retire, {len(decision.deletes)} delete"

    parts.append(timed("pool: decide, steady (all Ready)", count,
                       lambda: placement.decide(spec, members, {}, [], NOW_EPOCH), decided))
    parts.append(timed("pool: decide, a tenth past maxAge", count,
                       lambda: placement.decide(spec, aged, {}, [], NOW_EPOCH), decided))
    parts.append(timed("pool: decide, one placement broken", count,
                       lambda: placement.decide(spec, members, {1: "listing failed"}, [], NOW_EPOCH), decided))
    return parts


def memory_part(count: int) -> tuple[list[Proxy], float]:
    """The Proxies, and the bytes they hold each (tracemalloc, while they are made)."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    proxies = [made_up_proxy(n) for n in range(count)]
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return proxies, held / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000", help="comma-separated object counts")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[int, dict[str, tuple[float, float, float]]] = {}
    for count in sizes:
        load = os.getloadavg()
        proxies, per_proxy = memory_part(count)
        say(f"\n== {count:,} objects (load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the start)")
        say(f"memory: the Proxy objects hold {per_proxy / 1024:.1f} KiB each, {per_proxy * count / 2**20:.0f} MiB "
              "in all")
        rows = decide_parts(proxies) + publish_parts(proxies) + pool_parts(proxies)
        results[count] = {}
        for what, wall, cpu, per in rows:
            say(f"{what:<58} {wall:8.3f} s wall {cpu:8.3f} s CPU {per:8.2f} us CPU/object")
            results[count][what.split(" (")[0]] = (wall, cpu, per)
        del proxies
        gc.collect()
    if len(sizes) >= 2:
        small, large = sizes[0], sizes[-1]
        say(f"\n== growth {small:,} -> {large:,} ({large / small:.0f}x the objects): CPU time ratio")
        for what, (_, cpu, _) in results[large].items():
            before = results[small].get(what)
            if before is not None and before[1] > 0:
                say(f"{what:<58} {cpu / before[1]:6.1f}x")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    load = os.getloadavg()
    say(f"\npeak RSS {peak:.0f} MiB; load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end")


if __name__ == "__main__":
    main()
