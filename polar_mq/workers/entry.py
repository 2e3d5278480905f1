"""The Celery worker entry point (`celery -A polar_mq.workers.entry`): the one module that builds
the app from the environment at import, because Celery's own CLI imports it by name. It also makes
`-P threads` our thread pool (`workers.thread_pool`: acks on the consumer's thread); Celery's CLI
loads this module before it resolves the pool name. Its workers get prepare admission
(`workers.admission_step`; it acts only in the one that consumes the pool's prepare queue)."""

from __future__ import annotations

from polar_mq.config import get_settings
from polar_mq.dispatch.celery_app import create_celery
from polar_mq.workers.admission_step import PrepareAdmission
from polar_mq.workers.thread_pool import install_as_threads

install_as_threads()

app = create_celery(get_settings())
app.steps["consumer"].add(PrepareAdmission)
app.loader.import_default_modules()
