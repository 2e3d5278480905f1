"""The dashboard in a real headless Chromium on a real stack: API, Celery workers, proxy, fake
vLLM-shaped engine, PostgreSQL, Redis.

The agent (`gated_agent.py`) waits for a gate file per task, so the test releases one group at a
time and watches the job page's counts move through the server-sent events (the page is never
reloaded: a marker set in the page survives). Then it opens a rollout and checks its stage
timeline, its LLM calls and its trajectory with the trained tokens highlighted, and that the
agent's HTML-looking output is shown as text. Screenshots are saved as test artifacts.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from browser_support import artifacts_dir, chromium, require_browser
from sqlalchemy.orm import Session, sessionmaker

from polar_mq.client import Client
from polar_mq.infra.db import unit_of_work
from polar_mq.lifecycle.stages import Stage
from polar_mq.stack.devstack import LocalStack
from polar_mq.tenants.keys import create_api_key
from tests.e2e.stack import fake_upstream_stack

pytestmark = pytest.mark.e2e

AGENT = Path(__file__).with_name("gated_agent.py")
N_TASKS = 3
SAMPLES = 2
WAIT_S = 120.0
"""Upper bound for one group to finish once released (generous: other tests share the CPUs)."""
XSS_TASK = "What is 6*7? <img src=x onerror=window.__xss_task=1>"


@pytest.fixture(scope="module")
def ui_stack(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    require_browser()
    latency = {"ttft_ms": 20, "token_delay_ms": 5}
    concurrency = {Stage.RUN_AGENT: 6, Stage.PREPARE: 2}
    tmp = tmp_path_factory.mktemp("ui-browser")
    with fake_upstream_stack(pg_url, tmp, concurrency=concurrency, latency=latency) as stack:
        yield stack


def _api(stack: LocalStack) -> str:
    return f"http://{stack.settings.api_host}:{stack.settings.api_port}"


def _submit(stack: LocalStack, key: str, gates: Path) -> str:
    tasks = [
        {"instruction": XSS_TASK if i == 0 else f"What is {i}*6?", "answer": "42",
         "gate": str(gates / f"group-{i}")}
        for i in range(N_TASKS)
    ]  # fmt: skip
    with Client(_api(stack), api_key=key) as client:
        job = client.submit(
            tasks, samples_per_task=SAMPLES, evaluator="exact_match",
            harness={"type": "command", "command": f"{{python}} {AGENT}"}, builder="prefix_merge",
            timeouts={"agent_s": 600}, metadata={"name": "dashboard browser test"},
        )  # fmt: skip
    return str(job.job_id)


def _text(driver: Any, element_id: str) -> str:
    """An element's text, read in one script call: the live part is replaced while the test
    looks, so a found element may be gone by the time its text is asked for."""
    script = "const e = document.getElementById(arguments[0]); return e ? e.textContent : null;"
    return str(driver.execute_script(script, element_id)).strip()


def _wait(driver: Any, condition: Any, what: str) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        wait = WebDriverWait(
            driver, WAIT_S, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException]
        )
        return wait.until(condition)
    except TimeoutException:
        pytest.fail(f"timed out waiting for {what}; page: {driver.current_url}")


def test_sign_in_watch_a_live_job_and_open_a_rollout(
    ui_stack: LocalStack, db_session_factory: sessionmaker[Session], tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    with unit_of_work(db_session_factory) as session:
        trainer = create_api_key(session, "trainer", tenant="lab", scopes="jobs:read,jobs:write")
        viewer = create_api_key(session, "viewer", tenant="lab", scopes="jobs:read")
    gates = tmp_path / "gates"
    gates.mkdir()
    job_id = _submit(ui_stack, trainer, gates)
    shots = artifacts_dir(tmp_path)
    print(f"\n[ui] screenshots in {shots}")

    with chromium(tmp_path) as driver:
        api = _api(ui_stack)
        # 1. Signing in: the job page sends the browser to the form, then back.
        driver.get(f"{api}/ui/jobs/{job_id}")
        assert "/ui/login" in driver.current_url
        driver.save_screenshot(str(shots / "01-login.png"))
        driver.find_element(By.ID, "api_key").send_keys(viewer)
        driver.find_element(By.ID, "sign-in").click()
        # the path, not the URL's end: the login page's own URL ends with `?next=/ui/jobs/<id>`
        job_path = f"/ui/jobs/{job_id}"
        _wait(driver, lambda d: urlsplit(d.current_url).path == job_path, "the job page")
        cookie = driver.get_cookie("polar_mq_ui_key")
        assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert driver.execute_script("return document.cookie") == ""  # not readable by scripts

        # 2. A live job: release one group at a time and watch the counts move, without reload.
        assert _text(driver, "job-terminal") == "0"
        _wait(
            driver,
            lambda d: d.find_element(By.ID, "live").get_attribute("data-live") == "open",
            "the event stream to open",
        )
        driver.execute_script("window.__no_reload = 'same page'")
        seen = []
        for group in range(N_TASKS):
            (gates / f"group-{group}").touch()
            want = SAMPLES * (group + 1)
            _wait(
                driver,
                lambda d, want=want: int(_text(d, "job-terminal")) >= want,
                f"{want} finished rollouts on the page",
            )
            seen.append(int(_text(driver, "job-terminal")))
            driver.save_screenshot(str(shots / f"02-job-after-group-{group}.png"))
        assert seen == [SAMPLES * (g + 1) for g in range(N_TASKS)]
        _wait(driver, lambda d: _text(d, "job-state") == "completed", "the job to complete")
        _wait(
            driver,
            lambda d: d.find_element(By.ID, "live").get_attribute("data-live") == "done",
            "the stream to end",
        )
        assert driver.execute_script("return window.__no_reload") == "same page"
        updates = int(driver.find_element(By.ID, "live").get_attribute("data-updates") or "0")
        assert updates >= N_TASKS
        assert _text(driver, "job-groups") == str(N_TASKS)
        groups = driver.find_elements(By.CSS_SELECTOR, "#groups tbody tr")
        assert len(groups) == N_TASKS
        assert driver.find_elements(By.CSS_SELECTOR, "#groups svg.hist rect")
        driver.save_screenshot(str(shots / "03-job-completed.png"))
        driver.execute_script("document.getElementById('groups').scrollIntoView()")
        driver.save_screenshot(str(shots / "03-job-groups.png"))

        # 3. A rollout of the first group: timeline, calls, highlighted trajectory, agent log.
        driver.find_element(By.CSS_SELECTOR, "#groups tbody tr a.sample").click()
        _wait(driver, lambda d: "/ui/rollouts/" in d.current_url, "the rollout page")
        rollout_id = uuid.UUID(driver.current_url.rsplit("/", 1)[1])
        assert _text(driver, "rollout-status") == "completed"
        stages = driver.find_elements(By.CSS_SELECTOR, "#stages tbody tr")
        names = [row.find_elements(By.TAG_NAME, "td")[1].text for row in stages]
        assert names == ["prepare", "run_agent", "build", "evaluate"]
        assert all("finished" in row.text for row in stages)
        assert len(driver.find_elements(By.CSS_SELECTOR, "#timeline rect.run")) == 4
        calls = driver.find_elements(By.CSS_SELECTOR, "#calls tbody tr")
        assert len(calls) == 2
        assert all(" ms" in row.text for row in calls)
        trained = driver.find_elements(By.CSS_SELECTOR, "pre.trajectory span.tok.tr")
        assert trained, "no trained token highlighted"
        assert "logprob -" in (trained[0].get_attribute("title") or "")
        background = trained[0].value_of_css_property("background-color")
        assert background in ("rgba(253, 230, 138, 1)", "rgb(253, 230, 138)"), background
        prompt = driver.find_element(By.CSS_SELECTOR, "#sample-0 details pre").get_attribute(
            "textContent"
        )
        assert "<img src=x onerror=window.__xss_task=1>" in (prompt or "")  # as text
        log = driver.find_element(By.CSS_SELECTOR, "pre.log").text
        assert "<script>window.__xss_log = 1</script>" in log
        assert driver.execute_script("return [window.__xss_log, window.__xss_task]") == [
            None,
            None,
        ]
        driver.execute_script("window.scrollTo(0, 0)")
        driver.save_screenshot(str(shots / "04-rollout.png"))
        driver.execute_script(
            "document.querySelector('pre.trajectory').scrollIntoView({block: 'center'})"
        )
        driver.save_screenshot(str(shots / "05-rollout-trajectory.png"))

        # 4. The system page: the stack's workers and its proxy's backend.
        # Workers answer the page's inspect broadcast within a second; on a loaded machine one
        # may miss it: reload until the stack's workers are listed.
        prefix = ui_stack.settings.queue_prefix
        deadline = time.monotonic() + 30
        while True:
            driver.get(f"{api}/ui/system")
            rows = [row.text for row in driver.find_elements(By.CSS_SELECTOR, "#workers tbody tr")]
            if any(prefix in row for row in rows) or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert any(prefix in row for row in rows), rows
        assert driver.find_elements(By.CSS_SELECTOR, "table.proxy tbody tr")
        driver.save_screenshot(str(shots / "06-system.png"))
        driver.get(f"{api}/ui/")
        assert job_id[:8] in driver.find_element(By.ID, "jobs-table").text
        driver.save_screenshot(str(shots / "07-jobs.png"))
    print(f"[ui] rollout {rollout_id}: {sorted(p.name for p in shots.iterdir())}")
