"""The dashboard pages show what the read services say, escaped, and stream updates over SSE."""

from __future__ import annotations

import html
import re
import uuid
from datetime import timedelta

import orjson
from fastapi.testclient import TestClient
from markupsafe import escape
from sqlalchemy.orm import Session, sessionmaker
from ui_support import sign_in, submit

from polar_mq.infra.db import unit_of_work
from polar_mq.models import LlmCall, Rollout, RolloutArtifact
from polar_mq.models.base import utcnow
from polar_mq.ui.live import digest
from tests.api.api_support import complete_rollout, fail_rollout
from tests.ui.conftest import Keys

XSS = '<script>alert("xss")</script>'
XSS_IMG = "<img src=x onerror=alert(1)>"


def _finished_job(
    client: TestClient, keys: Keys, factory: sessionmaker[Session]
) -> tuple[uuid.UUID, list[uuid.UUID]]:
    """Two groups of three: rewards 1, 0, 1 and 1, 1, runtime_error."""
    job, rollouts = submit(
        client, keys.alice_write, [{"instruction": "a"}, {"instruction": "b"}], 3,
        metadata={"name": "ui-test"},
    )  # fmt: skip
    start = utcnow()
    for i, (rid, reward) in enumerate(zip(rollouts[:5], [1.0, 0.0, 1.0, 1.0, 1.0], strict=True)):
        complete_rollout(factory, rid, reward, finished_at=start + timedelta(seconds=i))
    fail_rollout(factory, rollouts[5], "runtime_error", finished_at=start + timedelta(seconds=9))
    return job, rollouts


def test_job_page_shows_stages_groups_histograms_slowest_and_failed(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session]
) -> None:
    job, rollouts = _finished_job(client, keys, db_session_factory)
    sign_in(client, keys.alice_read)
    page = client.get(f"/ui/jobs/{job}")
    assert page.status_code == 200
    text = page.text
    assert 'id="job-terminal">6<' in text
    assert 'id="job-groups">2<' in text
    assert 'id="job-reward">0.8<' in text  # 4 of 5 scored rewards are 1; the failure is unscored
    assert "runtime_error 1" in text
    groups = text.split('id="groups"', 1)[1].split("</table>", 1)[0]
    rows = groups.split("<tr>")[2:]
    assert len(rows) == 2
    assert ">3 / 3<" in rows[0] and ">0.667<" in rows[0] and ">0.471<" in rows[0]
    assert "+0.71" in rows[0] and "-1.41" in rows[0]  # GRPO advantages of rewards 1 and 0
    assert ">2 / 3<" in rows[1] and "incomplete" in rows[1]
    assert len(re.findall(r"<rect ", rows[0])) == 2  # rewards 0 and 1: two bars
    assert "<polyline" in text  # finished over time
    assert text.count('class="stage-line s-') == 4  # running per stage over time
    failed = text.split('id="failed"', 1)[1].split("</table>", 1)[0]
    assert str(rollouts[5])[:8] in failed and "container vanished" in failed
    slowest = text.split('id="slowest"', 1)[1].split("</table>", 1)[0]
    assert slowest.count("/ui/rollouts/") == 5  # the failure never recorded a start
    assert "data-live-src" not in text  # finished: nothing left to follow


def test_rollout_page_shows_timeline_calls_trajectory_and_artifacts(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session]
) -> None:
    _, rollouts = _finished_job(client, keys, db_session_factory)
    with unit_of_work(db_session_factory) as session:
        session.add(
            RolloutArtifact(
                rollout_id=rollouts[0],
                attempt=1,
                name="agent.log",
                media_type="text/plain",
                size=11,
                truncated=False,
                content=b"agent said\n",
            )
        )
    sign_in(client, keys.alice_read)
    text = client.get(f"/ui/rollouts/{rollouts[0]}").text
    stages = text.split('id="stages"', 1)[1].split("</table>", 1)[0]
    for stage in ("prepare", "run_agent", "build", "evaluate"):
        assert f"<td>{stage}</td>" in stages
    assert stages.count(">finished<") == 4
    assert ">1.50 s<" in stages  # each stage ran 1.5 s
    assert ">500 ms<" in stages  # and waited 0.5 s after the previous one
    assert text.count('class="wait"') == 4
    calls = text.split('id="calls"', 1)[1].split("</table>", 1)[0]
    assert calls.count("12.5 ms") == 2 and calls.count("3.0 ms") == 2
    assert ">fake<" in calls and ">3<" in calls  # backend and policy version
    spans = re.findall(r'<span class="tok tr" title="([^"]*)">', text)
    assert spans == ["id 7 · logprob -0.5000", "id 8 · logprob -0.2500"] * 2
    assert "agent said" in text
    raw = client.get(f"/ui/rollouts/{rollouts[0]}/artifacts/agent.log")
    assert raw.content == b"agent said\n"
    assert raw.headers["content-type"].startswith("text/plain")
    assert "sandbox" in raw.headers["content-security-policy"]
    failed = client.get(f"/ui/rollouts/{rollouts[5]}").text
    assert 'id="termination">runtime_error<' in failed
    assert ">failed<" in failed.split('id="stages"', 1)[1]


