"""``egress-proxies``: the controller's command line. Builds the pieces and starts the loop."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import ipaddress
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, cast

from egress_proxies import logs, metrics
from egress_proxies.health import SweepHealth
from egress_proxies.http_server import (
    QUARANTINE_PER_MINUTE,
    ControllerHTTPServer,
    DiscoveryAccess,
    ServerSettings,
    TokenScopes,
    TokensFileError,
    token_from_env,
    warn_if_no_token,
)
from egress_proxies.loop import ChangeFeed, Controller, Elector, LoopSettings
from egress_proxies.providers import client as providers_module
from egress_proxies.providers.runner import AnsibleRunner
from egress_proxies.resources.proxy import PHASE_READY, Proxy
from egress_proxies.serving import proof, target
from egress_proxies.serving.credentials import GRACE_SECONDS, Credentials, SecretBackend
from egress_proxies.serving.monitor import ServingMonitor
from egress_proxies.serving.probe import ProbeConfigError, Prober
from egress_proxies.sources.directory import DirectoryStore
from egress_proxies.sources.directory_pools import DirectoryPools
from egress_proxies.sources.file_secrets import FileSecrets
from egress_proxies.sources.store import PoolStore, ProxyStore, StoreError
from egress_proxies.sweep.backoff import Backoff
from egress_proxies.sweep.live import LiveSettings
from egress_proxies.sweep.pools import PoolReconciler
from egress_proxies.sweep.quarantine import Quarantine
from egress_proxies.sweep.reconcile import Reconciler, ReconcileSettings, SweepParts

log = logging.getLogger("egress_proxies")


@dataclass(frozen=True)
class Settings:
    """Everything the command line sets, typed, with the defaults a deployment starts from."""

    source: str = "kubernetes"
    proxy_dir: Path = Path("proxies")
    provider_config: Path = Path("/etc/egress-proxies/providers.yaml")
    provider_config_given: bool = False  # --provider-config on the command line, not the default
    work_dir: Path = Path("/var/lib/egress-proxies")
    interval_seconds: float = 60.0
    gc_grace_seconds: float = ReconcileSettings.gc_grace_seconds
    gc_dry_run: bool = ReconcileSettings.gc_dry_run
    batch_size: int = ReconcileSettings.batch_size
    runner_timeout_seconds: int = 600
    max_runners: int | None = None
    keep_artifacts: int = 50
    listen: tuple[str, int] = ("0.0.0.0", 8080)
    # None: no metrics listener (the shipped Deployment sets 0.0.0.0:9090).
    metrics_listen: tuple[str, int] | None = None
    kubeconfig: str | None = None
    namespace: str | None = None
    lease_namespace: str = "egress-proxies"
    lease_name: str = "egress-proxies-leader"
    identity: str = ""
    once: bool = False
    check_config: bool = False
    probe_interval_seconds: float = 10.0
    probe_allow: list[str] | None = None
    discovery_tokens: Path | None = None
    credential_grace_seconds: float = GRACE_SECONDS
    until_ready_seconds: float | None = None
    quarantine_per_minute: float = QUARANTINE_PER_MINUTE


def _positive(number: type[int] | type[float], minimum: float, what: str) -> Callable[[str], Any]:
    """An argparse type: a ``number`` (int or float) no smaller than ``minimum`` (argparse reports the rest)."""
    def parse(text: str) -> int | float:
        try:
            value = number(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if value < minimum or value != value:  # NaN compares false both ways
            raise argparse.ArgumentTypeError(f"{text!r} must be at least {minimum:g}")
        return value
    return parse


def _listen(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets: [::1]:8080)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not HOST:PORT with a port 0-65535 (e.g. 0.0.0.0:8080, [::1]:8080)")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or (":" in host and not text.startswith("[")):
        raise argparse.ArgumentTypeError(f"{text!r}: write an IPv6 host in brackets, e.g. [::1]:8080")
    return host, int(port)


def version() -> str:
    try:
        return importlib.metadata.version("egress-proxies-controller")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


_Add = Callable[..., argparse.Action]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="egress-proxies", description="Keep every Proxy resource backed by a running egress proxy.",
        epilog="A Proxy is Ready once a request through it reached the probe target: run 'egress-proxies "
               "probe-target --key-file KEY' where the proxies and this controller both reach it (on a one-host "
               "setup, on the KVM host's public address) and name it in each provider's probe. This controller's "
               "own egress address must be in every provider's allowedSources, or its probe is refused like any "
               "other client (docs/production.md).")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    _source_options(parser.add_argument_group("where Proxies come from").add_argument)
    _config_options(parser.add_argument_group("provider config and run modes").add_argument)
    _sweep_options(parser.add_argument_group("sweeps and ansible-runner").add_argument)
    _leader_options(parser.add_argument_group("leader election (--source kubernetes)").add_argument)
    _serving_options(parser.add_argument_group("health, metrics, discovery and probes").add_argument)
    _logging_options(parser.add_argument_group("logging").add_argument)
    return parser


def _source_options(add: _Add) -> None:
    add("--source", choices=["kubernetes", "directory"], default=Settings.source,
        help="where Proxies come from (default: %(default)s)")
    add("--proxy-dir", type=Path, default=Settings.proxy_dir,
        help="with --source directory: the folder of Proxy YAML files; status is written beside them")
    add("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="kubeconfig (default: in-cluster config)")
    add("--namespace", default=None, help="watch Proxies in this namespace only (default: all)")


def _config_options(add: _Add) -> None:
    add("--provider-config", type=Path, default=None,
        help=f"the provider config file (default: {Settings.provider_config})")
    add("--check-config", action="store_true",
        help="check exactly the files named: the provider config (with the collection's validator, and each "
             "provider's backend) and the --discovery-tokens file, or only the tokens file when it is named without "
             "--provider-config; print every error on a line of its own with its field path, and exit (non-zero "
             "when any is invalid)")
    add("--once", action="store_true",
        help="run one sweep and exit: 0 only when nothing failed (config, providers, Proxies)")
    add("--until-ready", type=_positive(float, 0, "a number of seconds"), default=None,
        dest="until_ready_seconds", metavar="SECONDS",
        help="sweep until every Proxy is Ready (or SECONDS pass), print them, and exit")


def _sweep_options(add: _Add) -> None:
    add("--work-dir", type=Path, default=Settings.work_dir,
        help="runner artifacts and image cache (an emptyDir in a cluster)")
    add("--interval", type=_positive(float, 0.1, "a number of seconds"), default=Settings.interval_seconds,
        dest="interval_seconds", help="seconds between sweeps (default: %(default)s)")
    add("--gc-grace", type=_positive(float, 0, "a number of seconds"), default=Settings.gc_grace_seconds,
        dest="gc_grace_seconds",
        help="minimum age in seconds before an orphaned instance is deleted (default: %(default)s)")
    add("--gc-dry-run", action="store_true", help="only report orphaned instances, never delete them")
    add("--batch-size", type=_positive(int, 1, "a whole number"), default=Settings.batch_size,
        help="module calls per runner invocation")
    add("--runner-timeout", type=_positive(int, 1, "a whole number of seconds"),
        default=Settings.runner_timeout_seconds, dest="runner_timeout_seconds",
        help="seconds before a runner invocation is killed with its process group")
    add("--max-runners", type=_positive(int, 1, "a whole number"), default=None,
        help="concurrent runner processes (default: as many as fit in memory, at most 8)")
    add("--keep-artifacts", type=_positive(int, 0, "a whole number"), default=Settings.keep_artifacts,
        help="runner artifact directories kept")


def _leader_options(add: _Add) -> None:
    add("--lease-namespace", default=Settings.lease_namespace, help="namespace of the leader-election Lease")
    add("--lease-name", default=Settings.lease_name, help="name of the leader-election Lease")
    add("--identity", default=os.environ.get("POD_NAME") or socket.gethostname(), help="leader-election identity")


def _serving_options(add: _Add) -> None:
    add("--listen", type=_listen, default=Settings.listen,
        help="HOST:PORT for /healthz, /readyz and discovery (default: 0.0.0.0:8080)")
    add("--metrics-listen", type=_listen, default=None, metavar="HOST:PORT",
        help="HOST:PORT of a listener of its own serving /metrics, unauthenticated, and nothing else "
             "(default: none, no metrics served; the shipped Deployment uses 0.0.0.0:9090). The discovery "
             "port never serves /metrics")
    add("--probe-interval", type=_positive(float, 1, "a number of seconds"), default=Settings.probe_interval_seconds,
        dest="probe_interval_seconds", help="seconds between probes through every proxy (default: %(default)s)")
    add("--probe-allow", action="append", default=None, metavar="CIDR", dest="probe_allow",
        help="only probe proxy endpoints inside this network (repeatable; default: anywhere). Addresses a "
             "provider reports outside them are reported NotAllowed and never contacted")
    add("--discovery-tokens", type=Path, default=None, metavar="FILE",
        help="crawler tokens scoped to namespaces (YAML: [{name, sha256, namespaces: [NAMESPACE, ...]}]); a "
             "scoped token sees only its namespaces' proxies, with their credentials. Checked at start: any bad "
             "entry stops the controller. DISCOVERY_TOKEN stays the operator's all-namespaces token, without "
             "credentials")
    add("--credential-grace", type=_positive(float, 0, "a number of seconds"), default=GRACE_SECONDS,
        dest="credential_grace_seconds", metavar="SECONDS",
        help="how long a namespace's proxy credential outlives the namespace's last Proxy before it is removed "
             "(a namespace made again later, or under another identity, always gets a new one; default: "
             "%(default)s)")
    add("--quarantine-rate", type=_positive(float, 0.1, "a number per minute"), default=QUARANTINE_PER_MINUTE,
        dest="quarantine_per_minute", metavar="PER_MINUTE",
        help="quarantines one discovery token may ask for per minute (POST /v1/proxies/NS/NAME/quarantine); "
             "beyond it the answer is 429 with Retry-After (default: %(default)s)")


def _logging_options(add: _Add) -> None:
    add("--log-level", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"], default="INFO",
        help="DEBUG, INFO, WARNING or ERROR (default: %(default)s)")
    add("--log-format", choices=["text", "json"], default="text",
        help="text, or json: one object per line with time, level, logger, message and, where a line is "
             "about one, proxy and provider (default: %(default)s)")


def parse_args(argv: list[str] | None = None) -> Settings:
    args = vars(build_parser().parse_args(argv))
    logs.configure(args.pop("log_level"), args.pop("log_format"))
    # Modules run in ansible-runner's private directories: a relative path would name another file.
    args["provider_config_given"] = args["provider_config"] is not None
    args["provider_config"] = (args["provider_config"] or Settings.provider_config).absolute()
    args["proxy_dir"] = args["proxy_dir"].absolute()
    args["work_dir"] = args["work_dir"].absolute()
    return Settings(**args)


def build_pools(settings: Settings, store: ProxyStore) -> PoolStore:
    """Where ProxyPools come from: the same source as the Proxies."""
    if isinstance(store, DirectoryStore):
        return DirectoryPools(store)
    from egress_proxies.sources import kube

    return kube.KubePools(kube.kube_client(settings.kubeconfig), namespace=settings.namespace)


def build_store(settings: Settings) -> tuple[ProxyStore, Elector | None, SecretBackend]:
    """The Proxy source, its leader election, and where the proxies' credentials are kept: a 0600
    file per namespace under the work dir, or Secrets in the controller's own namespace."""
    if settings.source == "directory":
        return DirectoryStore(settings.proxy_dir), None, FileSecrets(settings.work_dir / "credentials")
    from egress_proxies.leader import LeaseElector
    from egress_proxies.sources import kube  # only this source needs the kubernetes client

    api = kube.kube_client(settings.kubeconfig)
    elector = LeaseElector(kube.KubeLeases(api), settings.lease_namespace, settings.lease_name, settings.identity)
    return kube.KubeStore(api, namespace=settings.namespace), elector, kube.KubeSecrets(api, settings.lease_namespace)


