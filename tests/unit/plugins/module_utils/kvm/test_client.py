"""The libvirt edge: ``kvm/client.py`` is the collection's only importer of libvirt (as
``gcp/client.py`` and ``k8s/client.py`` are of their SDKs), so nothing above it sees a
libvirtError; and the name claims' pure parts (which host is a name's home, what a controller
remembers of claims)."""

from __future__ import annotations

import ast
import shutil
import socket
from pathlib import Path

from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.name_claims import (
    STAMPS,
    ClaimBook,
    home_host,
    owner_of,
)
from ansible_collections.crawl.egress_proxies.plugins.module_utils.kvm.settings import KvmHost

REPO = Path(__file__).resolve().parents[5]


def libvirt_importers(root: Path) -> set[str]:
    """The Python files under ``root`` that import libvirt, relative to ``root``."""
    found = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(name == "libvirt" or name.startswith("libvirt.") for name in names):
                found.add(str(path.relative_to(root)))
    return found


def test_only_the_client_imports_libvirt() -> None:
    assert libvirt_importers(REPO / "plugins") == {"module_utils/kvm/client.py"}


def test_a_second_importer_is_caught(tmp_path: Path) -> None:
    copy = tmp_path / "plugins"
    shutil.copytree(REPO / "plugins", copy)
    instances = copy / "module_utils" / "kvm" / "instances.py"
    instances.write_text(instances.read_text() + "\ntry:\n    from libvirt import libvirtError\nexcept ImportError:\n"
                                                  "    pass\n")
    assert libvirt_importers(copy) == {"module_utils/kvm/client.py", "module_utils/kvm/instances.py"}


def host(name: str, uri: str) -> KvmHost:
    return KvmHost(name=name, uri=uri)


def test_a_names_home_is_the_same_for_every_order_of_the_hosts_and_moves_only_with_its_own_host() -> None:
    hosts = [host(f"h{n}", f"qemu+libssh://root@h{n}/system") for n in range(10)]
    names = [f"p-{n}" for n in range(500)]
    homes = {name: home_host(hosts, name).name for name in names}
    assert homes == {name: home_host(list(reversed(hosts)), name).name for name in names}
    assert len(set(homes.values())) == 10  # spread over every host
    without_h3 = {name: home_host([h for h in hosts if h.name != "h3"], name).name for name in names}
    assert {name for name in names if without_h3[name] != homes[name]} == {n for n in names if homes[n] == "h3"}


def test_entries_sharing_a_hypervisor_keep_their_claims_in_the_first_entrys_pool() -> None:
    uri = "qemu+libssh://root@beelink/system"
    routed, nat = host("routed", uri), host("nat", uri)
    assert {home_host([routed, nat], f"p-{n}").name for n in range(50)} == {"routed"}


def test_the_book_knows_its_owners_stamps_and_when_it_first_saw_anothers(tmp_path: Path) -> None:
    now = [1000.0]
    book = ClaimBook(str(tmp_path / "claims"), "host-a\0/cache", clock=lambda: now[0])
    first, second = book.stamps("p-1")
    assert first != second and all(1 <= stamp <= STAMPS for stamp in (first, second))
    # The same owner after a restart (a new book, nothing on disk) knows them; another owner does not.
    assert ClaimBook(None, "host-a\0/cache").stamps("p-1") == (first, second)
    assert ClaimBook(None, "host-b\0/cache").stamps("p-1") != (first, second)
    assert book.stamps("p-2") != (first, second)
    assert book.is_mine("p-1", first) and book.is_mine("p-1", second)
    assert not any(book.is_mine("p-1", stamp) for stamp in range(1, 2000) if stamp not in (first, second))
    # A leftover carrying one of the two is taken over with the other.
    assert book.stamp_for("p-1") == first
    assert book.stamp_for("p-1", avoid=first) == second and book.stamp_for("p-1", avoid=second) == first
    assert book.waited("p-2", 5) == 0.0
    now[0] += 30
    assert book.waited("p-2", 5) == 30.0
    assert book.waited("p-2", 6) == 0.0  # another stamp: another claim, waited for afresh
    book.forget("p-2")
    assert book.waited("p-2", 5) == 0.0
    assert ClaimBook(None, "host-a\0/cache").waited("p-3", 1) == 0.0


def test_the_owner_is_the_machine_and_where_the_cache_is_not_what_it_holds(tmp_path: Path) -> None:
    assert owner_of(str(tmp_path / "a")) == owner_of(str(tmp_path / "a" / "." ))
    assert owner_of(str(tmp_path / "a")) != owner_of(str(tmp_path / "b"))
    assert owner_of(str(tmp_path / "a")).startswith(socket.gethostname() + "\0")
