"""The SDK's warning about keyed tasks waiting on a worker that does not take them: logged
when the server names queues, again when they change or every ``repeat_s`` while they stay
the same, never for an empty answer."""

from __future__ import annotations

import logging

import pytest
from orbit_sdk._keyed import KeyedWaitingLog


def test_logged_on_change_and_repeated_only_after_repeat_s(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    log = KeyedWaitingLog(repeat_s=600, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="orbit_sdk.connection"):
        log.note([])
        log.note(["b", "a"])
        now[0] = 60
        log.note(["a", "b"])  # the same queues a minute later: not again
        log.note(["a"])  # changed
        now[0] = 700
        log.note(["a"])  # the same, but ten minutes on
        log.note([])
        log.note(["a"])  # came back
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 4, said
    assert "queue(s) a, b," in said[0] and all("queue(s) a," in m for m in said[1:])
