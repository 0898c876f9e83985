"""The crawlers' target in the real-guest tests and the demo: a web server that answers every GET
with 204 (``/ip``: the caller's address, for the probe's egress echo), on every port given (one is
the CONNECT target). Run as ``python -c NO_CONTENT_SERVER PORT...`` inside the host's network
namespace, where guests reach it on their network's bridge address (they have no other way out).
"""

NO_CONTENT_SERVER = """\
import http.server, sys, threading
class NoContent(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/ip":
            body = self.client_address[0].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(204)
        self.end_headers()
    def log_message(self, *args):
        pass
servers = [http.server.ThreadingHTTPServer(("0.0.0.0", int(port)), NoContent) for port in sys.argv[1:]]
for server in servers[1:]:
    threading.Thread(target=server.serve_forever, daemon=True).start()
servers[0].serve_forever()
"""
