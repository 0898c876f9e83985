"""The crawler's client as a crawler team takes it (issue 41 row 10): its wheel and sdist, built
by setuptools' PEP 517 hooks from a copy of clients/python (offline: .venv's setuptools, no build
isolation), read back: an Apache-2.0 licence (the collection keeps GPL-3.0-or-later), the
version ``__version__`` says, classifiers, URLs, the ``scrapy`` extra, the files each carries;
and ``pip install ./clients/python``'s build tree is ignored by git.
"""

from __future__ import annotations

import email.parser
import email.policy
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.message import Message
from pathlib import Path

import pytest

from egress_proxies_client import __version__

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "clients" / "python"
MODULES = {"__init__.py", "client.py", "limits.py", "policies.py", "proxy.py", "scrapy_compat.py",
           "scrapy_middleware.py", "transport.py", "version.py", "py.typed"}


def _metadata(text: str) -> Message:
    return email.parser.Parser(policy=email.policy.compat32).parsestr(text)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(wheel, sdist), built from a copy so the checkout gets no build/ or egg-info of its own."""
    source = tmp_path_factory.mktemp("client") / "python"
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    dist = source / "dist"
    # The hooks' answers on a line of their own: setuptools prints its progress on stdout too (and
    # rewrites sys.argv, so the directory is read first).
    script = ("import sys, setuptools.build_meta as hooks; out = sys.argv[1]; sdist = hooks.build_sdist(out); "
              "wheel = hooks.build_wheel(out); print('built', sdist, wheel)")
    done = subprocess.run([sys.executable, "-c", script, str(dist)], cwd=source, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    sdist_name, wheel_name = next(line for line in done.stdout.splitlines() if line.startswith("built ")).split()[1:]
    return dist / wheel_name, dist / sdist_name


def _check_metadata(metadata: Message) -> None:
    assert metadata["Name"] == "egress-proxies-client" and metadata["Version"] == __version__
    assert metadata["License-Expression"] == "Apache-2.0" and metadata.get_all("License-File") == ["LICENSE"]
    assert metadata["Requires-Python"] == ">=3.11"
    classifiers = metadata.get_all("Classifier") or []
    assert {"Framework :: Scrapy", "Typing :: Typed", "Programming Language :: Python :: 3.11"} <= set(classifiers)
    assert not any(c.startswith("License ::") for c in classifiers)  # the expression says it (PEP 639)
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL") or [])
    assert set(urls) == {"Homepage", "Documentation", "Source"}
    assert metadata.get_all("Requires-Dist") == ['Scrapy<3,>=2.13; extra == "scrapy"']
    assert metadata.get_all("Provides-Extra") == ["scrapy"]


def test_the_wheel_carries_the_package_its_licence_and_true_metadata(built: tuple[Path, Path]) -> None:
    wheel, _ = built
    assert wheel.name == f"egress_proxies_client-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        dist_info = f"egress_proxies_client-{__version__}.dist-info"
        _check_metadata(_metadata(archive.read(f"{dist_info}/METADATA").decode()))
        licence = archive.read(f"{dist_info}/licenses/LICENSE").decode()
    assert {name.split("/", 1)[1] for name in names if name.startswith("egress_proxies_client/")} == MODULES
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    assert not [name for name in names if name.startswith("tests/")]


def test_the_sdist_carries_the_sources_its_licence_and_true_metadata(built: tuple[Path, Path]) -> None:
    _, sdist = built
    assert sdist.name == f"egress_proxies_client-{__version__}.tar.gz"
    with tarfile.open(sdist) as archive:
        root = f"egress_proxies_client-{__version__}"
        names = {name.removeprefix(root + "/") for name in archive.getnames()}
        pkg_info = archive.extractfile(f"{root}/PKG-INFO")
        assert pkg_info is not None
        _check_metadata(_metadata(pkg_info.read().decode()))
    assert {"LICENSE", "README.md", "pyproject.toml"} <= names
    assert {f"egress_proxies_client/{module}" for module in MODULES} <= names
    assert not [name for name in names if name.startswith(("build/", "dist/"))]


def test_the_client_is_apache_and_the_collection_stays_gpl() -> None:
    assert (CLIENT / "LICENSE").read_text().split()[:3] == ["Apache", "License", "Version"]
    assert "GNU GENERAL PUBLIC LICENSE" in (REPO / "LICENSE").read_text()
    assert "license:\n  - GPL-3.0-or-later\n" in (REPO / "galaxy.yml").read_text()


def test_pip_installs_build_tree_is_ignored_by_git() -> None:
    """``pip install ./clients/python`` builds in place (setuptools' build/)."""
    ignored = subprocess.run(["git", "check-ignore", "-q", "clients/python/build/lib/egress_proxies_client/proxy.py"],
                             cwd=REPO, check=False)
    assert ignored.returncode == 0
