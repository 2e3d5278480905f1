"""The job page's plots, the reward explained on the rollout page, the calls' bodies opened on
demand, search, the cross-job view and the cancel button (TestClient on a real PostgreSQL)."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from ui_support import sign_in, submit

from polar_mq.infra.db import unit_of_work
from polar_mq.models import Evaluation, Job, LlmCall, Rollout, RolloutStatus
from polar_mq.models.base import utcnow
from tests.api.api_support import complete_rollout, fail_rollout
from tests.ui.conftest import Keys

XSS = '<script>alert("xss")</script>'


def _job(
    client: TestClient, keys: Keys, factory: sessionmaker[Session]
) -> tuple[uuid.UUID, list[uuid.UUID]]:
    """Group 0: rewards 1, 0, 1 (a signal); group 1: 1, 1 and a runtime_error (no signal)."""
    job, rollouts = submit(
        client,
        keys.alice_write,
        [{"instruction": "add 2 and 2", "answer": "4"}, {"instruction": "name a prime"}],
        3,
        metadata={"name": "insights"},
        evaluator="completed",
    )
    start = utcnow()
    for i, (rid, reward) in enumerate(zip(rollouts[:5], [1.0, 0.0, 1.0, 1.0, 1.0], strict=True)):
        complete_rollout(
            factory, rid, reward, finished_at=start + timedelta(seconds=i), policy_version=i // 3
        )
    fail_rollout(factory, rollouts[5], "runtime_error", finished_at=start + timedelta(seconds=9))
    return job, rollouts


def _section(text: str, marker: str) -> str:
    return text.split(marker, 1)[1].split("</figure>", 1)[0]


def test_job_page_plots_rewards_signal_tokens_latency_versions_throughput(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session]
) -> None:
    job, _ = _job(client, keys, db_session_factory)
    sign_in(client, keys.alice_read)
    text = client.get(f"/ui/jobs/{job}").text
    assert 'data-no-signal="1">1</span> / 2<' in text
    assert "50% of the ended groups" in text  # group 1 (1, 1) has no signal, group 0 has
    rewards = _section(text, 'id="plot-rewards"')
    assert 'data-n="5"' in rewards and "mean 0.8" in rewards
    assert len(re.findall(r'<rect class="bar"', rewards)) == 2  # rewards 0 and 1
    calls = _section(text, 'id="plot-call-tokens"')
    assert 'data-n="10"' in calls and "mean 2 " in calls  # 5 rollouts x 2 calls of 2 tokens
    assert "mean 12.5" in _section(text, 'id="plot-call-latency"')
    assert "mean 4 " in _section(text, 'id="plot-rollout-tokens"')
    assert "mean 10 " in _section(text, 'id="plot-rollout-seconds"')  # each took 10 s
    versions = _section(text, 'id="plot-versions"')
    assert 'data-versions="2"' in versions
    assert "v0: mean 0.667 over 3 rollouts" in versions
    assert "v1: mean 1 over 2 rollouts" in versions
    rate = _section(text, 'id="plot-rollouts-rate"')
    assert sum(int(n) for n in re.findall(r": (\d+) rollouts", rate)) == 6
    tokens = _section(text, 'id="plot-tokens-rate"')
    assert sum(int(n) for n in re.findall(r": (\d+) tokens", tokens)) == 20
    groups = text.split('id="groups"', 1)[1].split("</table>", 1)[0]
    assert '<td class="task-text">add 2 and 2</td>' in groups
    assert '<td class="task-text">name a prime</td>' in groups


def _evaluation(
    factory: sessionmaker[Session], rollout_id: uuid.UUID, name: str, reward: float | None,
    detail: dict[str, object],
) -> None:  # fmt: skip
    with unit_of_work(factory) as session:
        row = session.query(Evaluation).filter_by(rollout_id=rollout_id).one()
        row.evaluator, row.reward, row.detail = name, reward, detail
        session.get_one(Rollout, rollout_id).reward = reward


def test_rollout_page_explains_an_exact_match_reward(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session]
) -> None:
    _, rollouts = _job(client, keys, db_session_factory)
    _evaluation(
        db_session_factory, rollouts[1], "exact_match", 0.0, {"answer": "5", "expected": ["4"]}
    )
    sign_in(client, keys.alice_read)
    text = client.get(f"/ui/rollouts/{rollouts[1]}").text
    why = text.split('id="reward-explained"', 1)[1].split("</section>", 1)[0]
    assert '<pre class="text instruction">add 2 and 2</pre>' in why
    assert '<code class="task-answer">4</code>' in why
    assert '<code class="expected">4</code>' in why
    assert '<code class="graded">5</code>' in why
    assert 'data-evaluator="exact_match"' in why


def test_rollout_page_shows_the_evaluators_error(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session]
) -> None:
    _, rollouts = _job(client, keys, db_session_factory)
    _evaluation(
        db_session_factory, rollouts[3], "exact_match", None,
        {"error": "task has no 'answer' field"},
    )  # fmt: skip
    sign_in(client, keys.alice_read)
    text = client.get(f"/ui/rollouts/{rollouts[3]}").text
    assert '<p class="error eval-error">task has no &#39;answer&#39; field</p>' in text
    assert '<span class="tag bad">unscored</span>' in text
    infra = client.get(f"/ui/rollouts/{rollouts[5]}").text
    assert "not scored: the rollout ended with runtime_error" in infra


def test_rollout_page_shows_a_swe_diff_and_each_tests_outcome(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session]
) -> None:
    _, rollouts = _job(client, keys, db_session_factory)
    tests_detail = {
        "mode": "diff",
        "diff": f"--- a/calc.py\n+++ b/calc.py\n+# {XSS}\n",
        "diff_truncated": False,
        "tampering": ["tests/test_calc.py"],
        "tests_passed": ["tests/test_calc.py::test_add"],
        "tests_failed": ["tests/test_calc.py::test_div"],
        "tests_skipped": [],
        "tests_missing": ["tests/test_calc.py::test_mul"],
        "counts": {"passed": 1, "failed": 1, "skipped": 0, "missing": 1},
    }
    detail = {"parts": [{"name": "tests", "weight": 1.0, "reward": 0.0, "detail": tests_detail}]}
    _evaluation(db_session_factory, rollouts[0], "weighted", 0.0, detail)
    sign_in(client, keys.alice_read)
    text = client.get(f"/ui/rollouts/{rollouts[0]}").text
    assert "<script>alert" not in text
    diff = text.split('id="diff-0-1"', 1)[1].split("</details>", 1)[0]
    assert "+# &lt;script&gt;alert(&#34;xss&#34;)&lt;/script&gt;" in diff
    assert "dropped (protected paths): tests/test_calc.py" in diff
    tests = text.split('id="tests-0-1"', 1)[1].split("</table>", 1)[0]
    outcomes = re.findall(r"<code>([^<]+)</code></td><td><span class=\"tag[^\"]*\">(\w+)<", tests)
    assert outcomes == [
        ("tests/test_calc.py::test_add", "passed"),
        ("tests/test_calc.py::test_div", "failed"),
        ("tests/test_calc.py::test_mul", "missing"),
    ]


def test_a_calls_request_and_response_open_as_inert_text(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session]
) -> None:
    _, rollouts = _job(client, keys, db_session_factory)
    rid = rollouts[0]
    with unit_of_work(db_session_factory) as session:
        call = session.query(LlmCall).filter_by(rollout_id=rid, seq=0).one()
        call.request = {"messages": [{"role": "user", "content": XSS}]}
        call.response = {"choices": [{"message": {"content": XSS + "x" * 300_000}}]}
        call_id = call.id
    sign_in(client, keys.alice_read)
    page = client.get(f"/ui/rollouts/{rid}").text
    assert "<script>alert" not in page and "alert(" not in page  # bodies are not in the page
    src = f"/ui/rollouts/{rid}/calls/{call_id}/request"
    assert f'data-lazy-src="{src}"' in page
    request = client.get(src)
    assert request.status_code == 200
    assert request.headers["content-type"].startswith("text/plain")
    assert request.headers["x-content-type-options"] == "nosniff"
    assert "sandbox" in request.headers["content-security-policy"]
    assert XSS.replace('"', '\\"') in request.text  # the JSON text, as sent
    response = client.get(f"/ui/rollouts/{rid}/calls/{call_id}/response")
    assert len(response.text) < 270_000 and "more chars)" in response.text  # capped
    assert client.get(f"/ui/rollouts/{rid}/calls/{call_id}/secrets").status_code == 404
    assert client.get(f"/ui/rollouts/{rid}/calls/{uuid.uuid4()}/request").status_code == 404
    sign_in(client, keys.bob_read)
    assert client.get(src).status_code == 404  # another tenant's call: as if missing


def test_search_by_task_text_status_and_reason(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session]
) -> None:
    job, rollouts = _job(client, keys, db_session_factory)
    submit(client, keys.bob_write, [{"instruction": "add 2 and 2 (bob)"}], 1)
    sign_in(client, keys.alice_read)
    text = client.get("/ui/search", params={"q": "ADD 2"}).text
    hits = text.split('id="rollout-hits"', 1)[1].split("</table>", 1)[0]
    assert hits.count("/ui/rollouts/") == 3 and "(bob)" not in hits
    assert f"/ui/jobs/{job}" in text.split('id="job-hits"', 1)[1]
    by_reason = client.get("/ui/search", params={"reason": "runtime_error"}).text
    hits = by_reason.split('id="rollout-hits"', 1)[1].split("</table>", 1)[0]
    assert hits.count("/ui/rollouts/") == 1 and str(rollouts[5])[:8] in hits
    by_status = client.get("/ui/search", params={"status": "completed", "q": "prime"}).text
    assert by_status.split('id="rollout-hits"', 1)[1].split("</table>")[0].count("<tr>") == 3
    wildcard = client.get("/ui/search", params={"q": "%"}).text  # LIKE's wildcard is literal
    assert "no rollout matches" in wildcard
    bad = client.get("/ui/search", params={"status": "finished"})
    assert bad.status_code == 400
    assert "unknown status &#39;finished&#39;; one of held, queued" in bad.text


def test_compare_view_puts_jobs_side_by_side(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session]
) -> None:
    first, _ = _job(client, keys, db_session_factory)
    second, (only,) = submit(client, keys.alice_write, [{"instruction": "x"}], 1)
    complete_rollout(db_session_factory, only, 0.25)
    bobs, _ = submit(client, keys.bob_write, [{"instruction": "y"}], 1)
    sign_in(client, keys.alice_read)
    text = client.get("/ui/compare").text
    table = text.split('id="compare-table"', 1)[1].split("</table>", 1)[0]
    rows = dict(re.findall(r'<tr data-job="([^"]+)">(.*?)</tr>', table, re.S))
    assert set(rows) == {str(first), str(second)}  # bob's job is not offered
    assert 'data-metric="mean_reward">0.8<' in rows[str(first)]
    assert 'data-metric="no_signal">50%<' in rows[str(first)]
    assert 'data-metric="tokens_per_rollout">3.33<' in rows[str(first)]  # 20 tokens, 6 ended
    assert 'data-metric="mean_reward">0.25<' in rows[str(second)]
    picked = client.get("/ui/compare", params={"jobs": [str(second), str(bobs)]}).text
    table = picked.split('id="compare-table"', 1)[1].split("</table>", 1)[0]
    assert str(second) in table and str(first) not in table and str(bobs) not in table


def test_cancel_button_needs_the_scope_and_a_same_site_post(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session]
) -> None:
    job, _ = submit(client, keys.alice_write, [{"instruction": "a"}], 2)
    url = f"/ui/jobs/{job}/cancel"
    sign_in(client, keys.alice_read)
    assert 'id="cancel-job"' not in client.get(f"/ui/jobs/{job}").text
    assert client.post(url).status_code == 403
    sign_in(client, keys.bob_write)
    assert client.post(url).status_code == 404  # another tenant's job
    sign_in(client, keys.alice_write)
    assert 'id="cancel-job"' in client.get(f"/ui/jobs/{job}").text
    assert client.post(url, headers={"sec-fetch-site": "cross-site"}).status_code == 403
    assert client.post(url, headers={"origin": "https://evil.example"}).status_code == 403
    with db_session_factory() as session:
        assert session.get_one(Job, job).cancelled_at is None
    answer = client.post(url, headers={"sec-fetch-site": "same-origin"})
    assert answer.status_code == 303 and answer.headers["location"] == f"/ui/jobs/{job}"
    with db_session_factory() as session:
        assert session.get_one(Job, job).cancelled_at is not None
        statuses = {r.status for r in session.query(Rollout).filter_by(job_id=job)}
    assert statuses == {RolloutStatus.CANCELLED}
    page = client.get(f"/ui/jobs/{job}").text
    assert 'data-state="cancelled"' in page and 'id="cancel-job"' not in page
