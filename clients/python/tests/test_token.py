"""The token is checked before anything is sent (issue 38 row 8): a token with whitespace or a
control character is refused naming the argument, never showing the value, and a token about to
travel in clear to another machine is warned about."""

from __future__ import annotations

import logging

import pytest

from egress_proxies_client import ProxyClient
from egress_proxies_client.transport import Controller, check_token, is_loopback

SECRET = "s3cret-team-token"


@pytest.mark.parametrize("token", [f"{SECRET}\n", f"{SECRET[:6]}\n{SECRET[6:]}", f"{SECRET[:6]} {SECRET[6:]}",
                                   f"{SECRET}\r", f"{SECRET[:6]}\x00{SECRET[6:]}", f"\t{SECRET}",
                                   f"{SECRET[:6]}\x7f{SECRET[6:]}", f"{SECRET[:6]}\u2028{SECRET[6:]}"])
def test_a_token_with_whitespace_or_a_control_character_is_refused_without_its_value(token: str) -> None:
    with pytest.raises(ValueError, match=r"^token: contains whitespace or a control character") as caught:
        ProxyClient("http://127.0.0.1:9", token)
    assert SECRET[:6] not in str(caught.value) and SECRET[6:] not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__context__ is None


def test_an_empty_token_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^token: empty"):
        check_token("")


@pytest.mark.parametrize(("url", "warned"), [
    ("http://egress-proxies.egress-proxies.svc:8080", True),
    ("http://10.0.0.7:8080", True),
    ("https://egress-proxies.example:8443", False),
    ("http://127.0.0.1:8080", False),
    ("http://127.8.9.1:8080", False),
    ("http://localhost:8080", False),
    ("http://[::1]:8080", False),
])
def test_plain_http_to_another_machine_is_warned_about(url: str, warned: bool,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="egress_proxies_client"):
        Controller(url, SECRET, timeout=1)
    warnings = [r.getMessage() for r in caplog.records if "travels unencrypted" in r.getMessage()]
    assert bool(warnings) == warned, caplog.text
    assert SECRET not in caplog.text


def test_loopback_is_this_machine_only() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("LOCALHOST")
    assert not is_loopback("10.0.0.1") and not is_loopback("localhost.example.com") and not is_loopback("0.0.0.0")
