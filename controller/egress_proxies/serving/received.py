"""The probe's client side of one connection: an ``asyncio.Protocol`` that keeps what the peer sent
and hands it out by the three reads the probe makes (up to a separator, exactly n bytes, at most
n bytes), with ``asyncio.StreamReader``'s names and exceptions.

Why not ``asyncio.open_connection``'s streams: the probe makes ~3-7 request round trips per proxy,
10,000 proxies a round, and a stream pair costs a reader, a writer, a protocol between them and
their bookkeeping per connection and per read (docs/performance.md, "One HTTP/1.1 parser, and the
probe's CPU"); this is the part of it the probe uses, one object per connection.

Like a ``StreamReader`` made with ``limit``: a separator not found within ``limit`` bytes raises
``asyncio.LimitOverrunError``; reading stops (the transport is paused) once more than twice the
limit is buffered, and resumes when a read waits for more. The peer's end of the connection makes a
read that cannot be met raise ``asyncio.IncompleteReadError`` (with what had come), an error on the
connection raises that error (``ConnectionResetError``...).

A read still waiting at the connection's deadline (``answer_by``, on the loop's clock) raises
``TimeoutError``. One timer per connection, not one per read (``asyncio.timeout`` around each
check was the probe's other per-request cost): it is armed at the first wait and, when it fires
before a deadline moved later by the next check, armed again at that one; a probe's checks take
milliseconds, so it is mostly armed once and cancelled with the connection.
"""

from __future__ import annotations

import asyncio


class ReceivedBytes(asyncio.Protocol):
    """What one connection received, read by the probe (see the module docstring)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buffer = bytearray()
        self._eof = False
        self._error: BaseException | None = None
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None

    def answer_by(self, deadline: float) -> None:
        """Reads that wait past ``deadline`` (the loop's ``time()``) raise ``TimeoutError``."""
        self._deadline = deadline

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # a TCP connection's
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if len(self._buffer) > 2 * self._limit and self.transport is not None and not self._paused:
            self.transport.pause_reading()
            self._paused = True
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # close our side too: the probe never writes after the peer's end

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._error = exc
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wake()

    # -- the reads -------------------------------------------------------------------------

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        """The bytes up to and including ``separator`` (within the limit)."""
        offset = 0
        while True:
            found = self._buffer.find(separator, offset)
            if found != -1:
                if found > self._limit:
                    raise asyncio.LimitOverrunError("the separator is found, but past the limit", found)
                return self._take(found + len(separator))
            offset = max(0, len(self._buffer) + 1 - len(separator))
            if offset > self._limit:
                raise asyncio.LimitOverrunError("the separator is not found within the limit", offset)
            await self._more()

    async def readexactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            await self._more()
        return self._take(n)

    async def read(self, n: int) -> bytes:
        """At most ``n`` bytes, as soon as there are any; b"" at the end of the connection."""
        if not self._buffer:
            try:
                await self._more()
            except asyncio.IncompleteReadError:
                return b""
        return self._take(min(n, len(self._buffer)))

    # -- inside ----------------------------------------------------------------------------

    def _take(self, n: int) -> bytes:
        taken = bytes(self._buffer[:n])
        del self._buffer[:n]
        return taken

    async def _more(self) -> None:
        """Wait for more bytes; raises when none can come."""
        if self._error is not None:
            raise self._error
        if self._eof:
            partial = self._take(len(self._buffer))
            raise asyncio.IncompleteReadError(partial, None)
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        loop = asyncio.get_running_loop()
        if self._deadline is not None:
            if loop.time() >= self._deadline:
                raise TimeoutError
            if self._timer is None:
                self._timer = loop.call_at(self._deadline, self._expire)
        self._waiter = loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _expire(self) -> None:
        """The timer: fail the waiting read at the deadline, or wait on for a deadline moved later."""
        self._timer = None
        waiter, deadline = self._waiter, self._deadline
        if waiter is None or waiter.done() or deadline is None:
            return  # nothing waits: the next wait arms the timer again
        loop = waiter.get_loop()
        if loop.time() >= deadline:
            waiter.set_exception(TimeoutError())
        else:
            self._timer = loop.call_at(deadline, self._expire)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
