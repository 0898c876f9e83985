"""Kubernetes Services for real, in a test's network namespace: what kube-proxy and the cloud's load
balancer do for the Pods a :class:`~support.netns.squid_kubelet.SquidKubelet` runs there.

The Kubernetes API emulator stores Services; nothing carries a packet to them. :class:`ServiceNetwork`
watches one namespace's Services, Pods and the cluster's Nodes (a list every ``poll`` seconds) and
does what the cluster's data plane would, with iptables in the test's namespace (kube-proxy's own
iptables mode does it with the same tables):

- **the cloud's service controller**: a LoadBalancer Service without an address gets the next one of
  ``load_balancer_addresses`` (each added to the namespace, as a cloud routes its VIP to the nodes)
  through ``KubeEmulator.provision_load_balancer``, which refuses source ranges of a family the
  Service lacks, as the clouds do;
- **a load balancer's address** (``status.loadBalancer.ingress[].ip``, the Service's port):
  ``loadBalancerSourceRanges`` enforced (kube-proxy's ``KUBE-FW`` chain and the cloud's firewall: a
  source outside them is dropped before any Pod sees it; none means everyone), then DNAT to the
  Pod's address and its target port;
- **a node port** (``spec.ports[].nodePort``, where one was allocated) on every address of every
  Node (``status.addresses``; the test puts them in the namespace): DNAT to the Pod, with no source
  range (kube-proxy applies those to the load balancer's address only);
- **externalTrafficPolicy**: ``Local`` keeps the client's source address, and a node without a
  Ready endpoint of the Service drops its node port (no local endpoint); ``Cluster`` forwards from
  every node and SNATs the packet to the receiving node's InternalIP (the load balancer's to the
  Pod's node), so the Pod sees a node, not the client.

One endpoint per Service (the provider's Services select one Pod each): the first Ready Pod the
selector matches. Everything lives in the namespace's own tables, in chains of its own; deleting
the namespace deletes them.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import subprocess
import threading
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from support.kube.emulator import KubeEmulator
from support.netns.namespace import NetworkNamespace
from support.process import DaemonStartError, run_checked

LOG = logging.getLogger(__name__)

Obj = dict[str, Any]
# The chains: DNAT on the way in (nat PREROUTING), Cluster's SNAT once the packet is ours (nat
# INPUT: the Pods' addresses are the namespace's own), and the drops (filter INPUT).
SERVICES, SNAT, FIREWALL = "EGP-SERVICES", "EGP-SNAT", "EGP-FIREWALL"
_HOOKS = (("nat", "PREROUTING", SERVICES), ("nat", "INPUT", SNAT), ("filter", "INPUT", FIREWALL))


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return status.get("phase") == "Running" and ready and bool(status.get("podIP")) \
        and not (pod.get("metadata") or {}).get("deletionTimestamp")


def _target_port(pod: Mapping[str, Any], target: Any) -> int | None:
    """A Service port's ``targetPort`` on ``pod``: a number as it is, a name looked up among the
    Pod's container ports."""
    if isinstance(target, int):
        return target
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == target:
                return int(port["containerPort"])
    return None


