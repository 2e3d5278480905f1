"""The `polar-mq` command: every process of the system and the operator's everyday actions."""

from __future__ import annotations

import subprocess
import sys

import typer

from polar_mq.cli import jobs, logs, processes, train, up
from polar_mq.cli.common import console
from polar_mq.cli.db import db_app
from polar_mq.cli.harness import harness_app
from polar_mq.cli.keys import keys_app

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
# One module per audience (processes: the nodes; jobs: trainers over HTTP; db, keys, harness:
# the operator); registered here in the order `polar-mq --help` lists them.
for command in (
    processes.api, processes.proxy, processes.worker, processes.warm_pool, processes.janitor,
    processes.sweeper, jobs.cancel, processes.flower, jobs.submit, jobs.export, jobs.status,
    jobs.results, jobs.groups, logs.logs, processes.demo, up.up, jobs.policy,
):  # fmt: skip
    app.command()(command)
app.command(context_settings=train.TRAIN_CONTEXT, add_help_option=False)(train.train)
app.add_typer(db_app, name="db")
app.add_typer(keys_app, name="keys")
app.add_typer(harness_app, name="harness")


def main() -> None:
    try:
        app()
    except subprocess.CalledProcessError as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(1)
