#!/usr/bin/env python3
"""A TCP forwarder that stands in for a Service in front of several local processes.

    forward.py LISTEN BACKEND [BACKEND ...]      e.g. 127.0.0.1:19443 127.0.0.1:19444 ...

Each connection goes to the first backend that accepts it, in order, so a stopped
backend is skipped (the demo's conversion webhook keeps answering while a replica is
killed, as the webhook Service of an install sends calls to the pods that are up).
Bytes pass through untouched (TLS ends at the backend). Standard library only.
"""

import asyncio
import sys


def address(text):
    host, _, port = text.rpartition(":")
    return host, int(port)


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def handle(client_reader, client_writer, backends):
    for host, port in backends:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2)
        except (OSError, asyncio.TimeoutError):
            continue
        await asyncio.gather(pipe(client_reader, writer), pipe(reader, client_writer))
        return
    client_writer.close()


async def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    listen = address(sys.argv[1])
    backends = [address(a) for a in sys.argv[2:]]
    server = await asyncio.start_server(lambda r, w: handle(r, w, backends), *listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
