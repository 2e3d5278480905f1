"""The trainer's and operator's HTTP commands: `polar-mq submit | status | groups | export |
cancel | policy`, all through `polar_mq.client.Client` against the REST API."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from polar_mq.cli.common import console, fail, load_settings
from polar_mq.cli.tables import jobs_table, results_table, status_view
from polar_mq.client import Client, PolarMQError

ApiUrl = Annotated[str | None, typer.Option(help="API base URL")]
ApiKey = Annotated[str | None, typer.Option(envvar="POLAR_MQ_API_KEY")]
"""The two options of every command here: which API, and the key (also from the environment)."""
AsJson = Annotated[bool, typer.Option("--json", help="print the API's JSON (for scripts)")]
DEFAULT_SAMPLES = 4
"""Samples per task when neither the file nor --samples says: a GRPO group."""


def _load_job_file(path: Path) -> dict[str, Any]:
    """The job spec a file holds (see `polar_mq.jobs.tasks_file` for the formats)."""
    from polar_mq.jobs.task_errors import TasksFileError
    from polar_mq.jobs.tasks_file import load_job_file

    try:
        return load_job_file(path).spec()
    except TasksFileError as exc:
        raise fail(str(exc), 2) from exc


def _json_option(value: str, name: str) -> Any:
    """A CLI value that is either a bare name or a JSON object (`--evaluator '{"name": ...}'`)."""
    if not value.lstrip().startswith("{"):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise fail(f"--{name} is not valid JSON: {exc}", 2) from exc


def _check_evaluator(spec: dict[str, Any], file: Path) -> None:
    """The API's evaluator rule (`polar_mq.jobs.evaluator_choice`) applied before any request,
    so a file the API would refuse is a message naming the file, not a round trip. An evaluator
    this machine cannot build (an import path of the API's) is left to the API to judge."""
    from polar_mq.evaluators.registry import get_evaluator
    from polar_mq.jobs.evaluator_choice import (
        default_evaluator,
        evaluator_label,
        task_fields_problem,
    )

    tasks = spec["tasks"]
    chosen = spec.get("evaluator")
    try:
        if chosen is None:
            chosen = default_evaluator(tasks)
    except ValueError as exc:
        raise fail(f"{file.name}: {exc}; or pass --evaluator", 2) from exc
    if not isinstance(chosen, str | dict):
        return  # the API answers with the failing field
    try:
        built = get_evaluator(chosen)
    except ValueError:
        return
    problem = task_fields_problem(built, evaluator_label(chosen), tasks)
    if problem is not None:
        raise fail(f"{file.name}: {problem}", 2)


def api_failed(exc: PolarMQError) -> typer.Exit:
    """Print an API error and return the exit: an unreachable API is its message alone (it names
    the URL), an answer of the API keeps its status and type."""
    return fail(exc.message if exc.status == 0 else str(exc))


def api_client(url: str | None, api_key: str | None) -> Client:
    """A client of --url (default: the API this node's settings name)."""
    settings = load_settings()
    return Client(url or f"http://{settings.api_host}:{settings.api_port}", api_key)


def submit(
    file: Annotated[
        Path,
        typer.Argument(help="job .json, tasks .jsonl / .yaml / .json, or a Harbor tasks folder"),
    ],
    samples: Annotated[
        int | None, typer.Option(help=f"samples per task (file, else {DEFAULT_SAMPLES})")
    ] = None,
    harness: Annotated[
        str | None, typer.Option(help="reference | command, or a JSON harness object")
    ] = None,
    command: Annotated[
        str | None, typer.Option(help="shell command of the command harness ({instruction}…)")
    ] = None,
    evaluator: Annotated[
        str | None,
        typer.Option(
            help="name or JSON; default: exact_match if every task has an answer, "
            "tests if every task has hidden tests, completed if none has either"
        ),
    ] = None,
    builder: Annotated[str | None, typer.Option(help="per_call | prefix_merge")] = None,
    model: Annotated[str | None, typer.Option(help="model name the agent is told")] = None,
    temperature: Annotated[float | None, typer.Option(help="sampling temperature")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="max tokens per LLM call")] = None,
    agent_timeout: Annotated[float | None, typer.Option(help="agent wall clock, s")] = None,
    pool: Annotated[str | None, typer.Option(help="worker pool")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="wait and print results")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="with --wait: print the final status as JSON")
    ] = False,
    url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Submit a job file, or a tasks file plus options for the rest of the job.

    Options override the file; fields neither sets get the API's defaults, except samples per
    task (4: a GRPO group). The evaluator's default is the API's rule (exact_match when every
    task has an answer, tests when every task has hidden tests, e.g. a Harbor tasks folder,
    completed when none has either; a mix is refused), checked here before any request.
    """
    spec = _load_job_file(file)
    if command is not None:
        spec["harness"] = {"type": "command", "command": command}
    elif harness is not None:
        chosen = _json_option(harness, "harness")
        spec["harness"] = chosen if isinstance(chosen, dict) else {"type": chosen}
    if evaluator is not None:
        spec["evaluator"] = _json_option(evaluator, "evaluator")
    _check_evaluator(spec, file)
    sampling = dict(spec.get("sampling") or {})
    if temperature is not None:
        sampling["temperature"] = temperature
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    if sampling:
        spec["sampling"] = sampling
    if agent_timeout is not None:
        spec["timeouts"] = {**(spec.get("timeouts") or {}), "agent_s": agent_timeout}
    options = {"samples_per_task": samples, "builder": builder, "model": model, "pool": pool}
    spec.update({key: value for key, value in options.items() if value is not None})
    spec.setdefault("samples_per_task", DEFAULT_SAMPLES)
    client = api_client(url, api_key)
    try:
        submitted = client.submit_spec(spec)
        console.print(f"job {submitted.job_id}: {len(submitted.rollout_ids)} rollouts")
        if wait:
            job_id = str(submitted.job_id)
            final = client.wait(job_id, progress=not as_json)
            if as_json:
                sys.stdout.write(json.dumps(final, default=str) + "\n")
            else:
                groups = client.results(job_id, complete_only=False)
                console.print(results_table(job_id, groups))
                console.print(status_view(client.status(job_id)))
    except PolarMQError as exc:
        raise api_failed(exc) from exc


def export(
    job_id: Annotated[str, typer.Argument(help="a job id")],
    format: Annotated[
        str | None, typer.Option("--format", help="jsonl | parquet (default: by --out suffix)")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="output file (default JOB.FORMAT)")] = None,
    complete_only: Annotated[
        bool, typer.Option("--complete-only/--all-groups", help="only complete groups")
    ] = True,
    advantages: Annotated[
        str | None, typer.Option(help="grpo: add group-relative advantages")
    ] = None,
    artifacts: Annotated[
        Path | None,
        typer.Option(help="also save each rollout's artifacts under DIR/<rollout id>/"),
    ] = None,
    url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Write a job's training samples (one row each) as JSONL or Parquet."""
    from polar_mq.client.export import resolve_format

    try:
        chosen = resolve_format(out or Path(f"{job_id}.jsonl"), format)
    except ValueError as exc:
        raise fail(str(exc), 2) from exc
    path = out or Path(f"{job_id}.{chosen.value}")
    if advantages is not None and advantages != "grpo":
        raise fail(f"unknown --advantages {advantages!r}; known: grpo", 2)
    client = api_client(url, api_key)
    try:
        summary = client.export(
            job_id, path, chosen.value, complete_only, advantages, artifacts_dir=artifacts
        )
    except PolarMQError as exc:
        raise api_failed(exc) from exc
    except OSError as exc:
        raise fail(f"cannot write {path}: {exc}") from exc
    console.print(f"{summary.rows} samples of {summary.groups} groups → {summary.path}")
    if artifacts is not None:
        console.print(f"{summary.artifacts} artifact files → {artifacts}")
    if not summary.job_finished:
        console.print("[yellow]the job is still running: later groups are not in this file[/]")


