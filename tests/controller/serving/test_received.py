"""serving/received.py: the probe's connection protocol reads like a StreamReader, over a real
loopback socket (a server here sends what each test needs)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from egress_proxies.serving.received import ReceivedBytes


async def _against(sent: bytes, read: Callable[[ReceivedBytes], Awaitable[object]], limit: int = 64,
                   close: bool = True) -> object:
    """``read`` on a connection to a server that sends ``sent`` (then closes, with ``close``)."""
    writers: list[asyncio.StreamWriter] = []

    async def serve(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        writer.write(sent)
        await writer.drain()
        if close:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    received = ReceivedBytes(limit)
    await asyncio.get_running_loop().create_connection(lambda: received, "127.0.0.1", port)
    try:
        return await asyncio.wait_for(read(received), 5)
    finally:
        assert received.transport is not None
        received.transport.close()
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()


async def _three_reads(received: ReceivedBytes) -> list[bytes]:
    return [await received.readuntil(b"\r\n\r\n"), await received.readexactly(3), await received.read(100)]


def test_the_three_reads_take_what_was_sent_in_order() -> None:
    assert asyncio.run(_against(b"HTTP/1.1 200 OK\r\n\r\nabcdef", _three_reads)) == [
        b"HTTP/1.1 200 OK\r\n\r\n", b"abc", b"def"]


def test_a_separator_past_the_limit_is_refused_like_a_stream_reader_does() -> None:
    with pytest.raises(asyncio.LimitOverrunError):
        asyncio.run(_against(b"x" * 200 + b"\r\n\r\n", lambda r: r.readuntil(b"\r\n\r\n"), close=False))


def test_the_end_of_the_connection_raises_with_what_came() -> None:
    with pytest.raises(asyncio.IncompleteReadError) as raised:
        asyncio.run(_against(b"HTTP/1.1 2", lambda r: r.readuntil(b"\r\n\r\n")))
    assert raised.value.partial == b"HTTP/1.1 2"
    assert asyncio.run(_against(b"", lambda r: r.read(10))) == b""


def test_reading_pauses_past_twice_the_limit_and_resumes_for_a_longer_read() -> None:
    # 100 KiB against a 64-byte limit: the transport is paused and resumed many times on the way.
    body = bytes(range(256)) * 400
    assert asyncio.run(_against(body, lambda r: r.readexactly(len(body)))) == body


async def _late(answer_after: float, deadline: float, moved_to: float | None = None) -> tuple[object, float]:
    """A read on a connection whose server answers ``answer_after`` seconds in, with a deadline
    ``deadline`` seconds in (moved to ``moved_to`` seconds in while the read waits, if given):
    what the read returned or raised, and when."""
    async def serve(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await asyncio.sleep(answer_after)
            writer.write(b"late\r\n\r\n")
            await writer.drain()
        finally:
            writer.close()  # also when the read gave up first and the test's loop ends

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    received = ReceivedBytes(64)
    await loop.create_connection(lambda: received, "127.0.0.1", server.sockets[0].getsockname()[1])
    started = loop.time()
    received.answer_by(started + deadline)
    if moved_to is not None:
        loop.call_later(deadline / 2, received.answer_by, started + moved_to)
    try:
        result: object = await received.readuntil(b"\r\n\r\n")
    except TimeoutError as err:
        result = err
    finally:
        assert received.transport is not None
        received.transport.close()
        server.close()
    return result, loop.time() - started


def test_a_read_still_waiting_at_the_deadline_raises_timeout_error() -> None:
    result, seconds = asyncio.run(_late(answer_after=2.0, deadline=0.2))
    assert isinstance(result, TimeoutError) and 0.2 <= seconds < 1.0


def test_a_deadline_moved_later_while_a_read_waits_keeps_it_waiting_until_then() -> None:
    """The timer armed for the first deadline fires, finds the deadline moved, and waits on."""
    assert asyncio.run(_late(answer_after=0.4, deadline=0.2, moved_to=1.5))[0] == b"late\r\n\r\n"
    result, seconds = asyncio.run(_late(answer_after=2.0, deadline=0.2, moved_to=0.5))
    assert isinstance(result, TimeoutError) and 0.5 <= seconds < 1.3
