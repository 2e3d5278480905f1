"""How work reaches the workers: the Celery app and its delivery guarantees, publishing stage
messages (priorities, the direct publish path), the embedded broker, and submitting a job.
"""
