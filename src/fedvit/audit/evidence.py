"""What the audit may conclude: per update and leakage type (label distribution, membership, images) the figure,
the same figure on a null that holds no information, the margin a finding must clear, and from these the verdict.

Nulls: label counts against the prior (N × the population's class shares: a guess without the update); membership
figures against the member/non-member labels shuffled within each class (:mod:`fedvit.attacks.membership`);
re-identification against the same reconstructions matched to and ranked among images the update never saw
(:func:`fedvit.audit.metrics.null_reid`).
"LEAKS" needs a figure beyond its null by the margin; a figure nothing could check is "unverified".
Threat models as Carletti et al. name them ("SoK: Gradient Inversion Attacks in Federated Learning", USENIX
Security 2025).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

LABEL_MARGIN = 0.05  # the counts must misplace ≥ 5 points of the images fewer than the prior does
IMAGE_MARGIN = 0.05  # re-identification top-1 above the null's by ≥ 5 points and by 3 standard errors
MEASURED, UNVERIFIED, NOT_MEASURED = "measured", "estimated (unverified)", "not measured"
LEAKAGE_KINDS = ("labels", "membership", "images")  # the leakage types, in the report's order (--leakage picks)
THREAT_MODELS = {
    "server": "honest-but-curious server: every client's reply and the instruction it was sent",
    "wire-tap": "passive eavesdropper on the wire: both directions of every train exchange",
}
CLIENT_LINK = "eavesdropper on the client's link: both directions of its train exchanges"


TLS_ONLY = ("passive eavesdropper on the wire, every link TLS: connection metadata only (peers, times, bytes), no "
            "message and no app bundle; the server, which ends the TLS, still sees every update: to audit its view, "
            "capture it with CapturingStrategy around the strategy (from fedvit import CapturingStrategy) or "
            "capture_mod on the ClientApp, and give --app DIR|FAB for the recipe")  # fmt: skip


def threat_model(observers: list[str | None], assumed: bool, tls_links: int = 0) -> str:
    """The threat model the captures stand for, and how much of the recipe it knows (``tls_links``: connections a
    wire tap could not read; with no readable exchange at all, that is the whole threat model)."""
    if not observers and tls_links:
        return f"{TLS_ONLY} ({tls_links} TLS or HTTP/2 link(s) in tap.json)"
    seen = "; ".join(dict.fromkeys(THREAT_MODELS.get(o or "", CLIENT_LINK) for o in observers)) or CLIENT_LINK
    knows = (
        "parameter-aware: reads the recipe from the app's code, the records and the update, assumes the rest (listed "
        "per update)"
        if assumed
        else "parameter-aware: every recipe value from the app's code, the records or the update"
    )
    return f"{seen}; {knows} (Carletti et al., SoK, USENIX Security 2025)"


def label_evidence(counts: np.ndarray | None, why: str, accuracy: float | None, prior: float | None,
                   unverified_error: str | None, rests_on: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Label counts against the prior. ``accuracy``/``prior``: label accuracy of the counts and of the prior
    against the truth (None without it); ``unverified_error``: the method's benchmarked error, stated instead;
    ``rests_on``: what the counts' relation assumes that is not the client's verified recipe (another optimiser
    than SGD, an assumed batch size or epoch count): the counts are then never judged, only estimated, and their
    error against the truth is stated beside, not weighed."""
    if counts is None:
        return {"status": NOT_MEASURED, "why": why}
    if rests_on is not None:
        found = {"status": UNVERIFIED, "why": f"the counts rest on {rests_on}"}
        if accuracy is not None and prior is not None:
            found |= {"error": 1.0 - accuracy, "null-error": 1.0 - prior}
            found["benchmarked-error"] = (f"{found['why']}; against the truth they misplace {1 - accuracy:.1%} of "
                                          f"the images (the prior {1 - prior:.1%}), not judged")  # fmt: skip
        else:
            found["benchmarked-error"] = found["why"]
        return found
    if accuracy is None or prior is None:
        return {"status": UNVERIFIED, "why": "no ground truth recorded and no --data",
                "benchmarked-error": unverified_error or "exact for one step (the head-bias formula)"}  # fmt: skip
    error, null = 1.0 - accuracy, 1.0 - prior
    return {"status": MEASURED, "error": error, "null-error": null, "margin": LABEL_MARGIN,
            "clears": bool(null - error >= LABEL_MARGIN)}  # fmt: skip


