"""The Compute Engine metadata server as a guest sees it, for the instance's external address:
``http://169.254.169.254/computeMetadata/v1/instance/network-interfaces/0/access-configs/0/external-ip``,
answered only with ``Metadata-Flavor: Google`` (403 without it, as the real server refuses such
requests) and 404 for an instance without one ("About VM metadata"). The only path the provider's
startup-script asks.

Run inside the guest's network namespace by :func:`serve_in_shell` (``python3 guest_metadata.py
READY_FILE EXTERNAL_ADDRESS``, ``-`` for none): it listens on 169.254.169.254:80, then creates
READY_FILE.
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

EXTERNAL_IP_PATH = "/computeMetadata/v1/instance/network-interfaces/0/access-configs/0/external-ip"
ADDRESS = "169.254.169.254"


def serve_in_shell(ready: Path, external: str | None) -> str:
    """sh lines for a shell in the guest's network namespace: 169.254.169.254 on its loopback, this
    server in the background (``$metadata`` is its pid, to kill when done), waited for."""
    return (f"ip link set lo up && ip addr replace {ADDRESS}/32 dev lo || exit 1; "
            f"{sys.executable} {Path(__file__)} {ready} {external or '-'} & metadata=$!; "
            f"for _ in $(seq 200); do [ -e {ready} ] && break; /bin/sleep 0.05; done; ")


def main(ready: str, external: str) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            allowed = self.headers.get("Metadata-Flavor") == "Google"
            found = self.path == EXTERNAL_IP_PATH and external != "-"
            body = external.encode() if allowed and found else b"not found" if allowed else b"forbidden"
            self.send_response(403 if not allowed else 200 if found else 404)
            self.send_header("Metadata-Flavor", "Google")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer((ADDRESS, 80), Handler)
    Path(ready).touch()
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
