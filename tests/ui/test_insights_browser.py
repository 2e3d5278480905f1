"""The new views in a real headless Chromium (the API over a real socket): a job page's plots and
truthful state for a job with retries, an all-failed job and a job cancelled with the page's
button; a rollout's reward explained and a call opened on demand, its `<script>` shown as text;
the cross-job view; search. Rollout outcomes are written the way the workers write them
(`api_support`); no worker is needed to look at them.

Screenshots of the job page, the rollout page and the cross-job view are saved (see
`browser_support.artifacts_dir`).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_support import artifacts_dir, chromium, require_browser
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.infra.db import unit_of_work
from polar_mq.models import Evaluation, Event, LlmCall, Rollout
from polar_mq.models.base import utcnow
from tests.api.api_support import complete_rollout, fail_rollout
from tests.live_api import serve_api

pytestmark = pytest.mark.e2e

WAIT_S = 30
PAYLOAD = '<img src=x onerror="window.__xss=1"><script>window.__xss=1</script>'
STATE = """
const e = document.getElementById('job-state');
return e ? [e.textContent.trim(), getComputedStyle(e).color] : null;
"""


def _job(api: str, tasks: list[dict[str, object]], samples: int) -> tuple[str, list[str]]:
    body = {"tasks": tasks, "samples_per_task": samples, "evaluator": "completed"}
    answer = httpx.post(f"{api}/v1/jobs", json=body, timeout=30)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["job_id"]), [str(r) for r in answer.json()["rollout_ids"]]


def _retried(factory: sessionmaker[Session], rollout_id: uuid.UUID) -> None:
    """Attempt 1's agent stage was given up (the engine answered 503) and requeued as attempt 2,
    which then completed: the rollout page must show attempt 1's run_agent as `retried`."""
    at = utcnow() - timedelta(seconds=30)
    with unit_of_work(factory) as session:
        rollout = session.get_one(Rollout, rollout_id)
        for stage, kind, attempt, s in (
            ("prepare", "started", 1, 0), ("prepare", "finished", 1, 1),
            ("run_agent", "started", 1, 2), ("run_agent", "requeued", 2, 5),
        ):  # fmt: skip
            event = Event(job_id=rollout.job_id, rollout_id=rollout_id, stage=stage, kind=kind)
            event.attempt, event.worker, event.detail = attempt, "w", {}
            event.at = at + timedelta(seconds=s)
            session.add(event)
        rollout.attempt = 2


def _explainable(factory: sessionmaker[Session], rollout_id: uuid.UUID) -> str:
    """An exact_match verdict, and a call whose request carries HTML."""
    with unit_of_work(factory) as session:
        evaluation = session.query(Evaluation).filter_by(rollout_id=rollout_id).one()
        evaluation.evaluator = "exact_match"
        evaluation.detail = {"answer": "4", "expected": ["4"]}
        call = session.query(LlmCall).filter_by(rollout_id=rollout_id, seq=0).one()
        call.request = {"messages": [{"role": "user", "content": PAYLOAD}]}
        return str(call.id)


def _wait(driver: Any, script: str, what: str, *args: object) -> Any:
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(
            lambda d: d.execute_script(script, *args)
        )
    except TimeoutException:
        pytest.fail(f"timed out waiting for {what}; page: {driver.current_url}")


def _shot(driver: Any, path: Path) -> None:
    """A screenshot of the whole page (the window grown to the page's height)."""
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    driver.set_window_size(1440, min(max(height, 900), 6000))
    driver.execute_script("window.scrollTo(0, 0)")
    driver.save_screenshot(str(path))
    driver.set_window_size(1440, 1100)


