"""A TCP forwarder process: how the hosts of the namespace test bed reach the head's services.

PostgreSQL, Redis and RabbitMQ on this machine listen on 127.0.0.1 of the root namespace only,
which a network namespace cannot reach. Rather than reconfigure them (listen addresses, pg_hba)
or the kernel (DNAT to loopback needs `route_localnet`), the bed runs this forwarder on the
bridge address: `listen → target` pairs, one asyncio task per connection direction. Stopping the
process undoes everything it did.

    python -m polar_mq.testing.tcp_forward 10.213.7.1:41000=127.0.0.1:5432 ...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            writer.close()


def _handler(target: tuple[str, int]) -> object:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, server_w), _pipe(server_r, client_w))

    return handle


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def serve(pairs: list[tuple[tuple[str, int], tuple[str, int]]]) -> None:
    servers = [
        await asyncio.start_server(_handler(target), *listen, reuse_address=True)  # type: ignore[arg-type]
        for listen, target in pairs
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    await stop.wait()
    for server in servers:
        server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pairs", nargs="+", help="LISTEN_HOST:PORT=TARGET_HOST:PORT")
    args = parser.parse_args(argv)
    pairs = []
    for pair in args.pairs:
        listen, _, target = pair.partition("=")
        if not target:
            parser.error(f"expected LISTEN=TARGET, got {pair!r}")
        pairs.append((_address(listen), _address(target)))
    asyncio.run(serve(pairs))


if __name__ == "__main__":
    main()
