"""Ask a bridge's DHCP server what it offers a MAC address, as a guest with that MAC would ask.

A guest's first network act is a DHCPDISCOVER from its MAC; what the network's dnsmasq offers
then is what the guest gets. :func:`dhcp_offer` asks without booting anything: a network
namespace of its own, joined to the bridge by a veth pair whose far end carries the MAC, sends a
real DHCPDISCOVER (broadcast flag set, so the offer comes back as a broadcast) and reads the
DHCPOFFER. Nothing is leased (no DHCPREQUEST follows); namespace and veth pair are removed
afterwards. Everything stays on the bridge, inside the caller's namespaces.
"""

from __future__ import annotations

import secrets
import subprocess
import sys

# Runs inside the client's namespace: argv = MAC, seconds to wait. Prints the offered address, or
# nothing when no offer came.
_DISCOVER = r"""
import os, socket, sys, time
mac, seconds = bytes.fromhex(sys.argv[1].replace(":", "")), float(sys.argv[2])
xid = os.urandom(4)
packet = (bytes([1, 1, 6, 0]) + xid + b"\0\0" + b"\x80\0" + b"\0" * 16 + mac + b"\0" * 10 + b"\0" * 192
          + bytes([99, 130, 83, 99]) + bytes([53, 1, 1, 55, 2, 1, 3, 255]))
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"eth0")
sock.bind(("0.0.0.0", 68))
deadline = time.monotonic() + seconds
sent = 0.0
while time.monotonic() < deadline:
    if time.monotonic() - sent > 1:  # resent every second, as a client does (the first may be lost)
        sock.sendto(packet, ("255.255.255.255", 67))
        sent = time.monotonic()
    sock.settimeout(max(0.05, min(1.0, deadline - time.monotonic())))
    try:
        reply = sock.recv(2048)
    except socket.timeout:
        continue
    options = reply[240:]
    offer = False
    while options and options[0] != 255:
        if options[0] == 0:
            options = options[1:]
            continue
        if options[0] == 53 and options[2] == 2:
            offer = True
        options = options[2 + options[1]:]
    if reply[0] == 2 and reply[4:8] == xid and reply[28:34] == mac and offer:
        print(socket.inet_ntoa(reply[16:20]))
        break
"""


def dhcp_offer(namespace: str, bridge: str, mac: str, timeout: float = 10.0) -> str | None:
    """The address the DHCP server on ``bridge`` (a bridge in network namespace ``namespace``)
    offers a client with ``mac``; None when no offer comes within ``timeout`` seconds."""
    tag = secrets.token_hex(3)
    client, near = f"egp-dhcp-{tag}", f"egpdh{tag}"
    subprocess.run(["ip", "netns", "add", client], check=True, capture_output=True)
    try:
        for command in (["ip", "-n", namespace, "link", "add", near, "type", "veth", "peer", "name", "eth0",
                         "netns", client],
                        ["ip", "-n", client, "link", "set", "eth0", "address", mac],
                        ["ip", "-n", client, "link", "set", "eth0", "up"],
                        ["ip", "-n", namespace, "link", "set", near, "master", bridge, "up"]):
            subprocess.run(command, check=True, capture_output=True)
        asked = subprocess.run(["ip", "netns", "exec", client, sys.executable, "-c", _DISCOVER, mac, str(timeout)],
                               capture_output=True, text=True, check=True, timeout=timeout + 30)
        return asked.stdout.strip() or None
    finally:
        # Deleting the namespace deletes its veth end, and with it the bridge's.
        subprocess.run(["ip", "netns", "del", client], check=False, capture_output=True)
