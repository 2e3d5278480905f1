"""Celery workers: the app, routing and the four stage tasks."""
