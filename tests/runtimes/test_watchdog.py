"""The one deadline/inactivity decision both exec supervisors (host and docker) use."""

from __future__ import annotations

from polar_mq.runtimes.process_kit import Watchdog


def test_the_deadline_kills_and_is_the_next_wake_otherwise() -> None:
    dog = Watchdog(deadline=10.0, inactivity_s=None, activity=None, last_seen=0.0)
    assert dog.check(5.0) == (None, 10.0)
    assert dog.check(10.0) == ("timeout", 10.0)


def test_silence_past_the_inactivity_limit_kills_unless_activity_says_otherwise() -> None:
    dog = Watchdog(deadline=100.0, inactivity_s=3.0, activity=None, last_seen=0.0)
    assert dog.check(1.0) == (None, 3.0)
    assert dog.check(3.0) == ("inactive", 3.0)
    calls = []

    def activity() -> float:
        calls.append(1)
        return 4.0  # the agent's last proxied call

    dog = Watchdog(deadline=100.0, inactivity_s=3.0, activity=activity, last_seen=0.0)
    assert dog.check(2.0) == (None, 3.0) and calls == []  # output alone still says alive
    assert dog.check(5.0) == (None, 7.0) and calls == [1]  # asked once silent: alive till 7
    assert dog.check(7.5) == ("inactive", 7.5)


def test_a_failing_activity_probe_reports_nothing_new_and_raises_nothing() -> None:
    def broken() -> float:
        raise RuntimeError("database down")

    dog = Watchdog(deadline=float("inf"), inactivity_s=3.0, activity=broken, last_seen=0.0)
    dog.saw_output()  # output keeps it alive whatever the probe does
    assert dog.check(dog.last_seen + 1.0)[0] is None
    assert dog.check(dog.last_seen + 3.5)[0] == "inactive"  # silent, and the probe knows nothing


def test_output_resets_the_silence() -> None:
    dog = Watchdog.start(timeout=None, inactivity_s=60.0, activity=None)
    before = dog.last_seen
    dog.saw_output()
    assert dog.last_seen >= before and dog.deadline == float("inf")
