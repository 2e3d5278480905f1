"""The REST API: FastAPI app factory, dependencies, error shapes and routes."""

from polar_mq.api.app import create_app

__all__ = ["create_app"]