def test_agent_controlled_text_is_escaped_everywhere(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session]
) -> None:
    job, rollouts = submit(
        client, keys.alice_write, [{"instruction": XSS}], 1, metadata={"name": XSS}
    )
    rid = rollouts[0]
    complete_rollout(db_session_factory, rid, 1.0)
    with unit_of_work(db_session_factory) as session:
        session.get_one(Rollout, rid).error = XSS_IMG
        session.add(
            RolloutArtifact(
                rollout_id=rid,
                attempt=1,
                name=f"log{XSS}",
                media_type="text/html",
                size=len(XSS),
                truncated=False,
                content=XSS.encode(),
            )
        )
        session.add(
            RolloutArtifact(
                rollout_id=rid,
                attempt=1,
                name="agent.log",
                media_type="text/plain",
                size=len(XSS_IMG),
                truncated=False,
                content=XSS_IMG.encode(),
            )
        )
        # the token strings of a call come from the model: a payload among them
        call = session.query(LlmCall).filter_by(rollout_id=rid, seq=0).one()
        call.response = {
            "choices": [
                {"logprobs": {"content": [{"token": XSS, "logprob": -0.5}, {"token": XSS_IMG}]}}
            ]
        }
        call.backend = XSS
    sign_in(client, keys.alice_read)
    pages = [
        client.get("/ui/").text,
        client.get(f"/ui/jobs/{job}").text,
        client.get(f"/ui/rollouts/{rid}").text,
    ]
    for text in pages:
        assert "<script>alert" not in text
        assert "<img src=x" not in text
    assert str(escape(XSS)) in pages[0]  # the job's name, shown as text
    assert "&lt;script&gt;alert(" in pages[1]  # its metadata, as JSON text
    rollout_page = pages[2]
    assert 'title="id 7 · logprob -0.5000">&lt;script&gt;alert(&#34;xss&#34;)&lt;/script&gt;<' in (
        rollout_page
    )
    assert "&lt;img src=x onerror=alert(1)&gt;" in rollout_page
    raw = client.get(f"/ui/rollouts/{rid}/artifacts/log{XSS}")
    assert raw.status_code == 200
    assert raw.headers["content-type"].startswith("text/plain")  # never served as HTML
    assert raw.headers["x-content-type-options"] == "nosniff"


def _events(body: str) -> list[tuple[str, dict[str, object]]]:
    out = []
    for block in body.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            out.append((lines["event"], orjson.loads(lines["data"])))
    return out


def test_live_stream_sends_the_rendered_page_part_and_ends_with_the_job(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session]
) -> None:
    job, _ = _finished_job(client, keys, db_session_factory)
    sign_in(client, keys.alice_read)
    with client.stream("GET", f"/ui/jobs/{job}/live", params={"since": "stale"}) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        body = "".join(stream.iter_text())
    events = _events(body)
    assert [kind for kind, _ in events] == ["update", "end"]
    update = events[0][1]
    assert update["done"] is True
    assert 'id="job-terminal">6<' in str(update["html"])
    assert "<html" not in str(update["html"])  # only the live part


def test_page_fingerprint_changes_when_a_rollout_finishes(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session]
) -> None:
    job, rollouts = submit(client, keys.alice_write, [{"instruction": "a"}], 2)
    sign_in(client, keys.alice_read)
    before = client.get(f"/ui/jobs/{job}").text
    src = re.search(r'data-live-src="([^"]+)"', before)
    assert src is not None
    complete_rollout(db_session_factory, rollouts[0], 1.0)
    after = client.get(f"/ui/jobs/{job}").text
    since_before = src.group(1).rsplit("since=", 1)[1]
    since_after = re.search(r"since=([0-9a-f]+)", after)
    assert since_after is not None and since_after.group(1) != since_before
    assert len(digest(("x",))) == 16


def test_a_running_rollout_page_follows_its_stream_until_it_ends(
    client: TestClient, keys: Keys, db_session_factory: sessionmaker[Session]
) -> None:
    _, rollouts = submit(client, keys.alice_write, [{"instruction": "a"}], 1)
    sign_in(client, keys.alice_read)
    running = client.get(f"/ui/rollouts/{rollouts[0]}").text
    assert f'data-live-src="/ui/rollouts/{rollouts[0]}/live?since=' in running
    complete_rollout(db_session_factory, rollouts[0], 1.0)
    finished = client.get(f"/ui/rollouts/{rollouts[0]}").text
    assert "data-live-src" not in finished
    with client.stream("GET", f"/ui/rollouts/{rollouts[0]}/live", params={"since": "x"}) as s:
        events = _events("".join(s.iter_text()))
    assert [kind for kind, _ in events] == ["update", "end"]
    assert 'id="rollout-status">completed<' in str(events[0][1]["html"])


def test_groups_are_paged_in_task_order(client: TestClient, keys: Keys) -> None:
    job, _ = submit(client, keys.alice_write, [{"instruction": f"t{i}"} for i in range(205)], 1)
    sign_in(client, keys.alice_read)
    first = client.get(f"/ui/jobs/{job}").text
    rows = first.split('id="groups"', 1)[1].split("</table>", 1)[0].count("<tr>") - 1
    assert rows == 200
    found = re.search(r'id="next-groups" href="([^"]+)"', first)
    assert found is not None
    second = client.get(html.unescape(found.group(1))).text
    tail = second.split('id="groups"', 1)[1].split("</table>", 1)[0]
    assert tail.count("<tr>") - 1 == 5
    assert '<td class="num">200</td>' in tail and '<td class="num">204</td>' in tail
    assert "next-groups" not in second
    assert client.get(f"/ui/jobs/{job}", params={"groups": "garbage"}).status_code == 400
