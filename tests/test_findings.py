"""The words of the report follow from its figures: a finding leaks only where its figure clears the null and its
interval lies clear of it, a client too small for any figure to clear the null is "not resolvable" (with how many
would be needed), the clients together are judged where each alone is too thin, and no report prints a null as an
AUC above 1 or a TPR above 100%."""

from __future__ import annotations

import numpy as np
import pytest

from fedvit.attacks.holdings import Candidates
from fedvit.attacks.scores import Score
from fedvit.audit.entries import UpdateAudit
from fedvit.audit.evidence import (
    NOT_MEASURED,
    ImageEvidence,
    LabelEvidence,
    MembershipEvidence,
    image_evidence,
    images_clear,
    label_evidence,
    label_images_needed,
    labels_clear,
    membership_evidence,
    null_text,
)
from fedvit.audit.frontier import FrontierRow, leaks
from fedvit.audit.membership_stats import RocFigures, judge
from fedvit.audit.metrics import ImageScores
from fedvit.audit.summary import (
    LEAKS,
    NO_EVIDENCE,
    NOT_RESOLVABLE,
    client_findings,
    jointly_leaking,
    label_finding,
    membership_finding,
    short_verdict,
    together,
)
from tests.report_checks import impossible_figures

NONE = MembershipEvidence(NOT_MEASURED, "not in this test")


def update(name: str, partition: int, labels: LabelEvidence | None = None, membership: MembershipEvidence | None = None,
           images: ImageEvidence | None = None, examples: int = 2) -> UpdateAudit:  # fmt: skip
    """An update entry as the pipeline writes it, with the leakage evidence given."""
    leakage = {"labels": labels or LabelEvidence(NOT_MEASURED, "not in this test"), "membership": membership or NONE,
               "images": images or ImageEvidence(NOT_MEASURED, "not in this test")}  # fmt: skip
    return UpdateAudit(name, partition, partition=partition, examples=examples, leakage=leakage)


def exact_counts(images: int, prior_error: float) -> LabelEvidence:
    """The label evidence of counts exactly right for ``images`` images, against a prior misplacing ``prior_error``."""
    counts = np.bincount(np.arange(images) % 3, minlength=10)
    return label_evidence(counts, "", 1.0, 1.0 - prior_error, None, images=images)


def test_a_two_image_client_whose_interval_holds_the_prior_is_not_leaks_but_not_resolvable():
    """The report once said "leaks: error 0.0%; null 80.0%; 95% CI [0.0%, 84.2%]": the interval holds the null."""
    two = exact_counts(2, 0.8)
    assert two.error == 0.0 and not two.clears and two.images_needed == 3
    finding = label_finding([update("u", 0, labels=two)])
    assert finding.word == NOT_RESOLVABLE and finding.interval == "[0.0%, 84.2%]", finding
    assert "exact counts need ≥ 3 to clear the prior" in finding.figure
    # the same exact counts on twenty images clear the prior, interval and all
    twenty = label_finding([update("u", 0, labels=exact_counts(20, 0.8), examples=20)])
    assert twenty.word == LEAKS and labels_clear(0.0, 0.8, 20) and not labels_clear(0.0, 0.8, 2)
    # resolvable, but within the prior: no evidence, not "not resolvable"
    poor = label_evidence(np.bincount(np.arange(20) % 3, minlength=10), "", 0.3, 0.2, None, images=20)
    assert label_finding([update("u", 0, labels=poor, examples=20)]).word == NO_EVIDENCE
    assert label_images_needed(0.03) is None  # a prior within the margin of exact: no count of images would do


def test_the_least_images_exact_counts_need_is_the_least_that_clears():
    for null in (0.2, 0.5, 0.8, 0.95):
        need = label_images_needed(null)
        assert labels_clear(0.0, null, need) and not labels_clear(0.0, null, need - 1), (null, need)


def test_five_clients_whose_counts_are_each_exact_leak_their_labels_together():
    """5 clients of 2 images, each count exact: no client alone can clear an 80% prior, the clients together can,
    and the verdict says so of them together; clients whose counts are no better than the prior are not."""
    updates = [update(f"u{p}", p, labels=exact_counts(2, 0.8)) for p in range(5)]
    findings = client_findings(updates, [])
    assert [f.labels.word for f in findings] == [NOT_RESOLVABLE] * 5
    jointly = together(jointly_leaking(updates, findings))
    assert jointly.startswith("Together: labels of the 5 clients together beyond the prior (0 of 10 images"), jointly
    assert "5 exactly right" in jointly
    verdict = short_verdict(findings, "", jointly=jointly)
    assert verdict.startswith("No client's own figure clears its null; Together: labels of the 5 clients"), verdict
    assert "\nNot resolvable: labels (5 of 5 clients)." in verdict and len(verdict) <= 400
    wrong = label_evidence(np.bincount(np.arange(2) % 3, minlength=10), "", 0.5, 0.2, None, images=2)
    poor = [update(f"u{p}", p, labels=wrong) for p in range(5)]
    assert jointly_leaking(poor, client_findings(poor, [])) == {}