def image_evidence(scores: dict[str, Any] | None, images: int, why: str) -> dict[str, Any]:
    """The best attack's re-identification against its null (see :func:`fedvit.audit.metrics.null_reid`)."""
    if scores is None or scores.get("reid-top1") is None:
        return {"status": NOT_MEASURED, "why": why}
    top1, null = scores["reid-top1"], scores.get("reid-null")
    if null is None:
        return {"status": NOT_MEASURED, "why": "too few decoys for a null (2 per true image)", "top1": top1}
    p0 = max(null, scores.get("reid-chance") or 0.0)  # a null of 0 out of few images still allows chance hits
    need = max(IMAGE_MARGIN, 3 * math.sqrt(p0 * (1 - p0) / images))
    return {"status": MEASURED, "top1": top1, "null-top1": null, "margin": need, "clears": bool(top1 - null >= need),
            "psnr": scores.get("psnr"), "images": images}  # fmt: skip


def membership_evidence(result: dict[str, Any] | None, why: str) -> dict[str, Any]:
    """Membership figures against the within-class shuffled-label null (:func:`fedvit.attacks.membership.infer`)."""
    if result is None:
        return {"status": NOT_MEASURED, "why": why}
    return {"status": MEASURED, **result, "clears": result["clears-null"]}


DEFAULT_DELTA = 1e-5  # the δ of the empirical ε where canaries are audited without a claim


def privacy_evidence(claim: Any, found: dict[str, Any]) -> dict[str, Any]:
    """The empirical lower bound on ε (:func:`fedvit.attacks.membership_stats.privacy_bound`) beside its null and the
    client's claim (a :class:`fedvit.attacks.recipe.PrivacyClaim`, or None): a bound above both the claimed ε and
    its null violates the claim at the bound's confidence; consistent otherwise."""
    out = {"empirical-epsilon": found["epsilon-lower"], "null": found["null"], "null-draws": found["null-draws"],
           "delta": found["delta"], "confidence": found["confidence"], "thresholds": found["thresholds"],
           "at": found["at"], "members": found["members"], "non-members": found["non-members"],
           "scores": found["scores"]}  # fmt: skip
    if claim is None:
        return out | {"claimed-epsilon": None}
    violated = found["epsilon-lower"] > max(claim.epsilon, found["null"])
    return out | {"claimed-epsilon": claim.epsilon, "claim": claim.described(), "consistent": not violated}


def privacy_part(items: list[dict[str, Any]]) -> tuple[str, bool | None]:
    """The DP claims over the updates: their wording and whether one is violated (None: no claim tested)."""
    claimed = [e["privacy"] for e in items if e.get("privacy", {}).get("claimed-epsilon") is not None]
    if not claimed:
        return "", None
    broken = [p for p in claimed if not p["consistent"]]
    bound = max(p["empirical-epsilon"] for p in claimed)
    confidence = claimed[0]["confidence"]
    null = max(p["null"] for p in claimed)
    if broken:
        return (f"DP claim violated in {len(broken)} of {len(claimed)} update(s): empirical ε ≥ {bound:.2f} at "
                f"{confidence:.0%} confidence (null {null:.2f}) against the claimed "
                f"{broken[0]['claim']}"), True  # fmt: skip
    return (f"consistent with the claimed ε in {len(claimed)} of {len(claimed)} update(s) (empirical ε ≥ "
            f"{bound:.2f} at {confidence:.0%} confidence, null {null:.2f}; "
            f"claimed {claimed[0]['claim']})"), False  # fmt: skip


