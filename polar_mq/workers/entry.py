"""The Celery worker entry point (`celery -A polar_mq.workers.entry`): the one module that builds
the app from the environment at import, because Celery's own CLI imports it by name."""

from __future__ import annotations

from polar_mq.config import get_settings
from polar_mq.dispatch.celery_app import create_celery

app = create_celery(get_settings())
app.loader.import_default_modules()
