"""What a node agent says of an attempt's end (the limits it hit, the output it lost), as
reasons of ``scheduling.reasons``' catalogue, so that it reads in each reader's language.

The agent reports English text (``nodeagent.launcher.limithits`` and ``logfaults`` write it).
Each part it may say has a pattern here that reads its figures back; the reasons made of them
must give the agent's words to the letter, or the text stays a ``text`` reason, as written: a
newer agent's words are never garbled, only left untranslated.
"""

from __future__ import annotations

import re

from scheduling import reasons
from scheduling.reasons import Reason

# Why output was lost (``logfaults.why``), as codes.
_LOG_FAULTS = {
    "the log disk is full": "log_full",
    "the log disk is full (quota)": "log_full_quota",
    "the log disk is read-only": "log_read_only",
    "the log directory refuses writes": "log_refused",
    "the log directory is gone": "log_gone",
    "the log was removed while the task ran": "log_removed",
}
_WHY = r"(?P<why>the log [^;]*?)"
_PARTS = [
    ("limit_pids", re.compile(
        r"hit the process limit \(resources\.pids: (?P<pids>[^;()]*); (?P<refused>\d+) forks "
        r"refused\)")),
    ("limit_cpus", re.compile(
        r"held back by the CPU limit \(resources\.cpus: (?P<cpus>[^;()]*); throttled in "
        r"(?P<throttled>\d+) of (?P<periods>\d+) periods\)")),
    ("output_not_kept", re.compile(rf"output not kept: {_WHY} \((?P<dropped>\d+) bytes dropped\)")),
    ("output_removed", re.compile(rf"output not kept: {_WHY}(?=; |$)")),
    ("output_incomplete", re.compile(rf"output may be incomplete: {_WHY}(?=; |$)")),
]  # fmt: skip
_EXITED_AFTER = re.compile(r"exited with (?P<exit_code>-?\d+) after it (?P<hit>.+)")


def of_note(note: str) -> list[Reason]:
    """The reasons of a note ("; "-joined parts); none for no note."""
    if not note:
        return []
    parts, at = [], 0
    while at < len(note):
        part = _part(note, at)
        if part is None:
            return [reasons.of(note)]
        reason, at = part
        parts.append(reason)
        if note.startswith("; ", at):
            at += 2
        elif at < len(note):
            return [reasons.of(note)]
    if "; ".join(reason.text for reason in parts) != note:
        return [reasons.of(note)]
    return parts


def of_problem(problem: str) -> Reason:
    """The reason of a problem that failed an attempt (killed for memory, a process limit)."""
    if problem == reasons.TEMPLATES["out_of_memory"]:
        return Reason("out_of_memory")
    match = _EXITED_AFTER.fullmatch(problem)
    if match:
        hit = of_note(match["hit"])
        if len(hit) == 1 and hit[0].code == "limit_pids":
            reason = Reason(
                "exited_after_limit",
                {"exit_code": int(match["exit_code"]), "hit": hit[0].as_data()},
            )
            if reason.text == problem:
                return reason
    return reasons.of(problem)


def _part(note: str, at: int) -> tuple[Reason, int] | None:
    for code, pattern in _PARTS:
        match = pattern.match(note, at)
        if match is None:
            continue
        params = {k: v for k, v in match.groupdict().items() if k != "why"}
        if "why" in match.groupdict():
            params["why"] = _fault(match["why"]).as_data()
        for figure in ("refused", "throttled", "periods", "dropped"):
            if figure in params:
                params[figure] = int(params[figure])
        return Reason(code, params), match.end()
    return None


def _fault(why: str) -> Reason:
    code = _LOG_FAULTS.get(why)
    if code is not None:
        return Reason(code)
    match = re.fullmatch(r"the log cannot be written \((?P<error>.*)\)", why)
    if match:
        return Reason("log_error", {"error": match["error"]})
    return reasons.of(why)
