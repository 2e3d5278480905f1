"""A bare aiohttp pass-through (server and client, no auth, no capture, no logging).

The floor `bench.proxy.hot` compares polar_mq's proxy with: what forwarding a call costs in
Python on this machine with the cheapest server and client at hand, measured in the same run.
`python -m bench.proxy.bare --port P --upstream URL`.
"""

from __future__ import annotations

import argparse

import aiohttp
from aiohttp import web

HOP_HEADERS = {"content-type": "application/json"}


def create_app(upstream: str) -> web.Application:
    app = web.Application()

    async def start(app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
        app["session"] = aiohttp.ClientSession(upstream, connector=connector, auto_decompress=False)

    async def stop(app: web.Application) -> None:
        await app["session"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        session: aiohttp.ClientSession = request.app["session"]
        async with session.post(request.path, data=body, headers=HOP_HEADERS) as upstream:
            ctype = upstream.headers.get("content-type", "application/json")
            if not ctype.startswith("text/event-stream"):
                return web.Response(
                    body=await upstream.read(),
                    status=upstream.status,
                    headers={"content-type": ctype},
                )
            response = web.StreamResponse(status=upstream.status, headers={"content-type": ctype})
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app.router.add_post("/v1/chat/completions", forward)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy.bare")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    import uvloop

    web.run_app(
        create_app(args.upstream),
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        print=None,
        loop=uvloop.new_event_loop(),
    )


if __name__ == "__main__":
    main()
