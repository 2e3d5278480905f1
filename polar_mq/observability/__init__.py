"""What every polar_mq process tells its operator: Prometheus metrics and structured logs.

- `context`: the rollout a log line concerns (`job_id`, `rollout_id`, `attempt`, `stage`),
  carried in a context variable and stamped on every record;
- `logs`: one logging setup per process (JSON lines off a terminal, a file per process under
  `POLAR_MQ_LOG_DIR`); `log_files` gathers a rollout's lines back (`polar-mq logs`);
- `api_metrics`, `stage_metrics`, `node_metrics`, `sweeper_metrics`: the `/metrics` of the API,
  of the stage workers (aggregated per node) and of the sweeper. The proxy keeps its own
  (`polar_mq.proxy.metrics`); every name starts with `polar_`.
"""
