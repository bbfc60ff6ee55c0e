"""A TCP proxy on 127.0.0.1 between the operator and kube-apiserver that can cut the network.

Modes: ``pass`` forwards bytes both ways (TLS passes through untouched); ``reset`` closes every
open connection and refuses new ones with a reset (connection reset by peer), as a network
partition or a restarting API server load balancer does. Runs in its own thread.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int):
        self.upstream = (upstream_host, upstream_port)
        self.mode = "pass"
        self.connections_reset = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fault-proxy")
        self.port = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        """Close every connection and finish every pipe before the loop stops (a pipe left pending
        would be finalized after the loop closed: "Event loop is closed")."""
        async def shutdown() -> None:
            for writer in list(self._writers):
                writer.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    # -- faults ------------------------------------------------------------------------------
    def cut(self) -> None:
        """Reset every open connection and refuse new ones until ``restore()``."""
        self.mode = "reset"
        self._loop.call_soon_threadsafe(self._reset_all)

    def restore(self) -> None:
        self.mode = "pass"

    def _reset_all(self) -> None:
        for w in list(self._writers):
            self._abort(w)

    def _abort(self, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:  # RST instead of FIN: the peer sees "connection reset by peer"
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        writer.transport.abort()
        self._writers.discard(writer)
        self.connections_reset += 1

    # -- forwarding --------------------------------------------------------------------------
    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while self.mode == "pass":
                data = await reader.read(65536)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if not writer.is_closing():
                writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode != "pass":
            self._abort(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            self._abort(writer)
            return
        self._writers.update({writer, up_writer})
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        self._writers.difference_update({writer, up_writer})
