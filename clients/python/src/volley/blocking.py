"""A blocking wrapper for scripts and code without asyncio: the asyncio ``Client`` runs on an
event loop in a thread of its own, and each method waits for its result.

    with volley.blocking.Client("tcp://127.0.0.1:7411") as client:
        print(client.call(volley.Method("echo", "echo"), b"hi"))

Calls from several threads share the connection (and are pipelined on it).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Iterator

from . import client as aio


class Client:
    """``volley.Client``'s ``call``, ``call_batch``, ``stream``, ``client_stream``,
    ``bidi_stream`` and ``ping``, blocking."""

    def __init__(self, address: str, **options: Any):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="volley-client", daemon=True)
        self._thread.start()
        try:
            self._client: aio.Client = self._run(aio.Client.connect(address, **options))
        except BaseException:
            self._stop()
            raise

    def _run(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def call(self, method, request: Any, **options: Any) -> Any:
        return self._run(_awaited(self._client.call, method, request, **options))

    def call_batch(self, method, requests, **options: Any) -> list[Any]:
        return self._run(_awaited(self._client.call_batch, method, requests, **options))

    def stream(self, method, request: Any, **options: Any) -> Iterator[Any]:
        """``volley.Client.stream``, blocking: a generator of the server's items (each one
        hop to the client's thread and back). Closing the generator before the end (``close``,
        or leaving a ``for`` loop and dropping it) cancels the stream."""
        return self._items(self._client.stream(method, request, **options))

    def bidi_stream(self, method, requests, **options: Any) -> Iterator[Any]:
        """``volley.Client.bidi_stream``, blocking: a generator of the server's items, while
        ``requests`` are sent from the client's thread as the server grants credit (iterated
        there, so it should not block; an async iterable that waits, say on a queue fed from
        this thread through ``loop.call_soon_threadsafe``, may). Closing the generator before
        the end cancels the stream."""
        return self._items(self._client.bidi_stream(method, requests, **options))

    def _items(self, items) -> Iterator[Any]:
        """An ``ItemStream``'s items, each taken on the client's loop; closing early cancels."""
        try:
            while True:
                try:
                    item = self._run(items.__anext__())
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if self._loop.is_running():
                self._run(items.aclose())

    def client_stream(self, method, requests, **options: Any) -> Any:
        """``volley.Client.client_stream``, blocking; ``requests`` is iterated on the client's
        thread, so it should not block."""
        return self._run(self._client.client_stream(method, requests, **options))

    def ping(self, **options: Any) -> float:
        return self._run(self._client.ping(**options))

    def close(self) -> None:
        """Closes the connection (answers to calls already sent still arrive), then the loop."""
        if self._loop.is_running():
            self._run(self._client.close())
            self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


async def _awaited(call, *args: Any, **options: Any) -> Any:
    """``call(*args)`` made on the client's loop (a call starts its work before it is awaited,
    which must be on the loop's thread), and awaited."""
    return await call(*args, **options)
