"""A node agent's words about an attempt's end (``nodeagent.launcher.limithits``,
``logfaults``) read back as reasons (``scheduling.agent_notes``), English to the letter, and in
Chinese without the English."""

from __future__ import annotations

import errno
import re

import pytest
from django.utils import translation

from nodeagent.launcher import limithits, logfaults
from scheduling import reasons
from scheduling.agent_notes import of_note, of_problem


class Tracker:
    def __init__(self, oom=0, refused=0, periods=0, throttled=0):
        self.figures = (oom, refused, periods, throttled)

    def oom_kills(self):
        return self.figures[0]

    def pids_refused(self):
        return self.figures[1]

    def cpu_throttling(self):
        return self.figures[2], self.figures[3]


RESOURCES = {"pids": 64, "cpus": 0.5}
CODES = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.ENOENT, errno.EIO)
FAULTS = [OSError(code, "No space left on device") for code in CODES]
NOTES = [
    limithits.limits_hit(Tracker(refused=3, periods=10, throttled=9), RESOURCES, 0, plain=True)[1],
    *(logfaults.lost(fault, 2048) for fault in FAULTS),
    logfaults.lost(None, 0),
    logfaults.lost(FAULTS[0], 0),
    "; ".join([
        limithits.limits_hit(Tracker(periods=10, throttled=9), RESOURCES, 0, plain=True)[1],
        logfaults.lost(FAULTS[2], 10),
    ]),
]  # fmt: skip
PROBLEMS = [
    limithits.limits_hit(Tracker(oom=1), RESOURCES, 137, plain=True)[0],
    limithits.limits_hit(Tracker(refused=5), RESOURCES, 1, plain=True)[0],
]


def english_words(text: str) -> list[str]:
    allowed = {"resources", "pids", "cpus", "memory", "CPU", "No", "space", "left", "device"}
    return [w for w in re.findall(r"[A-Za-z]{3,}", text) if w not in allowed]


@pytest.mark.parametrize("note", NOTES)
def test_each_note_of_the_agent_is_reasons_with_its_english_to_the_letter(note):
    made = of_note(note)
    assert all(reason.code != reasons.TEXT for reason in made), made
    assert "; ".join(reason.text for reason in made) == note
    with translation.override("zh-hans"):
        chinese = "; ".join(reason.rendered for reason in made)
    assert english_words(chinese) == [], chinese


@pytest.mark.parametrize("problem", PROBLEMS)
def test_each_problem_of_the_agent_is_a_reason_with_its_english_to_the_letter(problem):
    reason = of_problem(problem)
    assert reason.code != reasons.TEXT and reason.text == problem
    with translation.override("zh-hans"):
        assert english_words(reason.rendered) == [], reason.rendered


def test_words_it_does_not_know_stay_as_written():
    assert of_note("") == []
    for text in ("output lost somehow", "hit the process limit (resources.pids: 1; x forks)"):
        assert of_note(text) == [reasons.of(text)]
        assert of_problem(text) == reasons.of(text)
