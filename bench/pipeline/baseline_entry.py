"""The baseline's Celery entry point (`celery -A bench.pipeline.baseline_entry worker`)."""

from __future__ import annotations

from bench.pipeline.baseline import create_baseline_app
from polar_mq.config import Settings

app = create_baseline_app(Settings())
