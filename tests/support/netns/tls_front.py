"""A TLS front for a plain TCP service: what an Ingress controller with a TLS Secret, or the API
server's own serving certificate, puts before a backend.

:class:`TlsFront` makes a self-signed certificate for the names and addresses it is told (its
``ca_file`` is what a client trusts: the certificate itself), listens on ``host`` (a port the
kernel picks) and, for each connection, ends TLS and copies the bytes both ways to ``backend``.
It sends only to ``backend``; the test picks ``host`` and ``backend`` on loopback or in its own
namespaces.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def self_signed(directory: Path, names: Sequence[str], addresses: Sequence[str]) -> tuple[Path, Path]:
    """A certificate (its own CA, valid for an hour) and key for ``names`` and ``addresses``,
    written to ``directory`` as tls.crt and tls.key."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, (list(names) or list(addresses))[0])])
    alternatives: list[x509.GeneralName] = [x509.DNSName(name) for name in names]
    alternatives += [x509.IPAddress(ipaddress.ip_address(address)) for address in addresses]
    now = datetime.datetime.now(datetime.UTC)
    certificate = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(hours=1))
                   .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(key, hashes.SHA256()))
    cert, key_file = directory / "tls.crt", directory / "tls.key"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert, key_file


class TlsFront:
    """TLS on ``host`` for the names and addresses given, forwarded to ``backend`` (a context manager).

    One asyncio loop on a thread of its own serves every connection: an SSL object is never used
    from two threads, and a socket is closed only by the task that owns it (a descriptor closed
    under another thread's feet would be reused by the next socket the test process opens)."""

    def __init__(self, directory: Path, host: str, backend: tuple[str, int], names: Sequence[str] = (),
                 addresses: Sequence[str] = ()) -> None:
        self.ca_file, key = self_signed(directory, names, addresses or [host])
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(self.ca_file, key)
        self.backend = backend
        self.host, self.port = host, 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="tls-front", daemon=True)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            backend_reader, backend_writer = await asyncio.open_connection(*self.backend)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(self._copy(client_reader, backend_writer), self._copy(backend_reader, client_writer))

    @staticmethod
    async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        """Bytes from ``source`` to ``sink`` until ``source`` ends or either side fails; then ``sink`` is closed."""
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        except (OSError, ssl.SSLError):
            pass
        finally:
            sink.close()

    def __enter__(self) -> Self:
        async def start() -> asyncio.Server:
            return await asyncio.start_server(self._serve, self.host, 0, ssl=self.context)

        self._server = self._loop.run_until_complete(start())
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        async def shut_down() -> None:
            """Stop listening; end every connection (each copy closes its sink on the way out)."""
            if self._server is not None:
                self._server.close()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shut_down(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        self._loop.close()
