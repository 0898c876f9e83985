"""providers/errors.py: the controller's one definition of the contract's error classes."""

from __future__ import annotations

import pytest

from egress_proxies.providers.errors import ErrorClass, ProviderError


@pytest.mark.parametrize(("value", "expected"), [
    ("not_found", ErrorClass.NOT_FOUND), ("permanent", ErrorClass.PERMANENT), ("transient", ErrorClass.TRANSIENT),
    (ErrorClass.PERMANENT, ErrorClass.PERMANENT), (None, ErrorClass.TRANSIENT), ("", ErrorClass.TRANSIENT),
    ("bogus", ErrorClass.TRANSIENT), (3, ErrorClass.TRANSIENT),
])
def test_anything_unclassified_is_transient(value: object, expected: ErrorClass) -> None:
    assert ErrorClass.of(value) is expected


def test_a_provider_error_reads_class_first() -> None:
    assert str(ProviderError(ErrorClass.PERMANENT, "zone gone")) == "permanent: zone gone"