def status(
    job_id: Annotated[str | None, typer.Argument(help="a job id; all jobs when omitted")] = None,
    as_json: AsJson = False,
    url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Print a job's status (with the errors of its attempts), or the list of jobs."""
    client = api_client(url, api_key)
    try:
        answer = client.status(job_id) if job_id else client.jobs()
    except PolarMQError as exc:
        raise api_failed(exc) from exc
    if as_json:
        console.print_json(data=answer)
    else:
        console.print(status_view(answer) if job_id else jobs_table(answer))


def results(
    job_id: Annotated[str, typer.Argument(help="a job id")],
    complete_only: Annotated[
        bool, typer.Option("--complete-only/--all-groups", help="only complete groups")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="one JSON line per group, as the API returns it")
    ] = False,
    url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Print a job's groups: each task, its rewards and how its rollouts ended (no leases taken:
    `polar-mq groups` is the trainer's consuming stream)."""
    client = api_client(url, api_key)
    try:
        found = client.results(job_id, complete_only=complete_only)
    except PolarMQError as exc:
        raise api_failed(exc) from exc
    if as_json:
        for group in found:
            sys.stdout.write(json.dumps(group, default=str) + "\n")
    else:
        console.print(results_table(job_id, found))


def groups(
    job_id: Annotated[str, typer.Argument(help="a job id")],
    consumer: Annotated[
        str | None, typer.Option(help="consumer name holding the leases (default: unique)")
    ] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="groups leased per call")] = 16,
    lease_s: Annotated[float, typer.Option(help="unacked groups come back after this")] = 60.0,
    ack: Annotated[
        bool, typer.Option("--ack/--no-ack", help="acknowledge each batch once printed")
    ] = True,
    trajectories: Annotated[bool, typer.Option(help="include token arrays")] = False,
    url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Print a job's complete groups as they finish (one JSON line each), leasing them.

    With --ack (the default) the groups are consumed: a trainer leasing the same job will not
    see them again. --no-ack only peeks: it stops when the printed groups come back after their
    leases ran out, and they are handed out again to the next consumer.
    """
    client = api_client(url, api_key)
    stream = client.stream_groups(
        job_id, batch_size=batch_size, consumer=consumer, lease_s=lease_s,
        ack="auto" if ack else "manual", include_trajectories=trajectories,
    )  # fmt: skip
    printed: set[int] = set()
    try:
        for batch in stream:
            fresh = [g for g in batch if g["task_index"] not in printed]
            for group in fresh:
                sys.stdout.write(json.dumps(group, default=str) + "\n")
            sys.stdout.flush()
            printed.update(g["task_index"] for g in fresh)
            if not ack and not fresh:
                return  # peeking: the leases ran out and the printed groups came back
    except PolarMQError as exc:
        raise api_failed(exc) from exc


def cancel(
    job_id: Annotated[str, typer.Argument(help="job id")],
    url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Cancel every unfinished rollout of a job (running agents are killed)."""
    client = api_client(url, api_key)
    try:
        result = client.cancel(job_id)
    except PolarMQError as exc:
        raise api_failed(exc) from exc
    console.print(
        f"cancelled {len(result['cancelled'])} rollouts "
        f"({result['already_terminal']} had already ended)"
    )


