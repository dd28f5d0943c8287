"""``--fail-on``: the audit as a CI gate. A named leakage type fails the build where any client's finding of it is
"leaks", or where the clients together leak it (:func:`fedvit.audit.summary.jointly_leaking`); ``unverified``
also fails where a named type (every type when it is named alone) could not have been seen, was not resolvable or
was not measured, so that a lack of power never passes as clean without the team asking for it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from fedvit.audit.evidence import NOT_MEASURED
from fedvit.audit.summary import KINDS, LEAKS, NOT_RESOLVABLE, UNSEEABLE, ClientFinding

GATE_KINDS = {"labels": "labels", "membership": "membership", "images": "images", "dp": "DP claim"}
UNVERIFIED = "unverified"
NOT_A_GAP = ("not asked for", "no DP claim")  # a "not measured" that is no lack of power: nothing to verify


@dataclasses.dataclass(frozen=True)
class Gate:
    """What ``--fail-on`` asks: the leakage types (summary.KINDS names) and whether unverified findings fail."""

    kinds: tuple[str, ...]
    unverified: bool = False


def parse_fail_on(text: str) -> Gate:
    """``labels,membership`` / ``any`` / ``any,unverified``; a ValueError naming the choices otherwise."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    choices = [*GATE_KINDS, "any", UNVERIFIED]
    wrong = [n for n in names if n not in choices]
    if not names or wrong:
        raise ValueError(f"--fail-on takes a comma-separated list of {', '.join(choices)}; got {text!r}")
    kinds = tuple(KINDS) if "any" in names or names == [UNVERIFIED] else tuple(
        GATE_KINDS[n] for n in GATE_KINDS if n in names)  # fmt: skip
    return Gate(kinds, UNVERIFIED in names)


def judge(gate: Gate, findings: Iterable[ClientFinding], joint: dict[str, str]) -> tuple[bool, list[str]]:
    """(whether the gate fails, one line per reason and per finding the gate did not verify); ``joint``: what the
    clients together leak, by leakage type (``audit.json``'s ``together``, :func:`jointly_leaking`)."""
    findings = list(findings)
    failed, lines = False, []
    for kind in gate.kinds:
        leaking = [f.client for f in findings if f.by_kind()[kind].word == LEAKS]
        if leaking:
            failed = True
            lines.append(f"fail: {kind} leaks ({', '.join(leaking)})")
        elif kind in joint:
            failed = True
            lines.append(f"fail: {kind} leak for the clients together ({joint[kind]})")
        gaps = [f"{f.client}: {cell.word}" for f in findings if (cell := f.by_kind()[kind]).word in (
            UNSEEABLE, NOT_RESOLVABLE, NOT_MEASURED) and not any(w in cell.why for w in NOT_A_GAP)]  # fmt: skip
        if gaps and not leaking and kind not in joint:  # a type found leaking needs no word on what was unverified
            if gate.unverified:
                failed = True
            lines.append(f"{'fail' if gate.unverified else 'not verified'}: {kind}: " + "; ".join(gaps))
    return failed, lines
