"""The built and installed collection, once per session (building and installing take ~2 s)."""

from __future__ import annotations

import pytest

from support.collection.artifact import InstalledCollection, build_artifact, install_artifact


@pytest.fixture(scope="session")
def installed_collection(tmp_path_factory: pytest.TempPathFactory) -> InstalledCollection:
    """The collection tarball, installed offline into a clean collections path."""
    artifact = build_artifact(tmp_path_factory.mktemp("dist"))
    return install_artifact(artifact, tmp_path_factory.mktemp("collections"))
