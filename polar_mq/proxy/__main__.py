"""`python -m polar_mq.proxy [--host H] [--port P] [--upstream-url URL] [--workers N]` (other
settings: env)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from polar_mq.config import Settings, describe_config_error
from polar_mq.proxy.server.run import run_proxy


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the polar_mq token-capturing proxy.")
    parser.add_argument("--host", help="POLAR_MQ_PROXY_HOST")
    parser.add_argument("--port", type=int, help="POLAR_MQ_PROXY_PORT")
    parser.add_argument("--upstream-url", help="POLAR_MQ_UPSTREAM_URL")
    parser.add_argument("--served-model", help="POLAR_MQ_SERVED_MODEL")
    parser.add_argument("--workers", type=int, help="POLAR_MQ_PROXY_WORKERS")
    args = parser.parse_args(argv)
    overrides = {
        "proxy_host": args.host,
        "proxy_port": args.port,
        "upstream_url": args.upstream_url,
        "served_model": args.served_model,
        "proxy_workers": args.workers,
    }
    try:
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:  # one line and exit 2, as `polar-mq proxy` does
        sys.stderr.write(f"configuration error: {' '.join(describe_config_error(exc).split())}\n")
        raise SystemExit(2) from None
    run_proxy(settings)


if __name__ == "__main__":
    main()
