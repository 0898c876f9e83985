"""The module contract (docs/contract.md), checked from both sides.

The controller and the collection each hold half of the contract: the controller's
``egress_proxies.providers.client`` builds the module calls and parses their results into its own types
(``Instance``, ``Result``, ``Listing``, ``ErrorClass``, ``ProviderType``), the collection's
``module_utils`` produces them. Nothing but this file ties the two halves together:

- every real module runs once, through the controller's runner edge (``AnsibleRunner``) and its
  typed ``ProviderClient`` / ``check_config``, on the suite's test backends (libvirt's test driver
  served by a libvirtd, the Compute REST emulator, the Kubernetes API emulator), and its output is
  read with the controller's own types only;
- every constant that both sides (or the CRD, or docs/contract.md) define is compared: tag names,
  the default port, error-class strings, provider types and module prefixes, providerID schemes,
  the instance dict's fields, module option names, the Proxy's spec fields and phases.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.crawl.egress_proxies.plugins.module_utils import config as module_config
from ansible_collections.crawl.egress_proxies.plugins.module_utils import errors as module_errors
from ansible_collections.crawl.egress_proxies.plugins.module_utils import instance as module_instance
from ansible_collections.crawl.egress_proxies.plugins.module_utils import proxy_module
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm import images as module_images
from ansible_collections.crawl.egress_proxies.plugins.module_utils.provider_id import (
    format_provider_id,
    parse_provider_id,
)
from egress_proxies.providers import runner, transfers
from egress_proxies.providers.client import (
    CONFIG_MODULE,
    ConfigUnreadable,
    CreateRequest,
    Instance,
    ProviderClient,
    ProviderType,
    Target,
    check_config,
)
from egress_proxies.providers.errors import ErrorClass
from egress_proxies.providers.runner import AnsibleRunner
from egress_proxies.resources import proxy as model
from egress_proxies.resources import reasons as reason_names
from egress_proxies.resources.schema import proxy_schema
from egress_proxies.serving.probe import ProbeReason
from support.collection.modules import collections_path
from support.collection.provider_config import OWNER, BaseImage, kvm_host, write_kubeconfig, write_kvm_config
from support.compute.emulator import ComputeEmulator
from support.hosts.libvirt_daemon import LibvirtTestDaemon
from support.kube.emulator import KubeEmulator

REPO = Path(__file__).resolve().parents[2]
MODULES = REPO / "plugins" / "modules"
CONTRACT = REPO / "docs" / "contract.md"
CRD = REPO / "controller" / "manifests" / "crd.yaml"

# The providerID scheme of each provider type. The controller treats providerIDs as opaque, so
# this table is the contract's (docs/contract.md, "providerIDs"); the tests below hold the
# modules, the providerID parser, the CRD and the live results to it.
PROVIDER_ID_SCHEMES = {ProviderType.KVM: "kvm", ProviderType.GCP: "gce", ProviderType.KUBERNETES: "k8s"}

TEST_DRIVER_POOL = "default-pool"
GCP_PROJECT = "test-project"
GCP_ZONE = "europe-west1-b"
K8S_NAMESPACE = "egress"
# One provider of each type in one file: check_config sees all three, each client uses its own.
NAMES = {ProviderType.KVM: "lab", ProviderType.GCP: "cloud", ProviderType.KUBERNETES: "cluster"}


# -- constants both sides define ---------------------------------------------------------------


def test_tag_names_agree() -> None:
    controller = (model.OWNER_TAG, model.PROXY_TAG, model.UID_TAG, model.SPEC_HASH_TAG)
    modules = (module_instance.OWNER_TAG, module_instance.PROXY_TAG, module_instance.UID_TAG,
               module_instance.SPEC_HASH_TAG)
    assert controller == modules
    proxy = model.Proxy(namespace="crawlers", name="eu-1", uid="u-1", spec={"provider": "lab"})
    assert set(model.instance_tags("o", proxy, "h")) == set(modules)


def test_default_port_agrees() -> None:
    crd_default = proxy_schema()["properties"]["spec"]["properties"]["port"]["default"]
    assert model.DEFAULT_PORT == module_instance.DEFAULT_PORT == crd_default
    assert proxy_module.INSTANCE_ARGUMENT_SPEC["port"]["default"] == model.DEFAULT_PORT


def test_error_classes_agree() -> None:
    controller = {e.value for e in ErrorClass}
    assert controller == set(module_errors.ERROR_CLASSES)
    assert (module_errors.NotFound.error_class, module_errors.Permanent.error_class,
            module_errors.Transient.error_class) == (ErrorClass.NOT_FOUND, ErrorClass.PERMANENT,
                                                     ErrorClass.TRANSIENT)
    # Unclassified is transient on both sides, and for the runner reading a failed task.
    assert module_errors.error_class_of(RuntimeError("x")) == ErrorClass.of(None) == ErrorClass.TRANSIENT
    assert ErrorClass.of("bogus") is ErrorClass.TRANSIENT
    assert runner.classify_failure({"error_class": "bogus"}) == runner.classify_failure({}) == "transient"
    for value in controller:
        assert runner.classify_failure({"error_class": value}) == value


def test_image_transfer_events_agree() -> None:
    """Every event kvm_proxy can write into its progress file is one the controller logs, with the
    numbers it carries, and a URL the module redacted is logged as redacted, not withheld."""
    assert (transfers.KINDS, transfers.DIRECTIONS, transfers.MIB, transfers.REDACTED) == (
        module_images.KINDS, module_images.DIRECTIONS, module_images.MIB, module_images.REDACTED)
    secret = "https://user:pw@images.example.test:8443/debian-12.qcow2?X-Goog-Signature=abc"
    redacted = module_images.redact_url(secret)
    assert "pw" not in redacted and "abc" not in redacted
    assert transfers.loggable_url(redacted) == redacted
    for kind in module_images.KINDS:
        for direction in module_images.DIRECTIONS:
            event = module_images.TransferEvent(
                kind=kind, direction=direction, image="debian-12", host=None if direction == "download" else "hv1",
                bytes=3 * module_images.MIB, total=4 * module_images.MIB, seconds=2.0,
                url=redacted if direction == "download" else None)
            described = transfers.describe("lab", event.to_dict())
            assert described is not None, (kind, direction)
            _level, message, field = described
            assert "debian-12" in message and field["event"] == kind and field["direction"] == direction
            if direction == "download" and kind == "start":
                assert redacted in message
    with pytest.raises(ValueError, match="not a transfer event"):
        module_images.TransferEvent(kind="finished", direction="download", image="i", host=None, bytes=0,
                                    total=None, seconds=0.0)


def _main_call(module: str, function: str) -> list[str]:
    """The string arguments of ``function(...)`` in a module file's ``main()``."""
    tree = ast.parse((MODULES / f"{module}.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == function:
            return [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    raise AssertionError(f"plugins/modules/{module}.py does not call {function}")


def test_provider_types_and_module_prefixes_agree() -> None:
    assert [t.value for t in ProviderType] == list(module_config.PROVIDER_TYPES)
    proxy_modules = {p.stem for p in MODULES.glob("*_proxy.py")}
    info_modules = {p.stem for p in MODULES.glob("*_proxy_info.py")}
    assert proxy_modules == {f"{t.module_prefix}_proxy" for t in ProviderType}
    assert info_modules == {f"{t.module_prefix}_proxy_info" for t in ProviderType}
    for provider_type in ProviderType:
        # Each module asks the config for a provider of exactly this type...
        assert _main_call(f"{provider_type.module_prefix}_proxy", "run_proxy_module")[0] == provider_type.value
        assert _main_call(f"{provider_type.module_prefix}_proxy_info", "run_info_module")[0] == provider_type.value
    assert (MODULES / f"{CONFIG_MODULE}.py").is_file()
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    assert f"{galaxy['namespace']}.{galaxy['name']}" == runner.COLLECTION


def test_provider_id_schemes_agree() -> None:
    for provider_type, scheme in PROVIDER_ID_SCHEMES.items():
        # ...and makes and accepts providerIDs of exactly this scheme.
        assert _main_call(f"{provider_type.module_prefix}_proxy", "run_proxy_module")[1] == scheme
        text = format_provider_id(scheme, "loc-1", "p-name", "my-project" if scheme == "gce" else "")
        assert parse_provider_id(text).scheme == scheme
    # The CRD's description of status.providerID names every format (with <placeholders>).
    described = proxy_schema()["properties"]["status"]["properties"]["providerID"]["description"]
    assert re.findall(r"\b([a-z0-9]+)://", described) == ["kvm", "gce", "k8s"]
    assert set(PROVIDER_ID_SCHEMES.values()) == {"kvm", "gce", "k8s"}


def test_instance_shape_and_states_agree() -> None:
    controller_fields = [f.name for f in dataclasses.fields(Instance)]
    # ``exposure`` is optional: in the module's dict only where the provider can tell.
    module_fields = list(module_instance.Instance("p", "n", "l", "running", exposure="LoadBalancer").to_dict())
    assert controller_fields == module_fields
    assert "exposure" not in module_instance.Instance("p", "n", "l", "running").to_dict()
    assert Instance(provider_id="x").state in module_instance.STATES
    running = Instance(provider_id="x", state="running", ip="192.0.2.1", endpoint="192.0.2.1:3128")
    assert running.running and "running" in module_instance.STATES
    # A provider reports an instance running only once it has its endpoint (docs/contract.md).
    assert not dataclasses.replace(running, endpoint=None).running


def test_module_options_agree() -> None:
    client = ProviderClient(runner=None, config_path="/c.yaml", name="lab",  # type: ignore[arg-type]
                            provider_type=ProviderType.KVM)
    assert set(client._common()) == set(proxy_module.COMMON_ARGUMENT_SPEC)
    proxy = model.Proxy(namespace="n", name="p", uid="u", spec={
        "provider": "lab", "location": "h1", "machineType": "small", "image": "debian-12", "port": 8080,
        "cloudInit": "#cloud-config\n"})
    arguments = CreateRequest.for_proxy(proxy, "o", "p-n-p", "h").arguments()
    # The client sends every create and delete as an item of the batch form's ``operations``,
    # and gets by ``provider_ids``; an item takes the single-instance options plus ``key``.
    spec = proxy_module.OPERATION_OPTIONS
    assert set(arguments) | {"key", "provider_id", "state"} <= set(spec)
    assert proxy_module.INSTANCE_ARGUMENT_SPEC["operations"]["options"] is spec
    assert arguments["user_data_encoding"] in spec["user_data_encoding"]["choices"]
    assert {arguments["state"], "absent"} <= set(spec["state"]["choices"])
    assert spec["user_data"]["no_log"] is True  # user-data may carry credentials
    assert {"provider_id", "provider_ids", "tags"} <= set(proxy_module.INFO_ARGUMENT_SPEC)
    # What Result.from_item reads of each item of ``results``.
    failure = proxy_module.item_failure(0, module_errors.Permanent("bad"), "kvm://hosts/h/domains/d", "k")
    assert {"ok", "changed", "instance", "provider_id", "key", "error_class", "msg"} <= set(failure)
    assert (failure["ok"], failure["error_class"]) == (False, ErrorClass.PERMANENT)


def test_proxy_resource_agrees_with_the_crd() -> None:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    assert (crd["spec"]["group"], version["name"], crd["spec"]["names"]["kind"], crd["spec"]["names"]["plural"]) == (
        model.GROUP, model.VERSION, model.KIND, model.PLURAL)
    schema = proxy_schema()
    spec = set(schema["properties"]["spec"]["properties"])
    # Every field that shapes the instance (a change replaces it) is in the schema; the only others
    # are the ones that do not touch the instance (``probe``: checks run from the controller).
    assert set(model.SPEC_FIELDS) <= spec and spec - set(model.SPEC_FIELDS) <= {"probe"}
    assert schema["properties"]["status"]["properties"]["phase"]["enum"] == [
        model.PHASE_PENDING, model.PHASE_PROVISIONING, model.PHASE_READY, model.PHASE_QUARANTINED,
        model.PHASE_DELETING, model.PHASE_FAILED]


CONTROLLER = REPO / "controller" / "egress_proxies"
# Writers of reasons: ProxyWriter.failed(proxy, error, REASON) / invalid(proxy, REASON, message) /
# status(proxy, phase, ready, REASON, message), record_event(proxy, type, REASON, message),
# PoolStore.record_pool_event(pool, type, REASON, message).
_REASON_ARG = {"failed": 2, "invalid": 1, "status": 3, "record_event": 2, "record_pool_event": 2}


def _named(node: ast.expr, literals: bool) -> set[str]:
    """The reason a name of ``resources.reasons`` stands for (``reasons.CREATE_FAILED``); with
    ``literals``, a string literal too."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "reasons":
        return {getattr(reason_names, node.attr)}
    if literals and isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    return set()


def _constants(tree: ast.Module, literals: bool) -> dict[str, set[str]]:
    """A module's top-level string constants (``LOST_REASONS = (reasons.INSTANCE_STOPPED, ...)``,
    ``X = reasons.Y``; with ``literals``, ``X = "Y"`` too), tuples of them."""
    found: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            strings = [_named(v, literals) for v in values]
            if values and all(strings):
                found[node.targets[0].id] = set().union(*strings)
    return found


def _reason_argument(call: ast.Call) -> ast.expr | None:
    """The reason argument of a call to one of those writers, direct or through ``partial``."""
    function, args = call.func, call.args
    if isinstance(function, ast.Name) and function.id == "partial" and args:
        function, args = args[0], args[1:]
    if isinstance(function, ast.Attribute) and function.attr in _REASON_ARG and len(args) > _REASON_ARG[
            function.attr]:
        return args[_REASON_ARG[function.attr]]
    return None


def _strings_of(constants: dict[str, set[str]], literals: bool, node: ast.AST) -> set[str]:
    """The strings an expression can be: a reason's name (a literal too with ``literals``), a module
    constant, either branch of ``a if c else b``."""
    named = _named(node, literals) if isinstance(node, ast.expr) else set()
    if named:
        return named
    if isinstance(node, ast.Name):
        return constants.get(node.id, set())
    if isinstance(node, ast.Subscript):  # LOST_REASONS[0]: any of them
        return _strings_of(constants, literals, node.value)
    if isinstance(node, ast.IfExp):
        return _strings_of(constants, literals, node.body) | _strings_of(constants, literals, node.orelse)
    if isinstance(node, ast.BoolOp):
        return set().union(*(_strings_of(constants, literals, v) for v in node.values))
    return set()


def _reasons_written(literals: bool = True) -> set[str]:
    """Every condition reason and Event reason the controller's sweep writes, read from its source;
    without ``literals``, only those it writes by a name of ``resources.reasons``."""
    reasons: set[str] = set()
    for path in CONTROLLER.rglob("*.py"):
        tree = ast.parse(path.read_text())
        _strings = partial(_strings_of, _constants(tree, literals), literals)
        _status = partial(_strings_of, _constants(tree, True), True)  # "True", "False", "Unknown"
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                argument = _reason_argument(node)
                if argument is not None:
                    reasons.update(_strings(argument))
            elif isinstance(node, ast.Tuple) and len(node.elts) == 3 and _status(node.elts[0]) in (
                    {"True"}, {"False"}, {"Unknown"}):  # other conditions: (status, reason, message)
                reasons.update(_strings(node.elts[1]))
            elif isinstance(node, ast.Assign):  # reason = "X", or phase, ready, reason = ..., ..., "X"
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id == "reason":
                        reasons.update(_strings(node.value))
                    elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                        reasons.update(*(_strings(v) for t, v in zip(target.elts, node.value.elts, strict=False)
                                         if isinstance(t, ast.Name) and t.id == "reason"))
    return {r for r in reasons if re.fullmatch(r"[A-Z][A-Za-z]+", r)}


def test_the_controller_writes_every_reason_by_its_name() -> None:
    """A reason is named once, in resources/reasons.py: the controller writes none as a literal."""
    named = _reasons_written(literals=False)
    assert {"CreateFailed", "Quarantined", "InstanceLost", "MembersCreated"} <= named  # the reader finds them
    assert _reasons_written() - named == set()


def test_the_contract_document_names_what_the_code_uses() -> None:
    """docs/contract.md is the contract: whatever a user can see the code use, it documents."""
    text = CONTRACT.read_text()
    reasons = _reasons_written()
    # The reader itself must find the writes it is meant to (else this test could pass on nothing).
    assert {"CreateFailed", "DeleteFailed", "ListFailed", "InvalidSpec", "SourceDefect", "InternalError",
            "ProviderConfigInvalid", "ProviderNotConfigured", "InstanceRunning", "Provisioning", "Created",
            "Replacing", "InstanceLost", "Replaced", "Deleted", "Abandoned", "GarbageCollected"} <= reasons
    documented = {
        "reason": reasons,
        "error class": {e.value for e in ErrorClass},
        "tag": {v for k, v in vars(model).items() if k.endswith("_TAG")},
        "annotation or finalizer": {model.FINALIZER} | {v for k, v in vars(model).items() if k.endswith("_ANNOTATION")},
        "Serving reason of a probe": {r.value for r in ProbeReason},
        "provider type": {t.value for t in ProviderType},
        "module": {f"{t.module_prefix}_proxy" for t in ProviderType} | {CONFIG_MODULE},
        "providerID scheme": {f"{s}://" for s in PROVIDER_ID_SCHEMES.values()},
        "phase": {model.PHASE_PENDING, model.PHASE_PROVISIONING, model.PHASE_READY, model.PHASE_QUARANTINED,
                  model.PHASE_DELETING, model.PHASE_FAILED},
        "state": set(module_instance.STATES),
        "spec field": set(proxy_schema()["properties"]["spec"]["properties"]),
        "status field": set(proxy_schema()["properties"]["status"]["properties"]),
    }
    def named(value: str) -> bool:  # at the start of a code span: `ListFailed`, `kvm://hosts/...`
        return re.search("`" + re.escape(value) + ("" if value.endswith("://") else r"(?![\w-])"), text) is not None

    missing = {what: sorted(v for v in values if not named(v)) for what, values in documented.items()}
    assert {what: names for what, names in missing.items() if names} == {}


# -- every module once, through the controller's types -------------------------------------------


@dataclass
class Backend:
    """One provider of the combined config, with what the test plays where its backend has no one
    to do it (a kubelet) and the Proxy spec that fits it."""

    provider_type: ProviderType
    location: str
    spec: dict[str, Any]
    start: Callable[[Instance], object] = lambda _: None
    settle: Callable[[], None] = lambda: None

    @property
    def name(self) -> str:
        return NAMES[self.provider_type]


@dataclass
class Backends:
    config: Path
    runner: AnsibleRunner
    kvm: Backend
    gcp: Backend
    kubernetes: Backend

    def of(self, provider_type: ProviderType) -> Backend:
        return {ProviderType.KVM: self.kvm, ProviderType.GCP: self.gcp,
                ProviderType.KUBERNETES: self.kubernetes}[provider_type]


def gcp_section(endpoint: str, **overrides: Any) -> dict[str, Any]:
    gcp = {"project": GCP_PROJECT, "zones": [GCP_ZONE], "machineTypes": {"small": "e2-small"},
           "images": {"debian-12": "projects/debian-cloud/global/images/family/debian-12"},
           "apiEndpoint": endpoint, **overrides}
    return {"name": NAMES[ProviderType.GCP], "type": "gcp", "allowedSources": ["198.51.100.0/24"], "gcp": gcp}


@pytest.fixture
def backends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, libvirt_test: LibvirtTestDaemon, image: BaseImage,
             kube: KubeEmulator) -> Iterator[Backends]:
    # The KVM module caches base images here (the controller's image sets the same variable).
    monkeypatch.setenv("EGRESS_PROXIES_CACHE_DIR", str(tmp_path / "image-cache"))
    kube.create_namespace(K8S_NAMESPACE)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url)
    with ComputeEmulator(project=GCP_PROJECT, zones=(GCP_ZONE,)) as compute:
        kubernetes = {"name": NAMES[ProviderType.KUBERNETES], "type": "kubernetes",
                      "kubernetes": {"namespace": K8S_NAMESPACE, "image": "ubuntu/squid:6.6-24.04_beta",
                                     "kubeconfig": str(kubeconfig)}}
        config = write_kvm_config(tmp_path / "providers.yaml",
                                  [kvm_host("h1", libvirt_test.uri, pool=TEST_DRIVER_POOL)], image,
                                  extra_providers=[gcp_section(compute.endpoint), kubernetes])
        cloud_init = {"cloudInit": "#cloud-config\npackages: [squid]\n"}
        yield Backends(
            config=config,
            runner=AnsibleRunner(tmp_path / "work", timeout_seconds=300, max_concurrent=2,
                                 collections_path=collections_path()),
            kvm=Backend(ProviderType.KVM, "h1", {"location": "h1", "machineType": "small", "image": "debian-12",
                                                 **cloud_init}),
            gcp=Backend(ProviderType.GCP, GCP_ZONE, {"location": GCP_ZONE, "machineType": "small",
                                                     "image": "debian-12", **cloud_init}),
            # A Pod has no cloud-init (docs/kubernetes-provider.md); the emulator has no kubelet,
            # so the test reports the Pod running, and lets its deletion grace period pass.
            kubernetes=Backend(ProviderType.KUBERNETES, K8S_NAMESPACE, {"location": K8S_NAMESPACE, "port": 8080},
                               start=lambda i: kube.kubelet_run(K8S_NAMESPACE, i.name, pod_ip="10.244.1.7"),
                               settle=lambda: kube.advance(30)),
        )


def test_check_config_reads_the_collections_validator(backends: Backends, tmp_path: Path) -> None:
    providers = check_config(backends.runner, str(backends.config))
    assert providers.valid and providers.errors == ()
    assert providers.owner == OWNER
    assert dict(providers.types) == {NAMES[t]: t for t in ProviderType}
    assert set(providers.clients(backends.runner)) == set(NAMES.values())

    # A broken section makes only its provider unusable, with the validator's field paths.
    document = yaml.safe_load(backends.config.read_text())
    document["providers"][1]["gcp"].pop("project")
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(document))
    partly = check_config(backends.runner, str(broken))
    assert not partly.valid and set(partly.invalid) == {NAMES[ProviderType.GCP]}
    assert any(e.startswith("providers[1].gcp.project:") for e in partly.invalid[NAMES[ProviderType.GCP]])
    assert set(partly.clients(backends.runner)) == {NAMES[ProviderType.KVM], NAMES[ProviderType.KUBERNETES]}

    # A root error (no owner) leaves nothing usable.
    document.pop("owner")
    broken.write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigUnreadable, match="owner"):
        check_config(backends.runner, str(broken))


@pytest.mark.parametrize("provider_type", list(ProviderType), ids=lambda t: t.value)
def test_every_verb_parses_into_the_controllers_types(backends: Backends, provider_type: ProviderType) -> None:
    backend = backends.of(provider_type)
    # As ProviderSet.clients makes it (test_check_config_reads_the_collections_validator proves that).
    client = ProviderClient(backends.runner, str(backends.config), backend.name, provider_type)
    scheme = PROVIDER_ID_SCHEMES[provider_type]
    proxy = model.Proxy(namespace="crawlers", name="eu-1", uid=str(uuid.uuid4()),
                        spec={"provider": backend.name, **backend.spec})
    desired = model.spec_hash(proxy.spec)
    request = CreateRequest.for_proxy(proxy, OWNER, model.instance_name(proxy, desired), desired)

    # One batch, in order: the create, then the same create again (idempotent by name).
    created, again = client.create([request, request])
    assert created.ok and created.changed, created.error
    instance = created.instance
    assert isinstance(instance, Instance)
    parsed = parse_provider_id(instance.provider_id, scheme)
    assert (parsed.location, parsed.name) == (backend.location, request.name)
    assert (instance.name, instance.location) == (request.name, backend.location)
    assert instance.state in module_instance.STATES and instance.created
    assert dict(instance.tags) == dict(request.tags)
    assert (instance.owner, instance.proxy_key, instance.uid, instance.spec_hash) == (
        OWNER, proxy.key, proxy.uid, desired)
    assert again.ok and not again.changed and again.instance is not None
    assert again.instance.provider_id == instance.provider_id

    backend.start(instance)
    listing = client.list_instances(OWNER)
    assert listing.complete, listing.error
    (listed,) = listing.of(proxy.uid)
    assert listed.provider_id == instance.provider_id and listed.running and listed.spec_hash == desired
    # Every provider hands out the endpoint a crawler dials (these three: the instance's address and port).
    assert listed.endpoint == f"{listed.ip}:{proxy.port}", listed

    # One batch, three answers: found, not_found (a name nobody made), permanent (another scheme).
    other = next(s for s in PROVIDER_ID_SCHEMES.values() if s != scheme)
    missing = format_provider_id(scheme, backend.location, "p-nobody-000000", GCP_PROJECT if scheme == "gce" else "")
    foreign = format_provider_id(other, "loc-1", "p-x", GCP_PROJECT if other == "gce" else "")
    got, absent, refused = client.get([Target(proxy.uid, instance.provider_id), Target("k2", missing),
                                       Target("k3", foreign)])
    assert got.ok and got.instance == listed
    assert absent.error is not None and absent.error.error_class is ErrorClass.NOT_FOUND, absent
    assert refused.error is not None and refused.error.error_class is ErrorClass.PERMANENT, refused
    assert f"{other}://" in refused.error.message

    # One batch: the delete, then the same delete again (already gone: success, unchanged).
    deleted, deleted_again = client.delete([Target(proxy.uid, instance.provider_id)] * 2)
    assert deleted.ok and deleted.changed, deleted.error
    assert deleted_again.ok and not deleted_again.changed, deleted_again.error
    backend.settle()
    after = client.list_instances(OWNER)
    assert after.complete and after.of(proxy.uid) == []


def test_a_partial_listing_is_incomplete_and_keeps_what_was_seen(backends: Backends, tmp_path: Path) -> None:
    """A location that cannot be listed fails the listing (so nothing is garbage-collected on a
    partial view), and the controller still gets the instances of the reachable locations."""
    client = ProviderClient(backends.runner, str(backends.config), backends.kvm.name, ProviderType.KVM)
    proxy = model.Proxy(namespace="crawlers", name="eu-2", uid=str(uuid.uuid4()),
                        spec={"provider": backends.kvm.name, **backends.kvm.spec})
    desired = model.spec_hash(proxy.spec)
    (created,) = client.create([CreateRequest.for_proxy(proxy, OWNER, model.instance_name(proxy, desired),
                                                        desired)])
    assert created.ok and created.instance is not None, created.error

    # The same provider with a second host whose libvirtd is not there.
    document = yaml.safe_load(backends.config.read_text())
    document["providers"][0]["kvm"]["hosts"].append(
        kvm_host("h2", f"test+unix:///default?socket={tmp_path}/absent/libvirt-sock", pool=TEST_DRIVER_POOL))
    two_hosts = tmp_path / "two-hosts.yaml"
    two_hosts.write_text(yaml.safe_dump(document))
    partial = ProviderClient(backends.runner, str(two_hosts), backends.kvm.name, ProviderType.KVM)
    listing = partial.list_instances(OWNER)
    assert not listing.complete and listing.error is not None
    assert listing.error.error_class is ErrorClass.TRANSIENT  # a host down may come back
    assert "h2" in listing.error.message
    assert [i.provider_id for i in listing.of(proxy.uid)] == [created.instance.provider_id]
