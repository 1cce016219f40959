"""A TCP proxy that makes a server answer slowly: every byte the server sends reaches the client
``delay`` seconds after it left the server (latency, as a congested or overloaded link adds it;
throughput and ordering unchanged), while what the client sends goes through at once. Runs in a
thread of the test with its own event loop; ``stop()`` closes the listener and every connection.

    with SlowProxy(("10.200.0.1", 0), ("127.0.0.1", 8080), delay=2.0) as proxy:
        url = f"http://{proxy.host}:{proxy.port}/..."
"""

from __future__ import annotations

import asyncio
import threading
import time


class SlowProxy:
    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int], delay: float):
        self.host, self._port = listen
        self.upstream, self.delay = upstream, delay
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slow-proxy", daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._error: BaseException | None = None

    def start(self) -> SlowProxy:
        self._thread.start()
        self._started.wait(10)
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def __enter__(self) -> SlowProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, self.host, self._port))
            self.port = self._server.sockets[0].getsockname()[1]
        except BaseException as e:  # noqa: BLE001 - handed to start()
            self._error = e
            self._started.set()
            return
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*self._tasks, return_exceptions=True))
            self._loop.close()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_writer.close()
            self._tasks.discard(task)
            return
        try:
            await asyncio.gather(self._pipe(client_reader, server_writer, 0.0),
                                 self._pipe(server_reader, client_writer, self.delay))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for writer in (client_writer, server_writer):
                writer.close()
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
        """Copies ``reader`` to ``writer``, each chunk released ``delay`` seconds after it arrived
        (a queue, so a later chunk never overtakes an earlier one and delays do not add up)."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def release() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    break
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(chunk)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()

        releaser = asyncio.ensure_future(release())
        try:
            while chunk := await reader.read(65536):
                queue.put_nowait((time.monotonic() + delay, chunk))
        finally:
            queue.put_nowait((time.monotonic() + delay, b""))
            await releaser
