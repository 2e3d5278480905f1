"""`python -m polar_mq.proxy [--host H] [--port P] [--upstream-url URL]` (other settings: env)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from polar_mq.config import Settings
from polar_mq.proxy.server import run_proxy


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the polar_mq token-capturing proxy.")
    parser.add_argument("--host", help="POLAR_MQ_PROXY_HOST")
    parser.add_argument("--port", type=int, help="POLAR_MQ_PROXY_PORT")
    parser.add_argument("--upstream-url", help="POLAR_MQ_UPSTREAM_URL")
    parser.add_argument("--served-model", help="POLAR_MQ_SERVED_MODEL")
    args = parser.parse_args(argv)
    overrides = {
        "proxy_host": args.host,
        "proxy_port": args.port,
        "upstream_url": args.upstream_url,
        "served_model": args.served_model,
    }
    run_proxy(Settings(**{k: v for k, v in overrides.items() if v is not None}))


if __name__ == "__main__":
    main()
