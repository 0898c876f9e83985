"""docs/architecture.md names every module of the controller and of the collection's plugins, so a
newcomer finds each file's job in one place: a module added without its row fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARCHITECTURE = REPO / "docs" / "architecture.md"
# (where the modules live, how the document writes their paths: relative to this folder)
PACKAGES = (
    REPO / "controller" / "egress_proxies",
    REPO / "plugins" / "module_utils",
    REPO / "plugins" / "modules",
    REPO / "plugins" / "doc_fragments",
)
CODE_SPAN = re.compile(r"`([^`\s]+)`")


def modules() -> list[tuple[Path, str]]:
    found = []
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            if path.name != "__init__.py" and "__pycache__" not in path.parts:
                found.append((package, path.relative_to(package).as_posix()))
    return found


def named(relative: str, lines: list[str]) -> bool:
    """Written whole (`sweep/live.py`, `plugins/modules/kvm_proxy.py`), or as a sibling in a row that names its folder
    (`kvm/instances.py`, `images.py`): the document's way of listing a folder's files."""
    folder, _, name = relative.rpartition("/")
    for line in lines:
        spans = CODE_SPAN.findall(line)
        if relative in spans or any(span.endswith(f"/{relative}") for span in spans):
            return True
        if not folder and name in spans:
            return True
        if folder and name in spans and any(span.startswith(f"{folder}/") for span in spans):
            return True
    return False


def test_the_reader_finds_rows_and_modules() -> None:
    lines = ARCHITECTURE.read_text(encoding="utf-8").splitlines()
    assert len(modules()) > 60
    assert named("sweep/live.py", lines)
    assert not named("sweep/no_such_module.py", lines)


@pytest.mark.parametrize(("package", "relative"), modules(), ids=lambda value: str(value).rsplit("/", 1)[-1])
def test_every_module_has_its_row(package: Path, relative: str) -> None:
    lines = ARCHITECTURE.read_text(encoding="utf-8").splitlines()
    assert named(relative, lines), (
        f"{package.relative_to(REPO)}/{relative} is not named in docs/architecture.md: add it to the "
        "table of its half (what it owns), as `folder/file.py` or beside its folder's other files")