def family(members: np.ndarray, non_members: np.ndarray, seed: int) -> list[Score]:
    """Three scores that put every member above every non-member (the strongest evidence a split allows)."""
    rng = np.random.default_rng(seed)
    return [Score(f"s{k}", "test", 10 + rng.random(len(members)), rng.random(len(non_members))) for k in range(3)]


@pytest.mark.parametrize(("members", "outside", "leaked"), [(2, 10, False), (60, 80, True)])
def test_a_two_member_client_is_not_resolvable_for_membership(members, outside, leaked):
    """Every member above every non-member: with 2 members among 5 non-members per class a shuffle puts both on top
    of their class often enough that the family's null sits at or above AUC 1 (no figure can clear it), so the
    finding is "not resolvable" with how many members would do, never "no evidence"; with 60 members the same
    separation leaks. Nulls are printed as thresholds, never as an AUC above 1."""
    member_labels = np.arange(members) % 2
    outside_labels = np.arange(outside) % 2
    candidates = Candidates((np.zeros((members, 1)), member_labels), (np.zeros((outside, 1)), outside_labels),
                            "test")  # fmt: skip
    result, _, _ = judge(family(member_labels, outside_labels, members), candidates)
    evidence = membership_evidence(result, "")
    finding = membership_finding([update("u", 0, membership=evidence)], None)
    assert result.auc == 1.0
    if leaked:
        assert evidence.clears and evidence.resolvable and finding.word == LEAKS, (finding, result.null)
        assert finding.null.startswith("clears at AUC > 0.")
    else:
        assert result.null.auc >= 1.0 and not evidence.resolvable, result.null
        assert finding.word == NOT_RESOLVABLE and "no AUC" in finding.null and "with 2 members" in finding.null
        assert f"at least about {evidence.members_to_resolve} needed" in finding.figure
        assert evidence.members_to_resolve == 6  # 1 / C(5 + 3, 3)² < 0.001 / 3, the first with 3 per class
    assert not impossible_figures(finding.cell()), finding.cell()


def test_a_report_text_with_an_auc_above_one_or_a_tpr_above_100_percent_is_caught():
    old = "**no evidence**: AUC 1.000, TPR 100.0%; null AUC 1.050, TPR 103.1%; TPR@1% FPR 50.0% (null 101.2%)"
    assert impossible_figures(old) == ["AUC 1.050", "TPR 103.1%"]
    assert impossible_figures("AUC 0.812 (null 1.013, the choice among 3)") == ["null 1.013"]
    assert impossible_figures("null: clears at AUC &gt; 0.930, TPR &gt; 94.3%") == []
    text = null_text(RocFigures(1.05, tpr_at_1_percent=1.031), "0.01", 2)
    assert text == "no AUC or TPR can clear it with 2 members" and not impossible_figures(text)
    assert null_text(RocFigures(0.93, tpr_at_1_percent=1.2), "0.01") == "no TPR can clear it (AUC > 0.930)"


@pytest.mark.parametrize(("top1", "null", "chance", "images"),
                         [(1.0, 0.0, 0.01, 2), (0.5, 0.0, 0.01, 2), (0.3, 0.2, 0.01, 40), (0.45, 0.2, 0.01, 40),
                          (0.12, 0.0, 0.05, 8), (0.0, 0.0, 0.01, 8)])  # fmt: skip
def test_images_leak_by_one_rule_in_the_report_and_the_frontier(top1, null, chance, images):
    """The frontier and the report judge the same re-identification alike (fedvit.audit.evidence.images_clear)."""
    scores = ImageScores(20.0, reid_top1=top1, reid_null=null, reid_chance=chance)
    row = FrontierRow("plain", "B=2", "opt", reid_top1=top1, reid_null=null, reid_chance=chance, reid_images=images)
    judged = image_evidence(scores, images, "").clears
    assert judged == leaks(row) == images_clear(top1, null, chance, images)
    expected = {(1.0, 2): True, (0.5, 2): False, (0.3, 40): False, (0.45, 40): True, (0.12, 8): False}
    assert judged == expected.get((top1, images), False)


def test_the_suite_wide_check_finds_every_report_a_test_writes(tmp_path):
    """tests/conftest.py reads every audit.md and audit.html under pytest's temporary folders after each test, skipping
    installed environments (a report written there would not be found: none is)."""
    from tests.conftest import written_reports

    (tmp_path / "run" / "audit").mkdir(parents=True)
    (tmp_path / "run" / "audit" / "audit.md").write_text("null: clears at AUC > 0.930\n")
    (tmp_path / "run" / "audit" / "audit.html").write_text("<p>AUC 0.700</p>\n")
    (tmp_path / ".venv" / "lib").mkdir(parents=True)
    (tmp_path / ".venv" / "lib" / "audit.md").write_text("AUC 1.500\n")
    found = sorted(written_reports(tmp_path))
    assert found == [str(tmp_path / "run" / "audit" / name) for name in ("audit.html", "audit.md")]