def proxy_url(credentials: Credentials) -> Callable[[Proxy], str | None]:
    """Discovery's URL of a proxy: with the credentials its instance was built with."""
    def url(proxy: Proxy) -> str | None:
        endpoint = proxy.status.get("endpoint")
        if not endpoint:
            return None
        if proxy.spec.get("auth") == "none":
            return f"http://{endpoint}"
        credential = credentials.by_generation(proxy.namespace, proxy.status.get("credentialGeneration"))
        return credential.proxy_url(str(endpoint)) if credential is not None else None
    return url


def print_proxies(proxies: list[Proxy]) -> None:
    rows = [("NAMESPACE", "NAME", "PROVIDER", "LOCATION", "IP", "PHASE")]
    for proxy in proxies:
        rows.append((proxy.namespace, proxy.name, proxy.provider, str(proxy.spec.get("location") or "-"),
                     str(proxy.status.get("ip") or "-"), str(proxy.status.get("phase") or "Pending")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        sys.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
        sys.stdout.write("\n")


def run_until_ready(controller: Controller, store: ProxyStore, timeout: float, pause: float = 2.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        controller.sweep_once()
        if controller.reconciler.monitor is not None and controller.reconciler.monitor.probe_now():
            controller.sweep_once()  # record what the probes found at once
        proxies, _ = store.list_proxies()
        ready = [p for p in proxies if p.status.get("phase") == PHASE_READY]
        if proxies and len(ready) == len(proxies):
            print_proxies(proxies)
            log.info("all %d Proxies are Ready", len(proxies))
            return 0
        if time.monotonic() >= deadline:
            print_proxies(proxies)
            log.error("%d of %d Proxies Ready after %.0f s", len(ready), len(proxies), timeout)
            return 1
        time.sleep(pause)


def check_config(runner: AnsibleRunner, path: Path) -> int:
    """``--check-config``: every error of the provider config, through the collection's validator,
    and what each valid provider's backend shows wrong (credentials, scopes, firewall); each on a
    line of its own, with its field path."""
    try:
        providers = providers_module.check_config(runner, str(path), check_backends=True)
    except providers_module.ConfigUnreadable as error:
        return _invalid(path, "provider config", error.errors)
    backend = [error for errors in providers.backend_errors.values() for error in errors]

    def verdict(name: str) -> str:
        if name in providers.invalid:
            return "INVALID"
        if name in providers.location_errors:
            return "INVALID for some locations (the others take new proxies)"
        return "NOT USABLE" if name in providers.backend_errors else "ok"

    lines = [f"provider {name} ({provider_type}): {verdict(name)}" for name, provider_type in providers.types.items()]
    lines += [f"  {error}" for error in (*providers.errors, *backend)]
    lines += location_state_lines(providers)
    lines += reachability_lines(providers)
    problems = len(providers.errors) + len(backend)
    lines.append(f"{path}: {f'{problems} error(s)' if problems else 'valid'}")
    sys.stdout.write("\n".join(lines) + "\n")
    return 1 if problems else 0


# What each maintenance state of a location means, for --check-config.
_STATE_MEANING = {"cordoned": "takes no new proxies; its instances stay (a Proxy pinned there by spec.location "
                              "gets the HostActive condition)",
                  "draining": "takes no new proxies; its instances are replaced on the others, make before break; "
                              "egress_proxies_location_state{state=\"drained\"} turns 1 when none is left (a Proxy "
                              "pinned there by spec.location stays, with the HostActive condition)"}


def location_state_lines(providers: providers_module.ProviderSet) -> list[str]:
    """``--check-config``: the locations taken out of placement on purpose (a KVM host's state)."""
    return [f"  provider {name}: host {location} is {state}: {_STATE_MEANING.get(state, state)}"
            for name, states in providers.location_states.items() for location, state in sorted(states.items())]


def reachability_lines(providers: providers_module.ProviderSet) -> list[str]:
    """``--check-config``'s reachability section: per provider, what its proxies will be reachable
    at and from (crawlers, the controller's probe), as the collection's validator says; nothing for
    a provider that says nothing (an invalid one, a type without the check)."""
    said = {name: lines for name, lines in providers.reachability.items() if lines}
    if not said:
        return []
    return ["reachability:", *(line for name, lines in said.items()
                                for line in (f"  provider {name}:", *(f"    {sentence}" for sentence in lines)))]


def _invalid(path: Path, what: str, errors: tuple[str, ...]) -> int:
    """A file that cannot be used at all: every error on a line of its own, then the count."""
    lines = [f"INVALID: {what} {path}", *(f"  {error}" for error in errors), f"{path}: {len(errors)} error(s)"]
    sys.stdout.write("\n".join(lines) + "\n")
    return 1


def check_tokens(path: Path | None) -> int:
    """``--check-config --discovery-tokens FILE``: the tokens file's problems, as at start-up."""
    if path is None:
        return 0
    try:
        TokenScopes(path).check()
    except TokensFileError as error:
        return _invalid(path, "discovery tokens", error.problems)
    sys.stdout.write(f"{path}: valid\n")
    return 0


def check_files(runner: AnsibleRunner, settings: Settings) -> int:
    """``--check-config`` on exactly what it is given: the provider config (the default one when
    no file is named), and the tokens file; a tokens file named alone is checked alone."""
    tokens_alone = settings.discovery_tokens is not None and not settings.provider_config_given
    providers = 0 if tokens_alone else check_config(runner, settings.provider_config)
    return max(providers, check_tokens(settings.discovery_tokens))


@dataclass(frozen=True)
class Pieces:
    """What ``main`` builds from the settings, for the mode it runs."""

    runner: AnsibleRunner
    store: ProxyStore
    monitor: ServingMonitor
    credentials: Credentials
    health: SweepHealth
    controller: Controller
    pools: PoolReconciler


def build_pieces(settings: Settings, runner: AnsibleRunner) -> Pieces | None:
    """The store, prober, monitor, reconciler and controller; None (the reason logged) when the
    controller cannot start: another controller holds the directory, no cluster to talk to, or
    an invalid --probe-allow."""
    try:
        store, elector, secrets = build_store(settings)
    except StoreError as error:  # another controller holds the directory; no cluster to talk to
        log.error("%s", error)
        return None
    log.info("runner: at most %d concurrent ansible-runner processes, %d s timeout", runner.max_concurrent,
             settings.runner_timeout_seconds)
    try:
        prober = Prober(allowed_networks=settings.probe_allow)
    except ProbeConfigError as error:
        log.error("--probe-allow: %s", error)
        return None
    monitor = ServingMonitor(prober, settings.probe_interval_seconds)
    credentials = Credentials(secrets, settings.credential_grace_seconds,
                              scope=settings.namespace if settings.source == "kubernetes" else None)
    # A sweep creates (and deletes) at most one round of create batches' worth of pool members.
    pools = PoolReconciler(build_pools(settings, store), store,
                           step=settings.batch_size * LiveSettings.parallel_batches)
    reconciler = Reconciler(
        store, runner, str(settings.provider_config),
        ReconcileSettings(gc_grace_seconds=settings.gc_grace_seconds, gc_dry_run=settings.gc_dry_run,
                          batch_size=settings.batch_size),
        SweepParts(backoff=Backoff(), purge=runner.purge_artifacts, monitor=monitor, credentials=credentials,
                   pools=pools))
    health = SweepHealth(settings.interval_seconds, leader=elector is None)
    metrics.LEADER.labels(name=settings.lease_name).set_function(lambda: 1.0 if health.leader else 0.0)
    metrics.MAX_RUNNERS.set(runner.max_concurrent)
    controller = Controller(reconciler, store, health,
                            LoopSettings(interval_seconds=settings.interval_seconds,
                                         watch=settings.source == "kubernetes"),
                            elector=elector,
                            # A scaled or new pool wakes the sweep at once (files have no change feed).
                            pool_feed=None if isinstance(pools.pools, DirectoryPools)
                            else cast(ChangeFeed, pools.pools))
    return Pieces(runner, store, monitor, credentials, health, controller, pools)


def run_once(pieces: Pieces) -> int:
    """``--once``: one sweep (and one more to record what the first probe of new instances found);
    0 only when nothing failed."""
    report = pieces.controller.sweep_once()
    if pieces.monitor.probe_now():
        report = pieces.controller.sweep_once()
    for key, why in sorted(report.proxies_failed.items()):
        log.error("Proxy %s: %s", key, why)
    return 0 if report.clean else 1


def serve(settings: Settings, pieces: Pieces, scopes: TokenScopes) -> int:
    """The controller's normal life: health, metrics and discovery over HTTP, and sweeps until a
    SIGTERM or SIGINT."""
    controller = pieces.controller
    token = token_from_env()
    warn_if_no_token(token, log)
    access = DiscoveryAccess(token, scopes, proxy_url(pieces.credentials),
                             Quarantine(pieces.store, controller.discovery))
    server = ControllerHTTPServer(pieces.health, controller.discovery, access,
                                  ServerSettings(quarantine_per_minute=settings.quarantine_per_minute))
    host, port = settings.listen
    server.start(host, port, metrics=settings.metrics_listen)
    log.info("serving health and discovery on %s:%d", host, server.port)
    if settings.metrics_listen is not None:
        log.info("serving metrics on %s:%d", settings.metrics_listen[0], server.metrics_port)
    else:
        log.info("metrics are not served (no --metrics-listen)")

    def stop(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        pieces.runner.cancel()
        controller.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        controller.run()
    finally:
        server.stop()
    return 0


def probe_target_main(argv: list[str]) -> int:
    """``egress-proxies probe-target``: serve what the probes reach through every proxy."""
    parser = argparse.ArgumentParser(
        prog="egress-proxies probe-target",
        description="Serve the probe target: the 204, echo and tunnel endpoints only it can answer the "
                    "controller's probes with (docs/operations.md, 'Running the probe target').")
    parser.add_argument("--listen", type=_listen, action="append", default=None, metavar="HOST:PORT",
                        help="an address to serve plain HTTP on (repeatable; default 0.0.0.0:80 and 0.0.0.0:443, "
                             "443 being where the CONNECT check tunnels to)")
    parser.add_argument("--control-listen", type=_listen, action="append", default=None, metavar="HOST:PORT",
                        help="an address for the controller's direct check alone (repeatable; the provider config's "
                             "probe.controlUrl names it): only --controller-network sources are answered, others "
                             "closed at once, within slots of its own that no flood on --listen reaches")
    parser.add_argument("--key-file", type=Path, required=True,
                        help="the shared key, the same file as the provider config's probe.keyFile")
    _probe_target_limits(parser.add_argument_group("what one client may hold (strangers reach this server too)"))
    parser.add_argument("--log-level", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"], default="INFO")
    args = parser.parse_args(argv)
    if args.control_listen and not args.controller_network:
        parser.error("--control-listen needs --controller-network CIDR (the controller's egress addresses): "
                     "the control listener answers no one else")
    logs.configure(args.log_level, "text")
    try:
        key = proof.read_key(str(args.key_file))
    except (OSError, ValueError) as error:
        log.error("--key-file: %s", error if isinstance(error, ValueError) else error.strerror)
        return 2
    limits = target.Limits(max_connections=args.max_connections, per_source=args.max_per_source,
                           idle_seconds=args.idle_timeout, lifetime_seconds=args.connection_lifetime,
                           controller_networks=tuple(args.controller_network or ()))
    asyncio.run(target.run(key, args.listen or [("0.0.0.0", 80), ("0.0.0.0", 443)], limits,
                           control=args.control_listen or ()))
    return 0


def _probe_target_limits(group: argparse._ArgumentGroup) -> None:
    defaults = target.Limits()
    group.add_argument("--max-connections", type=_positive(int, 1, "a number of connections"),
                       default=defaults.max_connections, help="connections at once, the controller's aside "
                       "(default: %(default)s; each is a file descriptor)")
    group.add_argument("--max-per-source", type=_positive(int, 1, "a number of connections"),
                       default=defaults.per_source,
                       help="connections at once from one address (one /64 for IPv6; default: %(default)s). A probe "
                            "holds two while it runs: raise it when many proxies share one egress address")
    group.add_argument("--idle-timeout", type=_positive(float, 0.1, "a number of seconds"),
                       default=defaults.idle_seconds, metavar="SECONDS",
                       help="a connection sending no complete request for this long is cut (default: %(default)s)")
    group.add_argument("--connection-lifetime", type=_positive(float, 0.1, "a number of seconds"),
                       default=defaults.lifetime_seconds, metavar="SECONDS",
                       help="every connection ends after this long, whatever it sends (default: %(default)s)")
    group.add_argument("--controller-network", type=_network, action="append", default=None, metavar="CIDR",
                       help="the controller's own egress addresses (repeatable): their connections have "
                            f"{defaults.controller_slots} slots of their own and count against no limit above, so "
                            "no flood starves the controller's direct check of this target; the only sources "
                            "--control-listen answers")


def _network(text: str) -> target.Network:
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not a network in CIDR form such as 198.51.100.7/32 ({error})"
                                         ) from None


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] == ["probe-target"]:
        return probe_target_main(arguments[1:])
    settings = parse_args(arguments)
    if settings.check_config:
        # A check leaves nothing behind: its runs go to a directory of their own, not the work dir
        # (the controller's, /var/lib/egress-proxies by default: a person checking a file on
        # another machine has none, or it is root's).
        with tempfile.TemporaryDirectory(prefix="egress-proxies-check-") as scratch:
            return check_files(AnsibleRunner(Path(scratch), timeout_seconds=settings.runner_timeout_seconds,
                                             max_concurrent=settings.max_runners), settings)
    runner = AnsibleRunner(settings.work_dir, timeout_seconds=settings.runner_timeout_seconds,
                           max_concurrent=settings.max_runners, keep_artifacts=settings.keep_artifacts)
    if not settings.provider_config.is_file():
        log.warning("provider config %s does not exist (yet): every sweep fails until it does",
                    settings.provider_config)
    scopes = TokenScopes(settings.discovery_tokens)
    try:
        scopes.check()
    except TokensFileError as error:
        log.error("%s. The controller does not start with it: fix the file (docs/operations.md, \"Discovery "
                  "tokens\")", error)
        return 2
    pieces = build_pieces(settings, runner)
    if pieces is None:
        return 2
    if settings.once:
        return run_once(pieces)
    if settings.until_ready_seconds is not None:
        try:
            return run_until_ready(pieces.controller, pieces.store, settings.until_ready_seconds)
        except StoreError as error:
            log.error("%s", error)
            return 1
    return serve(settings, pieces, scopes)


if __name__ == "__main__":
    sys.exit(main())
