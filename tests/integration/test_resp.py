"""The request path's lean Redis connection against a real Redis: batches in flight together
get their own replies, a batch whose caller gave up does not shift the ones after it, error
replies stay in their place, a dropped connection fails its waiters and the next batch
connects again, and the URL's database and credentials are honoured."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
import redis.asyncio as redis

from ballast.state.resp import PipelinedRedis, ReplyError, is_no_script
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.integration


def with_db(url: str, db: int) -> str:
    return urlsplit(url)._replace(path=f"/{db}").geturl()


@pytest.fixture
async def pipe(redis_url: str) -> AsyncIterator[PipelinedRedis]:
    connection = PipelinedRedis(redis_url, connect_timeout=2.0)
    yield connection
    await connection.close()


async def test_batches_in_flight_together_each_get_their_own_replies(
    pipe: PipelinedRedis,
) -> None:
    batches = [[("ECHO", f"{b}-{i}") for i in range(b % 4 + 1)] for b in range(50)]
    replies = await asyncio.gather(*(pipe.execute(batch) for batch in batches))
    for b, (batch, answer) in enumerate(zip(batches, replies, strict=True)):
        assert answer == [f"{b}-{i}".encode() for i in range(len(batch))]


async def test_an_error_reply_stays_in_its_place(pipe: PipelinedRedis) -> None:
    key = f"test-resp-{uuid.uuid4().hex}"
    try:
        replies = await pipe.execute(
            [
                ("SET", key, "x"),
                ("INCR", key),  # not an integer: an error for this command only
                ("EVALSHA", "0" * 40, 0),
                ("GET", key),
            ]
        )
        assert replies[0] == b"OK"
        assert isinstance(replies[1], ReplyError) and not is_no_script(replies[1])
        assert is_no_script(replies[2])
        assert replies[3] == b"x"
    finally:
        await pipe.execute([("DEL", key)])


async def test_a_batch_given_up_on_does_not_shift_the_replies_after_it(
    pipe: PipelinedRedis,
) -> None:
    empty = f"test-resp-{uuid.uuid4().hex}"
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await pipe.execute([("BLPOP", empty, "0.3")])  # answers nil after 0.3 s
    assert await pipe.execute([("ECHO", "after")]) == [b"after"]


async def test_a_dropped_connection_fails_its_waiters_and_the_next_batch_reconnects(
    redis_url: str,
) -> None:
    target = urlsplit(redis_url)
    async with FaultProxy(target.hostname or "127.0.0.1", target.port or 6379) as proxy:
        url = target._replace(netloc=f"127.0.0.1:{proxy.port}").geturl()
        pipe = PipelinedRedis(url, connect_timeout=2.0)
        try:
            assert await pipe.execute([("PING",)]) == [b"PONG"]
            proxy.delay(5.0)
            waiting = asyncio.ensure_future(pipe.execute([("PING",)]))
            await asyncio.sleep(0.05)
            proxy.reset()
            with pytest.raises(ConnectionError):
                await asyncio.wait_for(waiting, 2.0)
            proxy.passthrough()
            assert await pipe.execute([("PING",)]) == [b"PONG"]
            assert proxy.accepted == 2
        finally:
            await pipe.close()


async def test_the_urls_database_is_selected(redis_url: str) -> None:
    key = f"test-resp-{uuid.uuid4().hex}"
    pipe = PipelinedRedis(with_db(redis_url, 7), connect_timeout=2.0)
    other = redis.Redis.from_url(with_db(redis_url, 7))
    try:
        await pipe.execute([("SET", key, "in-seven", "EX", 60)])
        assert await other.get(key) == b"in-seven"
    finally:
        await other.delete(key)
        await other.aclose()
        await pipe.close()


async def test_refused_credentials_fail_the_connection_without_showing_them(
    redis_url: str,
) -> None:
    secret = "s3cret-" + uuid.uuid4().hex
    url = urlsplit(redis_url)
    wrong = url._replace(netloc=f"nobody:{secret}@{url.hostname}:{url.port or 6379}").geturl()
    pipe = PipelinedRedis(wrong, connect_timeout=2.0)
    try:
        with pytest.raises(ConnectionError) as refused:
            await pipe.execute([("PING",)])
        assert "refused the connection set-up" in str(refused.value)
        assert secret not in str(refused.value)
    finally:
        await pipe.close()
