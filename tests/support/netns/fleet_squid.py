"""A squid in a test's network namespace with the fleet's own generated access policy
(squid_access.render_policy, as every provider delivers it), for the crawler's tests: credentials
required, the operator's refused ports and destinations, the fleet's error pages and the marker
of its own errors (``OWN_ERROR_HEADER``).

    with FleetSquid(ns, {"crawl-crawlers": PASSWORD}, allowed_destinations=[ns.network]) as squid:
        ...  # a proxy at squid.address:3128 refusing what an instance refuses

The policy's files live in the squid's private directory: the password file (SHA-512 crypt),
the own addresses (the squid's address) and the error pages (``ERROR_PAGE`` in every template).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence

from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import (
    DIR_LISTING_PAGE,
    DIR_LISTING_TEMPLATE,
    ERROR_PAGE,
    ERROR_TEMPLATES,
    PolicyPaths,
    parse_access,
    render_policy,
)
from support.netns.namespace import NetworkNamespace
from support.netns.squid import SQUID_USER, Squid, write_password_file


class FleetSquid(Squid):
    """``Squid`` whose configuration is the policy for ``users`` (name -> password) and
    ``allowed_destinations`` around nothing (no distribution configuration: the policy alone
    decides), on ``address`` (a new one of the namespace's by default)."""

    def __init__(self, netns: NetworkNamespace, users: Mapping[str, str], *,
                 allowed_destinations: Sequence[str] = (), name: str = "fleet-squid", address: str | None = None,
                 extra: str = "") -> None:
        address = address or netns.add_address()
        # Each instance fetches from its own address, as each proxy of the fleet has its own.
        super().__init__(netns, "", address=address, name=name, extra=f"tcp_outgoing_address {address}\n" + extra)
        self.users = dict(users)
        self.allowed_destinations = list(allowed_destinations)

    def start(self) -> None:
        self.directory.mkdir(exist_ok=True)
        passwords = write_password_file(self.directory / "passwd", self.users)
        hashes = [line.split(":", 1) for line in passwords.read_text().splitlines()]
        access = parse_access({"users": [{"name": user, "password_hash": hashed} for user, hashed in hashes],
                               "allowed_destinations": self.allowed_destinations})
        assert access is not None
        errors = self.directory / "errors"
        errors.mkdir(exist_ok=True)
        for template in ERROR_TEMPLATES:
            (errors / template).write_text(ERROR_PAGE)
        (errors / DIR_LISTING_TEMPLATE).write_text(DIR_LISTING_PAGE)
        own = self.directory / "own-addresses"
        own.write_text(f"{self.address}\n")
        for path in (errors, own):
            shutil.chown(path, SQUID_USER, SQUID_USER)
        self.config = render_policy(access, PolicyPaths(password_file=str(passwords), own_addresses=str(own),
                                                         error_directory=str(errors))).around("")
        super().start()