def policy(
    version: Annotated[
        int | None, typer.Argument(help="set this policy version (omit to show the current one)")
    ] = None,
    pause: Annotated[
        bool, typer.Option(help="hold new LLM calls and drain the ones in flight first")
    ] = False,
    resume: Annotated[bool, typer.Option(help="let held LLM calls go (weights loaded)")] = False,
    drain_timeout: Annotated[float, typer.Option(help="seconds to wait for the drain")] = 30.0,
    adapter: Annotated[
        str | None,
        typer.Option(
            help="new weights: a LoRA adapter directory the inference servers can read; the "
            "proxies pause, drain, load it everywhere and resume"
        ),
    ] = None,
    checkpoint: Annotated[
        str | None,
        typer.Option(
            help="new weights: a full model directory the inference servers reload from disk "
            "(SGLang; vLLM in dev mode), with the same pause, drain, load and resume"
        ),
    ] = None,
    url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Show or set the trainer's policy version (weight updates; see docs/async_rl.md)."""
    weights = adapter is not None or checkpoint is not None
    if resume and (version is not None or pause or weights):
        raise fail("--resume takes no version, no --pause, no --adapter and no --checkpoint")
    if adapter is not None and checkpoint is not None:
        raise fail("publish either --adapter or --checkpoint, not both")
    if weights and version is None:
        raise fail(
            f"--{'adapter' if adapter else 'checkpoint'} needs the version it is published as"
        )
    client = api_client(url, api_key)
    try:
        if resume:
            answer = client.resume_policy()
        elif version is not None:
            answer = client.set_policy(
                version, pause=pause, drain_timeout_s=drain_timeout, adapter_path=adapter,
                checkpoint_path=checkpoint,
            )  # fmt: skip
        else:
            answer = client.policy()
    except PolarMQError as exc:
        raise api_failed(exc) from exc
    sys.stdout.write(json.dumps(answer, default=str) + "\n")
