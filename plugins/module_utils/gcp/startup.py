# -*- coding: utf-8 -*-
# Copyright: (c) 2026, egress-proxies developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``startup-script`` every GCP proxy instance gets: squid where the image lacks it, then the access policy.

Google's guest agent runs the metadata item ``startup-script`` as root on every boot, on every
public image ("All public Compute Engine images come with the guest environment preinstalled",
About startup scripts). ``user-data`` is read only where cloud-init is installed, and Debian's
GCE images have none (debian-cloud-images, ``config_space/bookworm/package_config/GCE``:
google-guest-agent and oslogin only), so a Proxy's ``cloudInit`` that installs squid does
nothing on the docs' default image. Hence the script, in this order:

1. where cloud-init exists (Ubuntu's GCE images), wait for it to finish (``cloud-init status
   --wait``, the workaround Ubuntu gives for startup scripts racing cloud-init in
   GoogleCloudPlatform/guest-agent#84): the user-data may install and configure squid itself;
2. if squid is still missing, install it with the image's package manager (apt-get, else dnf),
   waiting for the package lock that unattended upgrades may hold on a first boot, retrying a
   failed download; a squid installed here also gets ``http_port <port>`` when the Proxy's port
   is not squid's default 3128 (a squid the user's cloud-init installed is configured by it).
   Until step 3 it runs the package's own configuration, which serves localhost only;
3. the access policy (``squid_install.install_script``), after the package: its password file
   belongs to squid's group, which the package creates, and squid is restarted onto the policy;
4. with a policy, the instance's external address added to the addresses squid never connects to
   (issue 38): a one-to-one NAT at Google's edge is on none of the instance's interfaces, so the
   policy's own-address list (read from them) misses it, and a request to it would leave the VM
   and come back to its own services through the edge. The metadata server knows it
   (``instance/network-interfaces/0/access-configs/0/external-ip``, with ``Metadata-Flavor:
   Google``); it is asked on every boot, since an ephemeral address changes across a stop.

Idempotent: on a later boot squid is there and only the policy is written again.
"""

from __future__ import annotations

from typing import Optional

from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_access import Access
from ansible_collections.crawl.egress_proxies.plugins.module_utils.squid_install import OWN_ADDRESSES, install_script

SQUID_DEFAULT_PORT = 3128
# Read by Debian's stock squid.conf through its include of conf.d/*.conf.
PORT_DROPIN_PATH = "/etc/squid/conf.d/00-egress-proxies-port.conf"
APT_LOCK_TIMEOUT_SECONDS = 600
INSTALL_TRIES = 5

_INSTALL_SQUID = """\
# -- squid: installed when the image has none (after cloud-init, where there is one) ----------
# The guest agent's PATH may lack the sbin directories; the caller's entries stay first.
PATH="$PATH:/usr/sbin:/sbin"
say() {{ printf 'egress-proxies squid: %s\\n' "$*"; }}
if command -v cloud-init >/dev/null 2>&1; then
    say "waiting for cloud-init to finish (the user-data may install squid)"
    cloud-init status --wait >/dev/null 2>&1 || say "cloud-init reported an error; going on"
fi
if command -v squid >/dev/null 2>&1; then
    say "squid is installed"
else
    if [ {port} -ne {default_port} ]; then
        mkdir -p /etc/squid/conf.d && printf 'http_port {port}\\n' > {port_dropin} ||
            {{ say "FAILED: cannot write {port_dropin}"; exit 1; }}
    fi
    tries=0
    until
        if command -v apt-get >/dev/null 2>&1; then
            DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout={lock_timeout} update &&
                DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout={lock_timeout} install squid
        elif command -v dnf >/dev/null 2>&1; then
            dnf -q -y install squid
        else
            say "FAILED: the image has neither squid nor apt-get or dnf to install it with"; exit 1
        fi
    do
        tries=$((tries + 1))
        [ "$tries" -ge {tries} ] && {{ say "FAILED: installing squid ($tries tries)"; exit 1; }}
        say "installing squid failed; trying again in 15 s"
        sleep 15
    done
    say "installed squid"
    if command -v systemctl >/dev/null 2>&1; then
        systemctl enable --now squid >/dev/null 2>&1 && say "squid enabled and started" ||
            say "FAILED: systemctl enable --now squid"
    fi
fi
"""


# Where the guest asks for its external address (Compute Engine metadata server, "About VM
# metadata": http://metadata.google.internal/computeMetadata/v1/ = 169.254.169.254; the header
# Metadata-Flavor: Google is required). Empty or 404 without an external address.
METADATA_EXTERNAL_IP = ("http://169.254.169.254/computeMetadata/v1/instance/network-interfaces/0/access-configs/0/"
                        "external-ip")

_REFUSE_EXTERNAL = """\
# -- this instance's external address: never a destination, like its own addresses --------------
external=$(curl -fsS -m 5 -H 'Metadata-Flavor: Google' {url} 2>/dev/null ||
    wget -q -T 5 -O - --header='Metadata-Flavor: Google' {url} 2>/dev/null)
case $external in
''|*[!0-9.]*) say "no external address to refuse (externalIP: false, or the metadata server did not answer)";;
*)  if grep -qx "$external" {own} 2>/dev/null; then
        say "external address $external already refused"
    elif printf '%s\\n' "$external" >> {own}; then
        say "refusing this instance's external address $external"
        command -v systemctl >/dev/null 2>&1 && systemctl try-reload-or-restart squid
    else
        say "FAILED: cannot add the external address to {own}"; exit 1
    fi;;
esac
"""


def startup_script(access: Optional[Access], port: int) -> str:
    """The instance's ``startup-script`` (see the module docstring)."""
    header = ("#!/bin/sh\n"
              "# crawl.egress_proxies: the GCE startup-script (docs/gcp-provider.md, \"What runs on the instance\").\n"
              "# Run as root by the guest agent on every boot: squid if the image lacks it, then the access policy.\n")
    policy = ""
    if access is not None:
        body = install_script(access).decode("ascii")
        policy = body.split("\n", 1)[1] if body.startswith("#!") else body
        policy += _REFUSE_EXTERNAL.format(url=METADATA_EXTERNAL_IP, own=OWN_ADDRESSES)
    return header + _INSTALL_SQUID.format(
        port=int(port), default_port=SQUID_DEFAULT_PORT, port_dropin=PORT_DROPIN_PATH,
        lock_timeout=APT_LOCK_TIMEOUT_SECONDS, tries=INSTALL_TRIES) + policy