def _selects(service: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    selector = (service.get("spec") or {}).get("selector") or {}
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def _node_addresses(node: Mapping[str, Any], kind: str | None = None) -> list[str]:
    return [a["address"] for a in (node.get("status") or {}).get("addresses") or []
            if a.get("type") in ((kind,) if kind else ("InternalIP", "ExternalIP"))]


def _ipv4(address: str) -> bool:
    return ipaddress.ip_network(address, strict=False).version == 4


def service_rules(services: Iterable[Obj], pods: Sequence[Obj], nodes: Sequence[Obj]) -> dict[str, list[str]]:
    """The rules of every Service, by chain (``SERVICES``, ``SNAT``, ``FIREWALL``), as
    ``iptables-restore`` lines without the ``-A <chain>``."""
    rules: dict[str, list[str]] = {SERVICES: [], SNAT: [], FIREWALL: []}
    internal = {str((n.get("metadata") or {}).get("name")): _node_addresses(n, "InternalIP") for n in nodes}
    for service in services:
        spec = service.get("spec") or {}
        endpoint = next((p for p in pods if _ready(p) and _selects(service, p)), None)
        local = spec.get("externalTrafficPolicy") == "Local"
        for port in spec.get("ports") or []:
            target = _target_port(endpoint, port.get("targetPort", port.get("port"))) if endpoint else None
            pod_ip = str(endpoint["status"]["podIP"]) if endpoint else ""
            pod_node = str((endpoint or {}).get("spec", {}).get("nodeName") or "")
            # (address, port, sources, the node whose InternalIP Cluster SNATs to, reachable here)
            entries = [(ingress["ip"], int(port["port"]), spec.get("loadBalancerSourceRanges") or ["0.0.0.0/0"],
                        pod_node, True)
                       for ingress in ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
                       if ingress.get("ip")]
            for node in nodes if port.get("nodePort") else ():
                name = str((node.get("metadata") or {}).get("name"))
                entries += [(address, int(port["nodePort"]), ["0.0.0.0/0"], name, not local or name == pod_node)
                            for address in _node_addresses(node)]
            for address, dport, sources, snat_node, reachable in entries:
                match = f"-d {address}/32 -p tcp -m tcp --dport {dport}"
                if target is not None and reachable:
                    rules[SERVICES] += [f"{match} -s {source} -j DNAT --to-destination {pod_ip}:{target}"
                                        for source in sources if _ipv4(source)]
                    if not local and internal.get(snat_node):
                        rules[SNAT].append(f"-d {pod_ip}/32 -p tcp -m tcp --dport {target} -m conntrack "
                                           f"--ctorigdst {address} --ctorigdstport {dport} -j SNAT "
                                           f"--to-source {internal[snat_node][0]}")
                # What no DNAT took (a source outside the ranges, no local endpoint) ends here.
                rules[FIREWALL].append(f"{match} -j DROP")
    return rules


class ServiceNetwork:
    """The Services of ``namespace`` served in ``netns`` (``start``, ``stop``); ``sync`` once by hand."""

    def __init__(self, kube: KubeEmulator, netns: NetworkNamespace, namespace: str,
                 load_balancer_addresses: Sequence[str] = (), poll: float = 0.1) -> None:
        self.kube = kube
        self.netns = netns
        self.namespace = namespace
        self.poll = poll
        self._free = list(load_balancer_addresses)
        self._applied: dict[str, list[str]] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        self.refused: set[str] = set()  # LoadBalancer Services the cloud would not provision

    def __enter__(self) -> ServiceNetwork:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self) -> None:
        for table, hook, chain in _HOOKS:
            self._iptables("-t", table, "-N", chain)
            self._iptables("-t", table, "-A", hook, "-j", chain)
        self._thread = threading.Thread(target=self._run, name="service-network", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def dropped(self) -> int:
        """Packets the firewall chain dropped so far (sources outside the ranges, no endpoint)."""
        listing = subprocess.run(self.netns.command(["iptables", "-t", "filter", "-L", FIREWALL, "-v", "-n", "-x"]),
                                 capture_output=True, text=True, check=True).stdout
        return sum(int(line.split()[0]) for line in listing.splitlines()[2:] if line.strip())

    def _iptables(self, *args: str) -> None:
        run_checked(self.netns.command(["iptables", "-w", *args]))

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self.sync()
            except (OSError, DaemonStartError, KeyError, ValueError) as error:
                self.errors.append(f"{type(error).__name__}: {error}")
                LOG.exception("service network: sync failed")

    def sync(self) -> None:
        services = self._list(f"/api/v1/namespaces/{self.namespace}/services")
        for service in services:
            self._provision(service)
        services = self._list(f"/api/v1/namespaces/{self.namespace}/services")
        rules = service_rules(services, self._list(f"/api/v1/namespaces/{self.namespace}/pods"),
                              self._list("/api/v1/nodes"))
        if rules != self._applied:
            self._apply(rules)
            self._applied = rules

    def _provision(self, service: Obj) -> None:
        """The cloud's service controller: an address for a LoadBalancer Service that has none."""
        if (service.get("spec") or {}).get("type") != "LoadBalancer" or not self._free:
            return
        name = service["metadata"]["name"]
        if ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or name in self.refused:
            return
        stored = self.kube.provision_load_balancer(self.namespace, name, ip=self._free[0])
        if ((stored.get("status") or {}).get("loadBalancer") or {}).get("ingress"):
            self.netns.add_address(self._free.pop(0))
            LOG.info("service network: load balancer %s for %s", stored["status"]["loadBalancer"]["ingress"], name)
        else:  # the cloud refused it (its Event says why); a real controller retries with backoff
            self.refused.add(name)

    def _apply(self, rules: Mapping[str, list[str]]) -> None:
        lines = []
        for table in ("nat", "filter"):
            lines.append(f"*{table}")
            for _table, _hook, chain in (h for h in _HOOKS if h[0] == table):
                lines.append(f"-F {chain}")
                lines += [f"-A {chain} {rule}" for rule in rules[chain]]
            lines.append("COMMIT")
        run_checked(self.netns.command(["iptables-restore", "-w", "--noflush"]), stdin="\n".join(lines) + "\n")

    def _list(self, path: str) -> list[Obj]:
        with urllib.request.urlopen(f"{self.kube.url}{path}", timeout=5) as answer:
            return list(json.loads(answer.read())["items"])
