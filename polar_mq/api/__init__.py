"""The REST API: FastAPI app factory, dependencies, error shapes and routes."""

from polar_mq.api.app import create_api

__all__ = ["create_api"]
