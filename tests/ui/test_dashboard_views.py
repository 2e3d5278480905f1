"""The dashboard's view logic without a server: timelines from events, token text, charts."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx

from polar_mq.jobs.read_models import EventRecord, TrajectorySampleRecord
from polar_mq.ui.charts import histogram, progress, reward_scale, stage_lines
from polar_mq.ui.live import RenderCache, Rendered
from polar_mq.ui.timeline import stage_spans, timeline
from polar_mq.ui.tokens_text import TokenDecoder
from polar_mq.ui.trajectory_view import sample_view

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def ev(
    i: int, stage: str, kind: str, attempt: int = 1, s: float = 0.0, **detail: object
) -> EventRecord:
    return EventRecord(i, stage, kind, attempt, "w", T0 + timedelta(seconds=s), dict(detail))


def test_timeline_has_queue_waits_retries_and_a_second_attempt_after_a_lost_lease() -> None:
    events = [
        ev(1, "prepare", "submitted", s=0),
        ev(2, "prepare", "started", s=1),
        ev(3, "prepare", "finished", s=2),
        ev(4, "run_agent", "started", s=5),
        ev(5, "run_agent", "retried", s=6),
        ev(6, "run_agent", "started", s=8),
        ev(7, "run_agent", "requeued", 2, s=20, reason="worker_lost"),
        ev(8, "prepare", "started", 2, s=21),
        ev(9, "prepare", "finished", 2, s=22),
        ev(10, "run_agent", "started", 2, s=23),
    ]
    spans, lost = stage_spans(events)
    assert lost == 1
    assert [(s.attempt, s.stage, s.outcome) for s in spans] == [
        (1, "prepare", "finished"),
        (1, "run_agent", "retried"),  # given up for attempt 2: closed at the requeue
        (2, "prepare", "finished"),
        (2, "run_agent", "running"),
    ]
    first_agent = spans[1]
    assert first_agent.starts == 2 and first_agent.wait_s == 3.0  # ready at 2, first start at 5
    assert spans[2].queued_at == T0 + timedelta(seconds=20)  # the requeue made it ready again
    chart = timeline(events, now=T0 + timedelta(seconds=30), width=300)
    assert chart.total_s == 30.0  # running spans extend to now
    assert chart.bars[0].wait_x == 0.0 and chart.bars[0].wait_w == 10.0  # 1 s of 30 on 300 px
    assert chart.bars[-1].run_x + chart.bars[-1].run_w == 300.0


def test_resumed_stage_is_queued_again_in_the_same_attempt() -> None:
    events = [
        ev(1, "build", "started", s=0),
        ev(2, "build", "requeued", s=5, resumed=True),
        ev(3, "build", "started", s=6),
        ev(4, "build", "finished", s=7),
    ]
    spans, lost = stage_spans(events)
    assert lost == 1
    assert [(s.stage, s.starts, s.outcome) for s in spans] == [
        ("build", 2, "finished"),
        ("evaluate", 0, "queued"),
    ]


def test_token_text_comes_from_the_engine_once_and_is_cached() -> None:
    asked: list[list[int]] = []

    def engine(request: httpx.Request) -> httpx.Response:
        tokens = json.loads(request.content)["tokens"]
        asked.append(tokens)
        return httpx.Response(200, json={"prompt": f"<{tokens[0]}>"})

    decoder = TokenDecoder("http://engine", "m", transport=httpx.MockTransport(engine))
    assert decoder.decode([5, 6]) == {5: "<5>", 6: "<6>"}
    assert decoder.decode([6, 7]) == {6: "<6>", 7: "<7>"}
    assert asked == [[5], [6], [7]]


def test_an_unreachable_engine_is_left_alone_for_a_while() -> None:
    calls = 0
    now = [0.0]

    def engine(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ConnectError("refused", request=request)

    decoder = TokenDecoder(
        "http://engine", None, transport=httpx.MockTransport(engine), clock=lambda: now[0]
    )
    assert decoder.decode([1, 2, 3]) == {}
    assert decoder.decode([1, 2, 3]) == {}
    assert calls == 1
    now[0] = 31.0
    decoder.decode([1])
    assert calls == 2


def test_trained_tokens_are_their_own_pieces_and_glue_is_merged() -> None:
    sample = TrajectorySampleRecord(
        sample_index=0, builder="prefix_merge", prompt_ids=[1, 2],
        response_ids=[10, 11, 12, 13, 14], loss_mask=[1, 1, 0, 0, 1],
        logprobs=[-0.5, -0.25, 0.0, 0.0, -1.0], messages=None, meta={},
    )  # fmt: skip
    texts = {1: "<s>", 2: "hi", 10: "A", 11: "B", 12: "\n", 13: "tool", 14: "C"}
    view = sample_view(sample, texts)
    assert view.prompt_text == "<s>hi"
    assert [(p.text, p.trained) for p in view.pieces] == [
        ("A", True),
        ("B", True),
        ("\ntool", False),
        ("C", True),
    ]
    assert view.pieces[0].title == "id 10 · logprob -0.5000"
    assert view.pieces[2].title == "ids 12…13 · not trained (mask 0)"
    assert view.n_trained == 3
    assert sample_view(sample, {}).pieces[0].text == "⟨10⟩"  # unknown text: the id


def test_histograms_share_a_scale_and_progress_is_a_step_line() -> None:
    low, high = reward_scale([0.0, 1.0, 0.5])
    h = histogram([0.0, 1.0, 1.0], low, high, bins=4)
    assert h.counts == [1, 0, 0, 2]
    assert len(h.bars(100, 20)) == 2 and h.bars(100, 20)[1][3] == 20.0
    assert reward_scale([]) == (0.0, 1.0) and reward_scale([2.0]) == (1.5, 2.5)
    line = progress(T0, [T0 + timedelta(seconds=5), T0 + timedelta(seconds=10)], 100, 10, 4)
    assert line is not None
    assert line.points == "0,10 50.0,10.0 50.0,7.5 100.0,7.5 100.0,5.0 100,5.0"
    assert progress(T0, [], 100, 10, 4) is None


def test_stage_lines_count_running_rollouts_per_stage() -> None:
    s = [T0 + timedelta(seconds=x) for x in range(11)]
    intervals = [("prepare", s[0], s[2]), ("prepare", s[1], s[2]), ("run_agent", s[2], None)]
    lines = stage_lines(intervals, ["prepare", "run_agent"], now=s[10], width=10, height=2,
                        points=11)  # fmt: skip
    assert lines is not None and lines.peak == 2 and lines.total_s == 10.0
    prepare = [float(p.split(",")[1]) for p in lines.lines["prepare"].split()]
    assert prepare[:4] == [1.0, 0.0, 0.0, 2.0]  # 1 running, then 2, then none (height 2 = 0)
    agent = [float(p.split(",")[1]) for p in lines.lines["run_agent"].split()]
    assert agent[1] == 2.0 and agent[2:] == [1.0] * 9  # the open run lasts until now
    assert stage_lines([], ["prepare"], s[0], 10, 2) is None


def test_render_cache_renders_a_page_once_per_fingerprint_and_forgets_the_oldest() -> None:
    renders: list[str] = []

    def render(name: str) -> Rendered:
        renders.append(name)
        return Rendered(f"<p>{name}</p>", done=False)

    cache = RenderCache(max_entries=2)
    assert cache.get_or_render(("job", "a"), lambda: render("a")).html == "<p>a</p>"
    assert cache.get_or_render(("job", "a"), lambda: render("a-again")).html == "<p>a</p>"
    cache.get_or_render(("job", "b"), lambda: render("b"))
    cache.get_or_render(("job", "c"), lambda: render("c"))  # evicts a
    cache.get_or_render(("job", "a"), lambda: render("a2"))
    assert renders == ["a", "b", "c", "a2"]
