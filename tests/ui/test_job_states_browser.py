"""The job states' labels and colours in a real headless Chromium (the API over a real socket).

Before, a job that ended with failures, or cancelled, showed the same green `completed` and the
same full bar as a clean one. Rollout outcomes are written the way the workers write them
(`api_support`); no worker is needed to look at the list.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_support import artifacts_dir, chromium, require_browser
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.lifecycle.messages import StageMessage
from tests.api.api_support import complete_rollout, fail_rollout
from tests.live_api import serve_api

pytestmark = pytest.mark.e2e

STATE_SCRIPT = """
const out = {};
for (const row of document.querySelectorAll('tr')) {
  const label = row.querySelector('span.state');
  const bar = row.querySelector('progress.state-bar');
  const link = row.querySelector('a[href^="/ui/jobs/"]');
  if (!label || !link) continue;
  out[link.getAttribute('href').split('/').pop()] = {
    text: label.textContent.trim(),
    color: getComputedStyle(label).color,
    bar: bar ? getComputedStyle(bar).accentColor : null,
  };
}
return out;
"""


def _job(api: str, n: int) -> tuple[str, list[str]]:
    body = {"tasks": [{"instruction": f"t{i}"} for i in range(n)], "samples_per_task": 1}
    answer = httpx.post(f"{api}/v1/jobs", json=body, timeout=30).json()
    return str(answer["job_id"]), [str(r) for r in answer["rollout_ids"]]


def test_each_ended_job_state_has_its_own_label_and_colour(
    pg_url: str, db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    require_browser()
    published: list[StageMessage] = []
    f = db_session_factory
    with serve_api(pg_url, f, published) as api:
        jobs: dict[str, str] = {}
        done, (a, b) = _job(api, 2)
        for rid in (a, b):
            complete_rollout(f, uuid.UUID(rid))
        jobs[done] = "completed"
        mixed, (c, d) = _job(api, 2)
        complete_rollout(f, uuid.UUID(c))
        fail_rollout(f, uuid.UUID(d), reason="backend_error")
        jobs[mixed] = "completed with failures"
        failed, (e,) = _job(api, 1)
        fail_rollout(f, uuid.UUID(e), reason="backend_error")
        jobs[failed] = "failed"
        cancelled, _ = _job(api, 1)
        assert httpx.post(f"{api}/v1/jobs/{cancelled}/cancel", timeout=30).status_code == 200
        jobs[cancelled] = "cancelled"

        with chromium(tmp_path) as driver:
            browser: Any = driver
            browser.get(f"{api}/ui/")
            seen: dict[str, dict[str, Any]] = browser.execute_script(STATE_SCRIPT)
            browser.save_screenshot(str(artifacts_dir(tmp_path) / "job-states.png"))
    assert {job: seen[job]["text"] for job in jobs} == jobs
    colours = {seen[job]["color"] for job in jobs}
    assert len(colours) == len(jobs), seen  # four states, four colours
    bars = {seen[job]["bar"] for job in jobs}
    assert len(bars) == len(jobs), seen  # and four bar colours
