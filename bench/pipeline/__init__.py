"""`python -m bench.pipeline`: orchestration overhead and whole-system cost per rollout (SPEC §9).

(1) a raw Celery chain of four no-op tasks, (2) polar_mq's four-stage pipeline with a no-op agent,
(3) polar_mq with a trivial stdlib agent making three chat calls through the proxy, all in one run
on one Redis broker and one fresh PostgreSQL database; see bench/README.md.
"""
