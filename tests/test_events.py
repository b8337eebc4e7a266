"""Domain events reach their subscribers with what was published, and nothing else does."""

from __future__ import annotations

import pytest

from gpuplatform import events


@pytest.fixture
def topic(monkeypatch):
    monkeypatch.setattr(events, "_subscribers", {})
    return "a-topic"


def test_a_subscriber_hears_what_was_published(topic) -> None:
    heard = []
    events.subscribe(topic, lambda *args, **kwargs: heard.append((args, kwargs)))
    events.publish(topic, [1, 2], node_id=3)
    assert heard == [(([1, 2],), {"node_id": 3})]


def test_a_topic_nobody_follows_is_published_to_nobody(topic) -> None:
    heard = []
    events.subscribe("another", heard.append)
    events.publish(topic, "x")
    assert heard == []


def test_subscribing_twice_hears_once(topic) -> None:
    heard = []
    events.subscribe(topic, heard.append)
    events.subscribe(topic, heard.append)
    events.publish(topic, "x")
    assert heard == ["x"]


def test_the_live_pages_follow_every_topic_the_domain_publishes() -> None:
    assert len(events.TOPICS) == 8
    assert all(events._subscribers.get(topic) for topic in events.TOPICS)