def test_plots_states_reward_calls_compare_and_search_in_chromium(
    pg_url: str, db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    require_browser()
    from selenium.webdriver.common.by import By

    f = db_session_factory
    shots = artifacts_dir(tmp_path)
    with serve_api(pg_url, f, []) as api:
        tasks: list[dict[str, object]] = [
            {"instruction": "add 2 and 2", "answer": "4"},
            {"instruction": "name a prime", "answer": "2"},
        ]
        retried_job, rollouts = _job(api, tasks, 4)
        start = utcnow()
        rewards = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]  # group 1: no signal
        for i, (rid, reward) in enumerate(zip(rollouts, rewards, strict=True)):
            if i == 0:
                _retried(f, uuid.UUID(rid))
            complete_rollout(
                f, uuid.UUID(rid), reward, finished_at=start + timedelta(seconds=2 * i),
                policy_version=i // 4,
            )  # fmt: skip
        call_id = _explainable(f, uuid.UUID(rollouts[0]))
        other_job, others = _job(api, [{"instruction": "name a prime", "answer": "2"}], 4)
        for i, rid in enumerate(others):  # another run of the same task, to compare with
            complete_rollout(
                f, uuid.UUID(rid), float(i == 2), finished_at=start + timedelta(seconds=4 * i),
                n_calls=3, policy_version=2,
            )  # fmt: skip
        failed_job, failed = _job(api, [{"instruction": "broken engine"}], 2)
        for rid in failed:
            fail_rollout(f, uuid.UUID(rid), reason="backend_error")
        cancelled_job, _ = _job(api, [{"instruction": "to cancel"}], 2)

        with chromium(tmp_path) as driver:
            browser: Any = driver
            # the job with retries: completed, plots drawn, the retry visible on its rollout
            browser.get(f"{api}/ui/jobs/{retried_job}")
            state = browser.execute_script(STATE)
            assert state[0] == "completed"
            bars = browser.execute_script(
                "return document.querySelectorAll('#plot-rewards rect.bar').length"
            )
            assert bars == 2  # rewards 0 and 1
            assert browser.find_element(By.ID, "no-signal").text == "1"
            assert browser.execute_script(
                "return document.querySelectorAll('#plot-versions circle.dot').length"
            ) == 2  # fmt: skip
            assert "add 2 and 2" in browser.find_element(By.ID, "groups").text
            colours = {"completed": state[1]}
            _shot(browser, shots / "job-page.png")

            browser.get(f"{api}/ui/rollouts/{rollouts[0]}")
            stages = browser.find_element(By.ID, "stages").text
            assert "retried" in stages and "running" not in stages
            why = browser.find_element(By.ID, "reward-explained").text
            assert "add 2 and 2" in why and "Expected" in why and "Graded answer" in why
            browser.find_element(By.CSS_SELECTOR, f"#call-{call_id}-request summary").click()
            loaded = f"#call-{call_id}-request pre"
            _wait(
                browser,
                "return document.querySelector(arguments[0]).getAttribute('data-loaded') == 'yes'",
                "the call's request to load",
                loaded,
            )
            shown = browser.execute_script(
                "return document.querySelector(arguments[0]).textContent", loaded
            )
            assert "<script>window.__xss=1</script>" in shown  # shown as text
            assert browser.execute_script("return window.__xss === undefined")  # never run
            assert not browser.execute_script(
                "return document.querySelectorAll('pre.call-body script, pre.call-body img').length"
            )
            _shot(browser, shots / "rollout-page.png")

            # the all-failed job, and a job cancelled with the page's button
            browser.get(f"{api}/ui/jobs/{failed_job}")
            state = browser.execute_script(STATE)
            assert state[0] == "failed"
            colours["failed"] = state[1]
            assert not browser.find_elements(By.ID, "cancel-job")  # nothing left to cancel
            browser.get(f"{api}/ui/jobs/{cancelled_job}")
            assert browser.execute_script(STATE)[0] == "running"
            browser.find_element(By.ID, "cancel-job").click()
            from selenium.webdriver.support import expected_conditions
            from selenium.webdriver.support.ui import WebDriverWait

            WebDriverWait(browser, WAIT_S).until(expected_conditions.alert_is_present())
            browser.switch_to.alert.accept()  # "Cancel every unfinished rollout of this job?"
            _wait(
                browser,
                "const e = document.getElementById('job-state');"
                "return e && e.textContent.trim() == 'cancelled';",
                "the job to read cancelled",
            )
            colours["cancelled"] = browser.execute_script(STATE)[1]
            assert len(set(colours.values())) == 3, colours
            _shot(browser, shots / "job-cancelled.png")

            browser.get(f"{api}/ui/compare")
            table = browser.find_element(By.ID, "compare-table").text
            for job in (retried_job, other_job, failed_job, cancelled_job):
                assert job[:8] in table
            assert browser.execute_script(
                "return document.querySelectorAll('#compare-mean_reward rect.bar').length"
            ) == 2  # fmt: skip  # the failed and the cancelled job have no scored rollout
            _shot(browser, shots / "compare.png")

            browser.get(f"{api}/ui/")
            box = browser.find_element(By.CSS_SELECTOR, "form.search input[name=q]")
            box.send_keys("PRIME")
            box.submit()
            hits = _wait(
                browser,
                "const t = document.getElementById('rollout-hits'); return t && t.innerText;",
                "the search results",
            )
            assert hits.count("name a prime") == 8  # both jobs' runs of it
            _shot(browser, shots / "search.png")
    print(f"screenshots: {shots}")