def _part(kind: str, items: list[dict[str, Any]]) -> tuple[str, bool | None]:
    """One leakage type over the updates: its wording and whether it leaks (None: nothing measured)."""
    measured = [e for e in items if e["status"] == MEASURED]
    unverified = [e for e in items if e["status"] == UNVERIFIED]
    if not measured:
        if unverified:
            error = unverified[0]["benchmarked-error"]
            return f"{kind} estimated for {len(unverified)} update(s), unverified ({error})", None
        return f"{kind} not measured ({items[0]['why'] if items else 'no updates'})", None
    hits = sum(e["clears"] for e in measured)
    if kind == "labels":
        detail = (f"mean error {np.mean([e['error'] for e in measured]):.1%} vs prior "
                  f"{np.mean([e['null-error'] for e in measured]):.1%}, margin {LABEL_MARGIN:.0%}; "
                  f"{sum(e['error'] == 0 for e in measured)} of {len(measured)} exactly right")  # fmt: skip
    elif kind == "membership":
        detail = (f"AUC {np.mean([e['auc'] for e in measured]):.3f} vs null "
                  f"{np.mean([e['null']['auc'] for e in measured]):.3f}")  # fmt: skip
        resolved = [e for e in measured if e.get("tpr@0.01") is not None]
        if resolved:
            detail += (f", TPR@1% FPR {np.mean([e['tpr@0.01'] for e in resolved]):.1%} vs null "
                       f"{np.mean([e['null']['tpr@0.01'] for e in resolved]):.1%}")  # fmt: skip
        if len(resolved) < len(measured):  # the verdict read TPR at the resolution there
            detail += (f"; 1% FPR not resolved in {len(measured) - len(resolved)} (too few non-members per class: "
                       "TPR read at the resolution)")  # fmt: skip
        detail += power_summary([e.get("power") or {} for e in measured], hits)
        on_average = sum(e["auc"] > e["null"]["auc"] and not e["clears"] for e in measured)
        if on_average:  # Carlini et al.: an AUC says the update informs on average, not that any member is exposed
            detail += (f"; AUC alone beyond its null in {on_average}: membership information on average, no "
                       "member singled out at 1% FPR")  # fmt: skip
    else:
        detail = (f"re-identified {np.mean([e['top1'] for e in measured]):.0%} top-1 vs null "
                  f"{np.mean([e['null-top1'] for e in measured]):.0%}")  # fmt: skip
    return f"{kind} beyond the null in {hits} of {len(measured)} update(s) ({detail})", hits > 0


def power_summary(powers: list[dict[str, Any]], hits: int) -> str:
    """What the audit could have seen (each update's simulated power), and how a verdict without a hit reads."""
    powered = [p for p in powers if p.get("status") == MEASURED]
    if not powered:
        return ""
    seen = sum(p["could-have-seen"] for p in powered)
    text = (f"; power of the loss scores: simulated updates like these, with known members, clear their null in "
            f"{seen} of {len(powered)} (AUC {np.mean([p['simulated']['auc'] for p in powered]):.3f})")  # fmt: skip
    if hits == 0 and seen == len(powered):
        text += ": the audit could have seen membership like the simulation's, and these updates hold less"
    elif hits == 0 and seen == 0:
        text += ": with these scores the audit could not have seen membership in such updates at this budget"
    return text


def rounds_part(clients: list[dict[str, Any]]) -> tuple[str, bool | None]:
    """Membership per client over its updates: the wording and whether it leaks (None: nothing measured)."""
    measured = [c["membership"] for c in clients if c["membership"]["status"] == MEASURED]
    if not measured:
        return "membership over rounds not measured", None
    hits = sum(e["clears"] for e in measured)
    return (f"membership over each client's updates beyond the null for {hits} of {len(measured)} client(s) "
            f"(AUC {np.mean([e['auc'] for e in measured]):.3f} vs null "
            f"{np.mean([e['null']['auc'] for e in measured]):.3f})", hits > 0)  # fmt: skip


def verdict(updates: list[dict[str, Any]], nothing: str, clients: list[dict[str, Any]] | None = None) -> str:
    """One line: per leakage type, the evidence against its null (and, for clients with several updates, their
    membership over them). "LEAKS" only where a figure clears its margin; "no evidence at this budget" where
    everything measured stayed within it; "unverified" where nothing could be checked."""
    if not updates:
        return nothing
    parts = {kind: _part(kind, [u["leakage"][kind] for u in updates]) for kind in LEAKAGE_KINDS}
    if clients:
        parts["rounds"] = rounds_part(clients)
    privacy = privacy_part([u["leakage"]["membership"] for u in updates])
    if privacy[1] is not None:
        parts["privacy"] = privacy
    leaks = [text for text, hit in parts.values() if hit]
    rest = [text for text, hit in parts.values() if not hit]
    if leaks:
        return "LEAKS: " + "; ".join(leaks) + ". Also: " + "; ".join(rest)
    if any(hit is False for _, hit in parts.values()):
        return "no evidence at this budget: " + "; ".join(text for text, _ in parts.values())
    return "unverified: " + "; ".join(text for text, _ in parts.values())
