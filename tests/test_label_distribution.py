"""Label distribution (RLU-class), membership inference and the evidence/null logic of the audit's verdict."""

from __future__ import annotations

import csv
import dataclasses
import functools
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fedvit.attacks import label_distribution
from fedvit.attacks.holdings import Auxiliary, Candidates
from fedvit.attacks.label_distribution import (
    ADAM_ERROR,
    BENCHMARKED_ERROR,
    Systems,
    class_mix_search,
    estimate,
    head_rows,
    integer_counts,
    prior_accuracy,
    residual_search,
    scaled_rhs,
)
from fedvit.attacks.labels import label_accuracy
from fedvit.attacks.reidentification import Gallery
from fedvit.attacks.scores import Score
from fedvit.attacks.simulation import OTHER_DRAW, simulate, step_weights
from fedvit.audit.evidence import (
    MembershipEvidence,
    image_evidence,
    label_evidence,
    membership_evidence,
    verdict_detail,
)
from fedvit.audit.json_fields import from_keys
from fedvit.audit.membership_runs import infer
from fedvit.audit.membership_stats import (
    Judgement,
    OperatingPoint,
    PrivacyBound,
    RocFigures,
    ScoreJudgement,
    calibrate,
    class_ranks,
    clears_null,
    clopper_pearson,
    empirical_epsilon,
    fpr_resolution,
    intervals,
    judge,
    null_figures,
    over_rounds,
    privacy_bound,
    roc_figures,
)
from fedvit.audit.metrics import psnr, psnr_table, score
from fedvit.observed.model_spec import ModelSpec
from fedvit.observed.observation import Observation, Reconstruction
from fedvit.observed.recipe import ClientRecipe

APP = Path(__file__).parent / "thirdparty_app"
sys.path.insert(0, str(APP))
from cnnapp.task import Net, make_images, make_textures, train  # noqa: E402
from cnnapp.task import normalize as normalize_cnn  # noqa: E402

SPEC = ModelSpec("cnnapp.task:Net", app_dir=str(APP))
CSV = Path(__file__).parents[1] / "docs" / "results" / "data" / "label-distribution.csv"
ADAM_CSV = CSV.with_name("adam-vs-sgd.csv")
SPREAD_CSV = CSV.with_name("label-distribution-spread.csv")  # the same client updates under another attack draw


def test_step_weights_are_what_momentum_applies_of_each_gradient():
    beta, steps = 0.9, 7
    velocity, applied = 0.0, np.zeros(steps)
    for t in range(steps):  # unit gradient at step t only: how much of it the remaining steps apply
        velocity = 0.0
        for s in range(t, steps):
            velocity = beta * velocity + (1.0 if s == t else 0.0)
            applied[t] += velocity
    assert np.allclose(step_weights(steps, beta), applied) and (step_weights(5, 0.0) == 1).all()


def test_integer_counts_sum_to_the_total_and_follow_the_shares():
    counts = integer_counts(np.array([0.2, 3.9, 0.0, 5.4]), 100)
    assert counts.sum() == 100 and counts.argmax() == 3 and counts[2] == 0


def client_update(size: int, epochs: int, alpha: float, lr: float = 0.01):
    torch.manual_seed(0)
    model = Net()
    received = {n: t.numpy().copy() for n, t in model.state_dict().items()}
    images, labels = make_images(size, 11, alpha)
    train(model, images, labels, epochs, lr, 32, seed=1)  # the app's SGD, momentum 0.9 in its code
    sent = {n: t.numpy().copy() for n, t in model.state_dict().items()}
    client = ClientRecipe(size, 32, epochs, lr, 0.0, 0.0, 0, False, True, momentum_known=False)
    obs = Observation(update=sent, received=received, num_classes=10, spec=SPEC, skeleton=Net(),
                      client=client, head_bias="fc3.bias")  # fmt: skip
    return obs, images, labels


@pytest.mark.parametrize("epochs", [1, 3])
def test_a_skewed_clients_counts_come_back_from_several_local_steps_and_beat_the_prior(epochs):
    """Beyond one epoch the passes alone stall near the prior (the model learns any class mix it is given); the
    residual search brings the counts back (without it, 3 epochs here: 20% of images misplaced)."""
    obs, _, labels = client_update(600, epochs, alpha=0.5)
    aux = Auxiliary(*make_images(1000, 99), "other images")
    found = estimate(obs, aux)
    accuracy, prior = label_accuracy(found.counts, labels), prior_accuracy(aux.prior(10), labels)
    assert found.counts.sum() == 600 and found.momentum == 0.9  # the app's momentum, read from the update
    assert "under momentum 0 " in found.note and "under weight decay 0.0005" in found.note  # the assumptions' effect
    assert accuracy > 0.9 and prior < 0.8, (accuracy, prior)
    assert label_evidence(found.counts, "", accuracy, prior, None).clears
    # a control: the counts against another client's labels beat the prior of that client by no margin
    other = make_images(600, 12, 0.5)[1]
    assert not label_evidence(found.counts, "", label_accuracy(found.counts, other), prior_accuracy(
        aux.prior(10), other), None).clears  # fmt: skip


def test_a_repeated_simulation_is_looked_up_and_the_estimate_is_bit_identical(monkeypatch):
    """The searches from both starts often meet: a simulation at counts already simulated (same momentum, seed and
    weight decay) is looked up, and the estimate is the one every simulation run afresh gives."""
    obs, _, _ = client_update(300, 1, alpha=0.5)
    aux = Auxiliary(*make_images(600, 99), "other images")
    systems = Systems(obs, aux)
    counts = np.full(10, 30)
    first = systems(counts, 0.9, 0, 0.0)
    assert systems(counts.copy(), 0.9, 0, 0.0) is first and systems.runs == 1
    moved = counts + np.eye(10, dtype=int)[0]
    for other in ((counts, 0.0, 0, 0.0), (counts, 0.9, 1, 0.0), (counts, 0.9, 0, 5e-4), (moved, 0.9, 0, 0.0)):
        assert systems(*other) is not first
    assert systems.runs == 5
    looked_up = estimate(obs, aux)

    def afresh(self, counts, momentum, seed, weight_decay):
        self.runs += 1
        return simulate(self.obs, self.aux, counts, momentum, seed, weight_decay)

    monkeypatch.setattr(Systems, "__call__", afresh)
    every = estimate(obs, aux)
    assert (every.counts == looked_up.counts).all() and every.momentum == looked_up.momentum
    (found, runs), (_, afresh_runs) = (e.note.rsplit("; ", 1) for e in (looked_up, every))
    assert every.note.rsplit("; ", 1)[0] == found
    runs, afresh_runs = int(runs.split()[0]), int(afresh_runs.split()[0])  # "K simulations run in all"
    print(f"{runs} simulations run, {afresh_runs} without the look-up")
    assert runs <= afresh_runs and looked_up.simulations == runs and every.simulations == afresh_runs


class LinearSystems:
    """A stand-in for :class:`Systems`: S(n) the same matrix at every class mix, met exactly at ``truth``, plus
    noise of size ``noise`` that depends on the seed only (a draw of auxiliary images and shuffle)."""

    def __init__(self, rhs: np.ndarray, truth: np.ndarray, noise: float) -> None:
        base = np.random.default_rng(5).normal(size=(len(rhs), len(truth)))
        self.system = base + np.outer(rhs - base @ truth, truth) / (truth @ truth)  # S @ truth == rhs
        self.noise, self.runs, self.seeds = noise * np.linalg.norm(rhs) / np.linalg.norm(truth), 0, []

    def __call__(self, counts: np.ndarray, momentum: float, seed: int, weight_decay: float) -> SimpleNamespace:
        self.runs += 1
        self.seeds.append(seed)
        draw = np.random.default_rng(seed).normal(size=self.system.shape) / np.sqrt(self.system.size)
        return SimpleNamespace(system=self.system + self.noise * draw)


def test_the_search_takes_no_step_from_a_start_self_consistent_within_the_draw_to_draw_spread(monkeypatch):
    obs, _, _ = client_update(300, 1, alpha=0.5)
    aux = Auxiliary(*make_images(100, 99), "other images")
    rows = head_rows(obs)
    rhs = scaled_rhs(obs, rows, 0.9)
    truth = np.array([60, 50, 40, 30, 30, 30, 20, 20, 10, 10])
    far = np.full(10, 30)
    # at the true mix the residual is the draw's alone: within the spread, so no step and one extra simulation
    systems = LinearSystems(rhs, truth, noise=0.01)
    settled = residual_search(obs, aux, rows, truth, 0.9, 0.0, 0, 5, systems, floor=True)
    assert settled.settled and (settled.counts == truth).all() and settled.simulations == systems.runs == 2
    assert systems.seeds == [0, OTHER_DRAW] and 0 < settled.residual <= settled.spread
    # from a wrong mix the residual is far above the spread: the search steps to the truth as without the floor
    systems = LinearSystems(rhs, truth, noise=0.01)
    moved = residual_search(obs, aux, rows, far, 0.9, 0.0, 0, 5, systems, floor=True)
    plain = residual_search(obs, aux, rows, far, 0.9, 0.0, 0, 5, LinearSystems(rhs, truth, noise=0.01))
    assert not moved.settled and moved.simulations > 2 and (moved.counts == plain.counts).all()
    assert np.abs(moved.counts - truth).sum() <= 4 and plain.spread is None
    # the second start is searched exactly where the first did not settle
    monkeypatch.setattr(label_distribution, "learned_mix", lambda obs, aux: far.astype(float))
    assert list(class_mix_search(obs, aux, rows, truth, 0.9, 0, LinearSystems(rhs, truth, 0.01))) == [
        "the passes' estimate"]  # fmt: skip
    assert len(class_mix_search(obs, aux, rows, far, 0.9, 0, LinearSystems(rhs, truth, 0.01))) == 2


def test_the_search_budget_caps_the_steps_from_each_start_and_the_estimate_passes_it_on(monkeypatch):
    """``search_steps`` (the label table's and the audit timing's --search-steps) caps the Gauss–Newton steps of
    each start: 0 leaves both starts where they are, 1 takes one step from each; the audit's default is 5."""
    obs, _, _ = client_update(300, 1, alpha=0.5)
    aux = Auxiliary(*make_images(100, 99), "other images")
    rows = head_rows(obs)
    truth = np.array([60, 50, 40, 30, 30, 30, 20, 20, 10, 10])
    far, learned = np.full(10, 30), np.array([20, 20, 20, 20, 20, 40, 40, 40, 40, 40])
    monkeypatch.setattr(label_distribution, "learned_mix", lambda obs, aux: learned.astype(float))
    systems = lambda: LinearSystems(scaled_rhs(obs, rows, 0.9), truth, noise=0.01)  # noqa: E731
    unmoved = class_mix_search(obs, aux, rows, far, 0.9, 0, systems(), steps=0)
    assert [(r.counts.tolist(), r.simulations) for r in unmoved.values()] == [(far.tolist(), 2), (learned.tolist(), 1)]
    one, full = (class_mix_search(obs, aux, rows, far, 0.9, 0, systems(), steps=k) for k in (1, 5))
    assert all(r.simulations <= 2 + 10 + 3 for r in one.values())  # one Jacobian, up to three step lengths
    assert all(np.abs(r.counts - truth).sum() < np.abs(far - truth).sum() for r in one.values())
    assert min(np.abs(r.counts - truth).sum() for r in full.values()) <= 4
    with pytest.raises(ValueError, match="steps must be >= 0"):
        class_mix_search(obs, aux, rows, far, 0.9, 0, systems(), steps=-1)
    # the estimate hands its budget to the search (None: the module's SEARCH_STEPS, read at the call)
    asked = []
    original = label_distribution.class_mix_search
    monkeypatch.setattr(label_distribution, "class_mix_search", lambda *a: asked.append(a[-1]) or original(*a))
    monkeypatch.setattr(label_distribution, "SEARCH_STEPS", 1)
    for budget in (0, None):
        estimate(obs, Auxiliary(*make_images(300, 99), "other images"), search_steps=budget)
    assert asked == [0, 1]


def test_the_benchmarked_error_is_the_committed_benchmarks_worst_case_over_both_attack_draws():
    """The quoted error is the worst over the table and over the same client updates under the attack's other draw
    (its own run-to-run spread), clients of at least 1,000 images."""
    rows = list(csv.DictReader(CSV.open()))
    other = [r | {"label error": r["label error draw 1"]} for r in csv.DictReader(SPREAD_CSV.open())]
    assert rows and len(other) == len(rows), (CSV, SPREAD_CSV)
    for family, table in BENCHMARKED_ERROR.items():
        for epochs, bound in table.items():
            worst = max(float(r["label error"]) for r in rows + other if r["model"] == family and
                        int(r["local epochs"]) == epochs and int(r["images"]) >= 1000)  # fmt: skip
            assert bound == pytest.approx(np.ceil(worst * 100) / 100), (family, epochs, worst)
    adam = [r for r in csv.DictReader(ADAM_CSV.open()) if r["optimiser"] == "adam"]
    assert adam, ADAM_CSV
    for family, table in ADAM_ERROR.items():
        for epochs, bound in table.items():
            worst = max(float(r["label error"]) for r in adam if int(r["local epochs"]) == epochs)
            assert bound == pytest.approx(np.ceil(worst * 100) / 100), (family, epochs, worst)


def test_the_committed_search_budget_summary_is_its_rows_read_against_the_committed_table():
    """docs/results/data/label-search-budget-summary.csv is what benchmarks/label_search_budget.py gives from the
    committed rows and table, and at the audit's own cap the rows are the table's (but for the one row the results
    page names)."""
    from benchmarks.label_search_budget import key, summary

    rows = list(csv.DictReader(CSV.with_name("label-search-budget.csv").open()))
    table = {key(r): r for r in csv.DictReader(CSV.open())}
    committed = list(csv.DictReader(CSV.with_name("label-search-budget-summary.csv").open()))
    assert [{k: str(v) for k, v in r.items()} for r in summary(rows, table)] == committed
    own = [r for r in rows if int(r["search steps"]) == label_distribution.SEARCH_STEPS]
    differ = [key(r) for r in own if r["label error"] != table[key(r)]["label error"]]
    assert len(own) == 36 and differ == [("cnn", "Dirichlet(0.5)", "0", "2000", "1")], differ


def test_membership_figures_and_their_null():
    separable = roc_figures(np.arange(100.0) + 1000, np.arange(1000.0))
    assert separable.named() == {"auc": 1.0, "tpr@0.001": 1.0, "tpr@0.01": 1.0, "tpr@resolution": 1.0,
                                 "tpr@0.001-parametric": None}
    obs, images, labels = client_update(64, 1, alpha=0.0)
    still = Observation(update=obs.received, received=obs.received, num_classes=10, spec=SPEC,
                        skeleton=Net(), client=obs.client, head_bias="fc3.bias")  # fmt: skip
    result, inside, outside = infer(still, Candidates((images, labels), make_images(500, 99), "other"))
    assert (inside == 0.5).all() and result.auc == 0.5 and not membership_evidence(result, "").clears


def test_psnr_table_is_psnr():
    rng = np.random.default_rng(0)
    a, b = list(rng.random((3, 3, 8, 8))), list(rng.random((4, 3, 8, 8)))
    table = psnr_table(a, b)
    assert np.allclose(table, [[psnr(x, y) for y in b] for x in a]) and psnr_table([a[0]], [a[0]])[0, 0] == 200.0


def test_noise_matched_to_many_images_is_not_re_identification():
    """The protocol that found "re-id 29%" in noise: matching many noise reconstructions to as many true images
    selects look-alikes. The null (the same protocol on images the update never saw) finds as many."""
    images, _ = make_images(140, 3)
    truths, decoys = images[:20].astype(np.float64), images[20:].astype(np.float64)
    noise = list(np.random.default_rng(1).random((20, 3, 32, 32)))
    scored = score(Reconstruction(noise[0], "noise", images=tuple(noise)), truths, Gallery(decoys, "decoys"))
    evidence = image_evidence(scored, 20, "")
    assert scored.reid_null is not None and evidence.status == "measured" and not evidence.clears, evidence
    exact = score(Reconstruction(truths[0], "", images=tuple(truths)), truths, Gallery(decoys, "decoys"))
    assert image_evidence(exact, 20, "").clears


def test_tpr_is_given_only_at_fprs_the_calibration_resolves_with_exact_intervals():
    """~93 non-members per class (a realistic client's split): calibrated scores move in steps of 1/93, so every
    member above its class's non-members ties at the top and TPR at 0.1% would equal TPR at 1%: neither is given,
    each says how many non-members per class it needs, and the verdict reads TPR at the resolution. With 200 per
    class 1% is resolved (with Clopper–Pearson intervals on the TPR and on the FPR reached), 0.1% is not."""

    from fedvit.audit.report import evidence_text

    rng = np.random.default_rng(0)
    for per_class, resolved in ((93, ()), (200, ("0.01",))):
        member_labels, outsider_labels = np.repeat(np.arange(10), 50), np.repeat(np.arange(10), per_class)
        outsider_labels[-3:] = 0  # class 9 has 3 fewer: the resolution is set by the smallest member class
        inside = rng.normal(1.0, 1.0, 500)  # members score higher: a real signal
        outside = rng.normal(0.0, 1.0, len(outsider_labels))
        resolution, fewest = fpr_resolution(member_labels, outsider_labels)
        assert fewest == per_class - 3 and resolution == pytest.approx(1 / (per_class - 3))
        calibrated = calibrate(inside, outside, member_labels, outsider_labels)
        figures = roc_figures(*calibrated, resolution)
        extra = intervals(*calibrated, resolution)
        for target in ("0.001", "0.01"):
            if target in resolved:
                low, high = extra[target].tpr_ci
                assert low <= figures.tpr(target) <= high and extra[target].fpr <= float(target)
            else:
                assert figures.tpr(target) is None and extra[target].needs == round(1 / float(target))
        assert figures.tpr_at_resolution > 0 and extra["resolution"].fpr <= resolution + 1e-12
        null = from_keys(RocFigures, {k: (None if v is None else 0.0) for k, v in figures.named().items()}
                         | {"auc": 0.5})  # fmt: skip
        assert clears_null(figures, null)  # read at 1% where resolved, else at the resolution
        one = ScoreJudgement(**dataclasses.asdict(figures), null=null, clears_null=True, per_class=True)
        judged = Judgement(**dataclasses.asdict(figures), members=500, non_members=len(outside),
                           non_member_source="test", score="s", reference="", operating_points=extra, null=null,
                           clears_null=True, fpr_resolution=resolution, non_members_per_class=fewest,
                           members_needed=1, scores={"s": one})  # fmt: skip
        text = evidence_text(membership_evidence(judged, ""))
        assert "TPR@0.1% FPR not resolved (needs ≥ 1000 non-members per class)" in text
        assert ("TPR@1% FPR not resolved (needs ≥ 100" in text) == ("0.01" not in resolved), text
    assert clopper_pearson(0, 100)[1] == pytest.approx(1 - 0.025 ** (1 / 100))  # the exact bound at k = 0
    assert clopper_pearson(50, 100)[0] == pytest.approx(0.3983, abs=1e-4)


def test_below_the_resolution_a_gaussian_fit_gives_tpr_at_0_1_percent_where_it_agrees_with_the_data():
    """90 non-members per class resolve neither 0.1% nor 1% FPR; LiRA's offline route fits a Gaussian to each class's
    non-member scores. Where they are Gaussian (members N(3, 1), non-members N(0, 1): true TPR at 0.1% FPR 46.4%) the
    fit's TPR comes within sampling error and its check against the empirical CDF agrees; where they are
    long-tailed (exponential) the check disagrees and the report gives no parametric figure."""
    from scipy.stats import norm

    from fedvit.audit.report import tpr_text

    rng = np.random.default_rng(0)
    member_labels, outsider_labels = np.repeat(np.arange(10), 50), np.repeat(np.arange(10), 90)
    candidates = Candidates((np.zeros((500, 1)), member_labels), (np.zeros((900, 1)), outsider_labels), "test")
    gaussian = Score("gaussian", "", rng.normal(3, 1, 500), rng.normal(0, 1, 900))
    found = judge([gaussian], candidates)[0]
    truth = 1 - norm.cdf(norm.ppf(0.999) - 3)
    assert found.tpr_at_0_1_percent is None and found.tpr_at_1_percent is None
    assert abs(found.parametric - truth) < 0.07 and found.fit_check.agrees, found
    assert found.null.parametric < 0.05
    assert "; parametric " in tpr_text(found, "0.001") and "agreeing with the empirical CDF" in tpr_text(found, "0.001")
    tailed = Score("tailed", "", rng.exponential(1, 500) ** 3 + 3, rng.exponential(1, 900) ** 3)
    found = judge([tailed], candidates)[0]
    assert not found.fit_check.agrees, found.fit_check
    assert "disagrees with the empirical CDF" in tpr_text(found, "0.001") and "; parametric " not in tpr_text(
        found, "0.001")  # fmt: skip


def judgement(auc: float, tpr: float, null: RocFigures) -> Judgement:
    """Membership figures of 500 members with 200 non-members per class: AUC and TPR at 1% FPR against ``null``."""
    figures = RocFigures(auc, None, tpr, tpr)
    return Judgement(**dataclasses.asdict(figures), members=500, non_members=2000, non_member_source="test", score="s",
                     reference="", operating_points={"0.01": OperatingPoint(None, 0.01, [0.0, 1.0], [0.0, 1.0])},
                     null=null, clears_null=clears_null(figures, null), fpr_resolution=0.005,
                     non_members_per_class=200, members_needed=1, scores={})  # fmt: skip


def test_the_verdict_says_leaks_only_beyond_a_null():
    from fedvit.audit.evidence import ImageEvidence, LabelEvidence

    measured = LabelEvidence("measured", error=0.3, null_error=0.32, margin=0.05, clears=False)
    none = MembershipEvidence("not measured", "no candidates")
    no_images = ImageEvidence("not measured", "no candidates")
    unverified = LabelEvidence("estimated (unverified)", benchmarked_error="4% in the benchmark")
    update = lambda labels: {"labels": labels, "membership": none, "images": no_images}  # noqa: E731
    said = verdict_detail([update(measured)], "")
    assert said.startswith("no evidence at this budget: labels beyond the null in 0 of 1"), said
    said = verdict_detail([update(unverified)], "")
    assert said.startswith("unverified: labels estimated for 1 update(s), unverified"), said
    leaking = dataclasses.replace(measured, error=0.1, clears=True)
    assert verdict_detail([update(leaking)], "").startswith("LEAKS: labels")
    figures = membership_evidence(judgement(0.56, 0.02, RocFigures(0.53, tpr_at_1_percent=0.03)), "")
    nothing = LabelEvidence("not measured", "no candidates")
    average = {"labels": nothing, "images": no_images, "membership": figures}
    said = verdict_detail([average], "")
    assert said.startswith("no evidence at this budget") and "AUC alone beyond its null in 1" in said, said
    exposed = {"labels": nothing, "images": no_images,
               "membership": membership_evidence(judgement(0.56, 0.05, figures.figures.null), "")}
    assert verdict_detail([exposed], "").startswith("LEAKS: membership beyond the null in 1 of 1")


def test_per_epoch_image_sets_fit_a_client_that_reshuffles_and_one_fixed_set_does_not():
    """Why the FedAvg-aware attack keeps one candidate set per epoch: a client that reshuffles every epoch is
    reproduced exactly from its per-epoch orders, not from one set in one order."""
    from fedvit.attacks.inversion import epoch_consensus, match_loss, observed_target, simulate
    from fedvit.observed.observation import attack_model

    images, labels = make_images(4, 5)
    torch.manual_seed(0)
    model = Net()
    received = {n: t.numpy().copy() for n, t in model.state_dict().items()}
    x, y = torch.as_tensor(images), torch.as_tensor(labels)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    orders = [torch.tensor([2, 0, 3, 1]), torch.tensor([1, 3, 0, 2])]
    for order in orders:  # two epochs of two batches of two, reshuffled
        for chunk in order.view(2, 2):
            optimiser.zero_grad()
            torch.nn.functional.cross_entropy(model((x[chunk] - 0.5) / 0.5), y[chunk]).backward()
            optimiser.step()
    sent = {n: t.detach().numpy().copy() for n, t in model.state_dict().items()}
    client = ClientRecipe(4, 2, 2, 0.1, 0.0, 0.0, 0, False)
    obs = Observation(update=sent, received=received, num_classes=10, spec=SPEC, skeleton=Net(),
                      client=client, head_bias="fc3.bias")  # fmt: skip
    net = attack_model(obs)
    params = {n: p.detach().requires_grad_(True) for n, p in net.named_parameters()}
    onehot = lambda idx: torch.nn.functional.one_hot(y[idx], 10).float() * 60 - 30  # noqa: E731
    per_epoch = torch.cat([x[o] for o in orders])[None]
    sim = simulate(net, params, per_epoch, torch.cat([onehot(o) for o in orders])[None], client, None, per_epoch=True)
    assert float(match_loss(sim, observed_target(obs), None, 0.0)) < 1e-5
    fixed = simulate(net, params, x[orders[0]][None], onehot(orders[0])[None], client, None)
    assert float(match_loss(fixed, observed_target(obs), None, 0.0)) > 1e-3
    tied = epoch_consensus(per_epoch[0], 2)  # the second epoch's set registered to the first: the same images
    assert torch.allclose(tied, per_epoch[0])


def test_the_fedavg_aware_attack_applies_to_several_epochs_of_a_small_dataset():
    from fedvit.audit.registry import FEDAVG_AWARE, applicable

    state = {n: t.numpy() for n, t in Net().state_dict().items()}

    def update_of(examples: int, epochs: int, gradient: bool = False) -> Observation:
        client = ClientRecipe(examples, 4, epochs, 0.1, 0.0, 0.0, 0, gradient)
        return Observation(update=state, received=state, num_classes=10, spec=SPEC, skeleton=Net(),
                           client=client, head_bias="fc3.bias")  # fmt: skip

    assert FEDAVG_AWARE in [a.name for a in applicable(update_of(16, 3))[0]]
    assert "several local epochs" in applicable(update_of(16, 1))[1][FEDAVG_AWARE]
    assert applicable(update_of(1000, 3))[1][FEDAVG_AWARE].startswith("not attempted")


def test_memorised_members_clear_the_within_class_null_and_a_noised_update_does_not():
    """Membership that the class composition cannot explain: a CNN that memorises 64 random-label images (members
    and non-members drawn alike) clears the null; the same update drowned in noise does not."""
    rng = np.random.default_rng(0)
    images = rng.random((320, 3, 32, 32)).astype(np.float32)
    labels = rng.integers(0, 10, 320)
    members, outsiders = (images[:64], labels[:64]), (images[64:], labels[64:])
    torch.manual_seed(0)
    model = Net()
    received = {n: t.numpy().copy() for n, t in model.state_dict().items()}
    train(model, *members, epochs=40, lr=0.02, batch_size=16, seed=1)
    sent = {n: t.numpy().copy() for n, t in model.state_dict().items()}
    client = ClientRecipe(64, 16, 40, 0.02, 0.0, 0.0, 0, False)

    def observed(update):
        return Observation(update=update, received=received, num_classes=10, spec=SPEC,
                           skeleton=Net(), client=client, head_bias="fc3.bias")  # fmt: skip

    result, _, _ = infer(observed(sent), Candidates(members, outsiders, "other noise images"))
    assert result.auc > 0.9 and result.clears_null, result
    noised = {n: w + rng.normal(0, 50, w.shape).astype(np.float32) for n, w in sent.items()}
    result, _, _ = infer(observed(noised), Candidates(members, outsiders, "other noise images"))
    assert not result.clears_null, result


def test_membership_shows_once_a_realistic_client_memorises():
    """A client at the scale people train (1,000 photograph-like images, Dirichlet(0.5) classes, batch 32, lr 0.01,
    momentum 0.9): after 3 local epochs its update shows no membership beyond the null; after 30, when it fits its
    own images far better than others of their class, the calibrated AUC clears its null (the onset
    benchmarks/membership_onset.py measures)."""
    found = {epochs: infer(*textures_update(epochs, 0.5))[0] for epochs in (3, 30)}
    assert not found[3].clears_null, found[3]
    memorised = found[30]
    assert memorised.auc > memorised.null.auc + 0.03, memorised


@functools.cache
def textures_update(epochs: int, alpha: float, others: int = 2000, size: int = 1000) -> tuple[Observation, Candidates]:
    """One client's update on ``size`` photograph-like images (batch 32, lr 0.01, the app's momentum 0.9) and its
    candidates: its images against ``others`` others of the generator."""
    images, labels = make_textures(size, 100, alpha)
    torch.manual_seed(0)
    model = Net()
    received = {n: t.numpy().copy() for n, t in model.state_dict().items()}
    train(model, images, labels, epochs, 0.01, 32, seed=1)
    sent = {n: t.numpy().copy() for n, t in model.state_dict().items()}
    client = ClientRecipe(size, 32, epochs, 0.01, 0.0, 0.0, 0, False, True, momentum_known=False)
    obs = Observation(update=sent, received=received, num_classes=10, spec=SPEC, skeleton=Net(),
                      client=client, head_bias="fc3.bias")  # fmt: skip
    return obs, Candidates((images, labels), make_textures(others, 999), "other textures")


def test_the_strongest_score_is_reported_against_the_null_of_the_same_maximum():
    """A client that memorises (40 local epochs on its 250 photograph-like images): the audit's membership figures
    are its strongest score's, at least the plain loss-threshold attack's AUC that this test computes itself from
    the sent weights, and beyond a null that accounts for the choice among the scores: each score's null within
    the family is at least its null alone. (At 1% FPR 250 members are too few to single any out.)"""
    from sklearn.metrics import roc_auc_score

    from fedvit.attacks.membership import candidate_losses, loss_drop_score, sent_loss_score

    obs, candidates = textures_update(40, 0.5, size=250)
    model = Net()
    model.load_state_dict({n: torch.as_tensor(w) for n, w in obs.update.items()})
    model.eval()
    (images, labels), (others, other_labels) = candidates.members, candidates.non_members
    with torch.no_grad():
        loss = lambda x, y: torch.nn.functional.cross_entropy(  # noqa: E731
            model(normalize_cnn(torch.as_tensor(x))), torch.as_tensor(y), reduction="none").numpy()  # fmt: skip
        threshold_auc = roc_auc_score(np.r_[np.ones(len(images)), np.zeros(len(others))],
                                      -np.r_[loss(images, labels), loss(others, other_labels)])  # fmt: skip

    found = candidate_losses(obs, candidates)
    scores = [sent_loss_score(found, False), sent_loss_score(found, True), loss_drop_score(found)]
    result, _, _ = judge(scores, candidates)
    assert result.scores["loss of the sent weights"].auc == pytest.approx(threshold_auc, abs=1e-6)
    assert result.auc >= threshold_auc - 1e-9 and result.auc > result.null.auc + 0.1, result
    labels_of = candidates.members[1], candidates.non_members[1]
    for single in scores:  # alone, a score's null is lower: the family's accounts for the choice
        alone = null_figures([single], *labels_of)[0].named()
        family = result.scores[single.name].null.named()
        assert all(alone[k] <= family[k] + 1e-12 for k in alone if alone[k] is not None), (single.name, alone, family)


def test_the_empirical_epsilon_compares_sides_of_one_class_composition():
    """A skewed client (every member in class 0) whose update says nothing about its records: a raw score that ranks
    class 0 first separates its members from the population's images (TPR 1 at FPR 0.1), which no DP guarantee
    bounds — the ε bound compares as many members as non-members of each class, so it proves nothing there (a false
    "violates" otherwise); members that do score higher within their class prove ε beyond the bound's null; on
    canaries, included at random, every image counts and the class-first score proves a large ε."""

    rng = np.random.default_rng(0)
    members, non_members = np.zeros(300, np.int64), np.repeat(np.arange(10), 100)
    candidates = Candidates((np.zeros((300, 1)), members), (np.zeros((1000, 1)), non_members), "others")
    by_class = Score("class 0 first", "raw", -members + rng.normal(0, 0.01, 300),
                     -non_members + rng.normal(0, 0.01, 1000), per_class=False)  # fmt: skip
    noise = Score("noise", "per class", rng.normal(size=300), rng.normal(size=1000))
    bound_of = lambda scores, c: privacy_bound(scores, c.members[1], c.non_members[1], c.canaries, 1e-5)  # noqa: E731
    bound = bound_of([by_class, noise], candidates)
    assert bound.scores == ["class 0 first", "noise"] and bound.members == bound.non_members == 100, bound
    assert bound.epsilon_lower < 0.5 and bound.null_draws == 200, bound
    leaking = Score("members higher", "per class", rng.normal(3, 1, 300), rng.normal(size=1000))
    leaked = bound_of([by_class, leaking], candidates)
    assert leaked.epsilon_lower > max(1.0, leaked.null + 0.5), leaked
    planted = bound_of([by_class, noise], dataclasses.replace(candidates, canaries=True))
    assert planted.members == 300 and planted.non_members == 1000
    assert planted.epsilon_lower > 1.5, planted


def test_the_empirical_epsilon_proves_nothing_on_a_control_without_information(monkeypatch):
    """40 no-information controls: a skewed client (Dirichlet(0.5) classes, 1,000 members) and non-members of other
    Dirichlet shares (500), every image's score its class's shift plus noise, members and non-members alike. A 95%
    lower bound may exceed 0 in 5% of them; the audit's (raw values on sides of one class composition) does in at
    most 2 of 40 (none when written). Ranks calibrated against the non-members of each class (the
    other figures' calibration, which the bound once used) "prove" ε > 0 in about half of them, up to ε 2: a
    member's rank among the other side is not exchangeable with a non-member's rank among its own side."""
    from fedvit.audit import membership_stats

    monkeypatch.setattr(membership_stats, "EPSILON_NULL_DRAWS", 5)  # the bound is under test here, not its null
    rng = np.random.default_rng(1)
    audit_bounds, rank_bounds = [], []
    for _ in range(40):
        member_labels = rng.choice(10, 1000, p=rng.dirichlet([0.5] * 10))
        non_member_labels = rng.choice(10, 500, p=rng.dirichlet([0.5] * 10))
        shift = rng.normal(0, 1, 10)
        inside = shift[member_labels] + rng.standard_normal(1000)
        outside = shift[non_member_labels] + rng.standard_normal(500)
        family = [Score("calibrated", "", inside, outside), Score("raw", "", inside + 0, outside + 0, per_class=False),
                  Score("raw, negated", "", -inside, -outside, per_class=False)]  # fmt: skip
        found = privacy_bound(family, member_labels, non_member_labels, False, 1e-5, seed=len(audit_bounds))
        assert found.scores == ["calibrated", "raw, negated"], found  # equal raw values count once
        audit_bounds.append(found.epsilon_lower)
        ranks = calibrate(inside, outside, member_labels, non_member_labels)
        rank_bounds.append(empirical_epsilon([ranks], 1e-5).epsilon_lower)
    audit_bounds, rank_bounds = np.array(audit_bounds), np.array(rank_bounds)
    print(
        f"bound > 0: audit {np.sum(audit_bounds > 0)} of 40 (largest {audit_bounds.max():.3f}); "
        f"per-class ranks {np.sum(rank_bounds > 0)} of 40 (largest {rank_bounds.max():.3f})"
    )
    assert np.sum(audit_bounds > 0) <= 2 and audit_bounds.max() < 0.2, audit_bounds
    assert np.sum(rank_bounds > 0) >= 10 and rank_bounds.max() > 1.0, rank_bounds  # what the control catches


def test_a_dp_claim_is_violated_only_beyond_the_bounds_null():
    """A bound above the claimed ε but not above its null is no evidence against the claim."""
    from fedvit.audit.evidence import privacy_evidence
    from fedvit.observed.recipe import PrivacyClaim

    claim = PrivacyClaim(0.1, 1e-5, None, None, "run config")
    found = PrivacyBound(0.3, 1e-5, 0.95, 10, None, null=0.4, null_draws=200, members=5, non_members=5, scores=["s"])
    assert privacy_evidence(claim, found).consistent
    assert not privacy_evidence(claim, dataclasses.replace(found, null=0.2)).consistent
    assert privacy_evidence(claim, dataclasses.replace(found, null=0.0, epsilon_lower=0.1)).consistent
    assert privacy_evidence(None, found).consistent is None  # no claim: nothing to be consistent with


def test_a_clients_rounds_combined_show_more_than_its_best_round():
    """Two IID clients of 300 photograph-like images under FedAvg for 5 rounds of 1 local epoch (batch 32, momentum
    0.9): one client's membership over its 5 updates (each score's per-round ranks combined) has an AUC at least
    its best single round's, beyond the null built the same way; "members" the client never held (as many of each
    class) combined over the same updates clear nothing. (At 1% FPR the average dilutes what single rounds show:
    rounds 2 and 4 single out members beyond their nulls, the combination does not; the report keeps both.)"""
    from fedvit.attacks.membership import candidate_losses, loss_drop_score, sent_loss_score

    mine, theirs = make_textures(300, 100), make_textures(300, 101)
    candidates = Candidates(mine, make_textures(2000, 999), "other textures")
    images, labels = make_textures(4000, 4242)
    never_held = np.concatenate([np.flatnonzero(labels == c)[: np.sum(mine[1] == c)] for c in range(10)])
    strangers = dataclasses.replace(candidates, members=(images[never_held], labels[never_held]))
    torch.manual_seed(0)
    model = Net()
    state = lambda m: {n: t.detach().numpy().copy() for n, t in m.state_dict().items()}  # noqa: E731
    client = ClientRecipe(300, 32, 1, 0.01, 0.0, 0.0, 0, False, True, momentum_known=False)
    rounds: dict[str, list] = {"members": [], "strangers": []}
    for r in range(5):
        received, sent = state(model), []
        for data in (mine, theirs):
            model.load_state_dict({n: torch.as_tensor(w) for n, w in received.items()})
            train(model, *data, 1, 0.01, 32, seed=r)
            sent.append(state(model))
        obs = Observation(update=sent[0], received=received, num_classes=10, spec=SPEC,
                          skeleton=Net(), client=client, head_bias="fc3.bias")  # fmt: skip
        for side, found in (("members", candidates), ("strangers", strangers)):
            losses = candidate_losses(obs, found)
            rounds[side].append([sent_loss_score(losses, False), sent_loss_score(losses, True),
                                 loss_drop_score(losses)])  # fmt: skip
        model.load_state_dict({n: torch.as_tensor((a + b) / 2) for (n, a), b in zip(sent[0].items(), sent[1].values(),
                                                                                     strict=True)})  # fmt: skip
    singles = [judge(scores, candidates)[0] for scores in rounds["members"]]
    combined = judge(over_rounds(rounds["members"]), candidates)[0]
    best = max(s.auc for s in singles)
    assert combined.auc >= best and combined.auc > combined.null.auc, ([s.auc for s in singles],
                                                                                  combined)  # fmt: skip
    assert combined.reference.endswith("over 5 update(s)")
    control = judge(over_rounds(rounds["strangers"]), strangers)[0]
    assert not control.clears_null, control


def test_shadow_residuals_single_out_the_members_of_a_realistic_client():
    """1,000 photograph-like images, Dirichlet(0.5) classes, batch 32, momentum 0.9, 3 local epochs: the loss drop
    finds no member at 1% FPR; each image's gradient against what the update holds beyond 8 shadow updates (the
    pool's gradients projected out) clears its null in AUC and TPR at 1% FPR. With "members" the client never held
    (the same class counts) the same update clears nothing."""
    from fedvit.attacks.membership import reference_updates, split_for_references

    obs, candidates = textures_update(3, 0.5, others=4000)
    drop = infer(obs, candidates)[0]
    assert not drop.clears_null, drop
    counts = np.bincount(candidates.members[1], minlength=10)
    kept, pool = split_for_references(candidates)
    shadows = reference_updates(obs, pool, counts, 0.9, seed=0)
    found = infer(obs, kept, 0, shadows, pool)[0]
    assert len(shadows) == 8 and found.reference.startswith("the update beyond 8 shadow updates"), found
    assert found.reference.endswith("at 3 point(s) of the local training (2000 shadow images' gradients "
                                       "projected out)"), found  # fmt: skip
    assert found.clears_null and found.tpr_at_1_percent > found.null.tpr_at_1_percent + 0.01, found
    assert found.auc > found.null.auc + 0.1, found

    images, labels = make_textures(8000, 4242)
    never_held = np.concatenate([np.flatnonzero(labels == c)[: counts[c]] for c in range(10)])
    strangers = Candidates((images[never_held], labels[never_held]), kept.non_members, kept.source)
    control = infer(obs, strangers, 0, shadows, pool)[0]
    assert not control.clears_null and control.auc < control.null.auc, control


def test_shadows_never_train_on_a_scored_non_member():
    """The split gives the shadows (and the projected-out gradients) half the non-members and scores the other half.
    Built from the scored non-members themselves, the residual is orthogonal to their gradients only, a gap the
    within-class null cannot see: with "members" the client never held (no membership at all) that alone clears
    the null; the split does not."""
    from fedvit.attacks.membership import reference_updates, split_for_references

    obs, _ = textures_update(3, 0.0)
    strangers = make_textures(1000, 555)  # not the client's: nothing to find
    candidates = Candidates(strangers, make_textures(2000, 999), "other textures")
    kept, pool = split_for_references(candidates)
    both = np.concatenate([pool.images, kept.non_members[0]])
    assert len(both) == 2000 and len(np.unique(both.reshape(2000, -1), axis=0)) == 2000
    counts = np.bincount(strangers[1], minlength=10)
    scored = Auxiliary(*kept.non_members, "the scored non-members")
    leaky = infer(obs, kept, 0, reference_updates(obs, scored, counts, 0.9, seed=0), scored)[0]
    assert leaky.clears_null, leaky  # a membership signal where there is none
    sound = infer(obs, kept, 0, reference_updates(obs, pool, counts, 0.9, seed=0), pool)[0]
    assert sound.auc < sound.null.auc and not sound.clears_null, sound


def test_a_score_that_only_tells_the_class_is_not_membership():
    """Members skewed to some classes, non-members uniform, a score that depends on the class alone (a noised
    model's class bias): its raw AUC is high; calibrated on each class's non-members it is not, and the
    within-class null reaches it either way."""

    rng = np.random.default_rng(0)
    member_labels = rng.choice(10, 500, p=np.r_[np.full(3, 0.3), np.full(7, 0.1 / 7)])
    outsider_labels = rng.integers(0, 10, 1000)
    score_of = lambda y: -np.abs(y - 1.0) + rng.normal(0, 0.01, len(y))  # noqa: E731 — peaks at classes 0-2
    inside, outside = score_of(member_labels), score_of(outsider_labels)
    raw = roc_figures(inside, outside)
    figures = roc_figures(*calibrate(inside, outside, member_labels, outsider_labels))
    null = null_figures([Score("class", "", inside, outside)], member_labels, outsider_labels)[0]
    assert raw.auc > 0.7 and abs(figures.auc - 0.5) < 0.05, (raw, figures)
    assert not (figures.auc > null.auc and figures.tpr_at_1_percent > null.tpr_at_1_percent)


def test_calibration_ranks_each_class_among_its_non_members():
    inside, outside = calibrate(np.array([5.0, 1.0, 7.0]), np.array([1.0, 3.0, 10.0, 10.0, 4.0]),
                                np.array([0, 1, 2]), np.array([0, 0, 1, 1, 2]))  # fmt: skip
    assert np.allclose(outside, [0.25, 0.75, 0.5, 0.5, 0.5]) and np.allclose(inside[:2], [1.0, 0.0])
    assert np.isclose(inside[2], 3 / 5)  # class 2 has one non-member: ranked among all five


def test_calibration_is_each_class_ranked_on_its_own():
    """The calibration (the null's batched ranks on one draw) equals ranking each class's scores among that class's
    non-members (all non-members for a class with fewer than two), ties included."""

    rng = np.random.default_rng(0)
    for case in range(200):
        sizes = rng.integers(1, 60), rng.integers(1, 80)
        draw = (lambda n: rng.integers(0, 12, n).astype(float)) if case % 2 else (lambda n: rng.normal(size=n))
        inside, outside = draw(sizes[0]), draw(sizes[1])
        member_labels, outsider_labels = rng.integers(0, 6, sizes[0]), rng.integers(0, 6, sizes[1])
        found = calibrate(inside, outside, member_labels, outsider_labels)
        for c in range(6):
            reference = outside[outsider_labels == c] if (outsider_labels == c).sum() >= 2 else outside
            assert np.array_equal(found[0][member_labels == c], class_ranks(inside[member_labels == c], reference))
            assert np.array_equal(found[1][outsider_labels == c], class_ranks(outside[outsider_labels == c],
                                                                              reference))  # fmt: skip


def test_calibrated_auc_is_the_within_class_auc_however_skewed_the_classes():
    """A class holding most members with a long-tailed score, another holding most non-members: the pooled
    calibrated AUC is the member-weighted within-class AUC, and a null split centres on 0.5 (a mean/std
    standardisation gives 0.50 for a within-class 0.63 here, and 0.46 for the null)."""

    rng = np.random.default_rng(0)
    member_labels, outsider_labels = np.repeat([0, 1], [900, 100]), np.repeat([0, 1], [100, 900])
    tail = lambda n, shift: rng.exponential(1.0, n) ** 3 + shift  # noqa: E731
    inside = np.where(member_labels == 0, tail(1000, 0.3), rng.normal(0.3, 1, 1000))
    outside = np.where(outsider_labels == 0, tail(1000, 0.0), rng.normal(0.0, 1, 1000))
    within = [roc_figures(inside[member_labels == c], outside[outsider_labels == c]).auc for c in (0, 1)]
    pooled = roc_figures(*calibrate(inside, outside, member_labels, outsider_labels)).auc
    assert abs(pooled - (0.9 * within[0] + 0.1 * within[1])) < 0.01, (pooled, within)
    null_inside, null_outside = tail(1000, 0.0), tail(1000, 0.0)  # class 0 both sides: no membership
    null_inside[member_labels == 1] = rng.normal(0, 1, 100)
    null_outside[outsider_labels == 1] = rng.normal(0, 1, 900)
    null = roc_figures(*calibrate(null_inside, null_outside, member_labels, outsider_labels)).auc
    assert abs(null - 0.5) < 0.03, null


def test_the_projection_and_gradient_chunks_shrink_to_fit_a_large_model(monkeypatch):
    """Per-image gradients of a large model would not fit: the pool whose gradients are projected out and the chunks
    they are taken in shrink to GRADIENT_BYTES (the report states the pool's size), and the gradients stay exact."""
    import fedvit.attacks.membership as membership
    from fedvit.core.model import classify

    model = Net().eval()
    params = membership.parameter_count(model)
    assert membership.projection_pool(model) == membership.PROJECTION_POOL
    monkeypatch.setattr(membership, "GRADIENT_BYTES", 2 * 4 * params * 10)  # room for 10 gradients in the pool
    assert membership.projection_pool(model) == 10
    images, labels = make_textures(7, 3)
    chunks = list(membership.per_sample_gradients(model, images, labels))
    assert [len(c) for c in chunks] == [5, 2]  # a quarter of the budget: 5 gradients per chunk
    logits = classify(model, torch.as_tensor(images[6:7]))
    loss = torch.nn.functional.cross_entropy(logits, torch.as_tensor(labels[6:7]))
    expected = torch.cat([g.flatten() for g in torch.autograd.grad(loss, list(model.parameters()))])
    assert torch.allclose(chunks[1][1], expected, atol=1e-6)
    assert torch.equal(membership.gradient_matrix(model, images, labels), torch.cat(chunks))  # written in place


class Tokens(torch.nn.Module):
    """A linear layer on each of four tokens per image (its per-image gradient has rank up to 4), then a head."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.head = torch.nn.Linear(3, 6), torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.proj(x.flatten(2).transpose(1, 2))).mean(1))


def test_the_pool_gradients_factor_linear_layers_and_give_the_explicit_products():
    """The pool's per-image gradients with each linear layer held as its output gradients and inputs: G v, Gᵀ c and
    G Gᵀ equal the explicit G's to float32 rounding on the CNN (its three linear layers factored, the convolutions
    explicit) and on its head alone; a layer that runs on several tokens per image is not an outer product per
    image and stays explicit; a model whose batched pass mixes its images is caught by the per-image check."""
    from fedvit.attacks.membership import gradient_matrix, linear_layers, pool_gradients

    def assert_same_products(model, images, labels, names=None):
        g = gradient_matrix(model, images, labels, names)
        pool = pool_gradients(model, images, labels, names)
        draws = torch.Generator().manual_seed(2)
        v, c = torch.randn(g.shape[1], generator=draws), torch.randn(len(g), generator=draws)
        exact = (g.double() @ g.double().T).float()
        assert torch.allclose(pool.times(v), g @ v, rtol=1e-4, atol=1e-6 * float((g @ v).abs().max()))
        assert torch.allclose(pool.transposed_times(c), g.T @ c, rtol=1e-4, atol=1e-6 * float((g.T @ c).abs().max()))
        assert torch.allclose(pool.gram(), exact, rtol=1e-4, atol=1e-6 * float(exact.abs().max()))
        return pool

    torch.manual_seed(0)
    model = Net().eval()
    images, labels = make_images(300, 3, 0.0)
    assert [(m.out_features, m.in_features) for _, m, _, _ in linear_layers(model, None)] == [(120, 400), (84, 120),
                                                                                              (10, 84)]  # fmt: skip
    pool = assert_same_products(model, images, labels)
    assert len(pool.linear) == 3 and pool.dense.shape == (300, 456 + 2416)  # the convolutions' columns only
    head = assert_same_products(model, images, labels, ["fc3.weight", "fc3.bias"])
    assert len(head.linear) == 1 and head.dense.shape[1] == 0
    # tokens: the projection's per-image gradient has rank > 1, so it stays explicit; the head is factored
    tokens = Tokens().eval()
    pixels = torch.rand(64, 3, 2, 2, generator=torch.Generator().manual_seed(1)).numpy()
    pool = assert_same_products(tokens, pixels, np.arange(64) % 3)
    assert len(pool.linear) == 1 and pool.dense.shape[1] == 6 * 3 + 6
    # a batched pass that mixes the images (each logit shifted by the batch's mean): the factors are not each
    # image's gradient, and the check keeps the layer explicit
    mixing = Mixing().eval()
    pool = assert_same_products(mixing, pixels, np.arange(64) % 3)
    assert len(pool.linear) == 0


class Mixing(torch.nn.Module):
    """A head whose output depends on the whole batch (the batch mean subtracted from its input)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.flatten(1)
        return self.head(h - 0.5 * h.mean(0, keepdim=True))


def test_the_gram_matrix_from_its_upper_blocks_is_exactly_g_times_its_transpose():
    """The pool gradients' Gram matrix, from the blocks on and above its diagonal (mirrored): bit-equal to g @ g.T
    on one torch thread (as in CI's workers) for pools of any size (one block, two of 250 and 251 rows, uneven
    splits) and of a head's or a whole CNN's parameters, so that the audit's figures do not move; on more threads
    the matrix product splits its sums by thread and the two agree to rounding only."""
    from fedvit.attacks.membership import gram_matrix

    threads = torch.get_num_threads()
    draws = torch.Generator().manual_seed(0)
    try:
        torch.set_num_threads(1)
        for parameters in (850, 3001):
            for rows in (3, 500, 501, 1003, 1234):
                g = torch.randn(rows, parameters, generator=draws)
                assert torch.equal(gram_matrix(g), g @ g.T), (rows, parameters)
        g = torch.randn(1234, 3001, generator=draws)
        for block in (300, 1234, 5000):
            assert torch.equal(gram_matrix(g, block), g @ g.T), block
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(gram_matrix(g, 300), g @ g.T, rtol=1e-5, atol=1e-3)


def test_the_clients_of_a_round_share_the_projection_at_the_received_weights(monkeypatch):
    """Two clients' updates from the same received weights, scored against the same pool: the second reuses the
    first's factorised G Gᵀ at the received weights (one factorisation fewer of its three points) and its alignment
    scores are bit-equal to those computed afresh; other received weights or another pool get their own."""
    import fedvit.attacks.membership as membership

    obs, candidates = textures_update(1, 0.5, others=400, size=200)
    second, second_candidates = textures_update(1, 0.0, others=400, size=150)
    assert all(np.array_equal(obs.received[n], second.received[n]) for n in obs.received)
    kept, pool = membership.split_for_references(candidates)
    shadows = membership.reference_updates(obs, pool, np.bincount(candidates.members[1], minlength=10), 0.9, seed=0,
                                           count=2)  # fmt: skip
    scored = list(membership.sides(dataclasses.replace(second_candidates, non_members=kept.non_members)))
    inverses = []
    factorised = membership.factorised
    monkeypatch.setattr(membership, "factorised", lambda *a, **k: inverses.append(1) or factorised(*a, **k))

    def scores(update: Observation, images: Auxiliary, fresh: bool = False) -> tuple[list[np.ndarray], int]:
        if fresh:
            membership._received_projection.clear()
        before = len(inverses)
        found = membership.alignment_scores(update, shadows, images, scored)
        return found, len(inverses) - before

    assert scores(obs, pool, fresh=True)[1] == 3  # one per point
    shared, computed = scores(second, pool)
    assert computed == 2
    afresh, computed = scores(second, pool, fresh=True)
    assert computed == 3 and all(np.array_equal(a, b) for a, b in zip(shared, afresh, strict=True))
    moved = dataclasses.replace(second, received={n: w + 1e-3 for n, w in second.received.items()})
    assert scores(moved, pool)[1] == 3
    assert scores(second, pool)[1] == 3  # the round's projection again (the memo holds the last one only) ...
    assert scores(second, pool)[1] == 2
    assert scores(second, Auxiliary(*kept.non_members, "other images"))[1] == 3  # ... but not for another pool


def test_simulations_follow_a_dp_sgd_claim_and_flowers_update_clipping():
    """A DP-SGD claim (noise multiplier, clipping norm): the simulation's steps are DP-SGD's — without noise and with
    a bound no gradient reaches they are SGD's, with noise the update moves elsewhere; Flower's client-side clipping
    (``clipping_norm`` in the ConfigRecord): the simulated update's norm is at most the bound. Either way the label
    counts are said to rest on SGD's relation."""
    import dataclasses

    from fedvit.observed.observation import not_plain_sgd
    from fedvit.observed.recipe import PrivacyClaim

    obs, _, _ = client_update(64, 1, alpha=0.0)
    aux = Auxiliary(*make_images(200, 99), "other images")
    counts = np.full(10, 6)

    def simulated(**changes) -> dict[str, np.ndarray]:
        client = dataclasses.replace(obs.client, **changes)
        return simulate(
            dataclasses.replace(obs, client=client), aux, counts, 0.0, 0, keep_weights=True, private=True
        ).weights

    def claim(sigma: float, bound: float) -> PrivacyClaim:
        return PrivacyClaim(1.0, 1e-5, sigma, bound, "reply metrics")

    plain = simulated()
    client = dataclasses.replace(obs.client, privacy=claim(1.0, 0.1))  # the label estimate's own: plain steps
    unprivate = simulate(dataclasses.replace(obs, client=client), aux, counts, 0.0, 0, keep_weights=True).weights
    assert all(np.array_equal(unprivate[n], plain[n]) for n in plain)
    for name, value in simulated(privacy=claim(0.0, 1e6)).items():
        np.testing.assert_allclose(value, plain[name], atol=1e-5, err_msg=name)
    clipped, noised = simulated(privacy=claim(0.0, 0.1)), simulated(privacy=claim(1.0, 0.1))
    assert not np.allclose(clipped["fc1.weight"], plain["fc1.weight"], atol=1e-6)
    steps = obs.client.steps  # each adds N(0, (σC)²) / B per entry, times lr
    spread = (noised["fc1.weight"] - clipped["fc1.weight"]).std() / (0.01 * 1.0 * 0.1 / 32 * np.sqrt(steps))
    assert 0.8 < spread < 1.2, spread
    trained = [n for n, _ in Net().named_parameters()]

    def norm(weights: dict[str, np.ndarray]) -> float:
        return float(np.sqrt(sum(((weights[n] - obs.received[n]) ** 2).sum() for n in trained)))

    half = norm(plain) / 2
    assert norm(simulated(update_clip=half)) == pytest.approx(half, rel=1e-4)
    assert norm(simulated(update_clip=4 * half)) == pytest.approx(2 * half, rel=1e-6)  # under the bound: as it was

    def told(**changes) -> str | None:
        return not_plain_sgd(dataclasses.replace(obs, client=dataclasses.replace(obs.client, **changes)))

    assert told() is None and told(update_clip=10 * norm(obs.update)) is None
    assert "claims DP-SGD" in told(privacy=claim(1.0, 1.0))
    bound = norm(obs.update)
    assert told(update_clip=bound) == f"the update was clipped to norm {bound:g}: its scale is unknown"
    # Flower's LocalDpMod: the update clipped, then N(0, std²) on every entry — in the shadows and the twin only
    local = simulated(update_clip=half, update_noise=0.05)
    assert norm(local) > 2 * half  # the noise, not the bound, sets its norm now
    for name in trained:
        added = local[name] - simulated(update_clip=half)[name]
        if added.size >= 400:
            assert 0.9 < added.std() / 0.05 < 1.1 and abs(added.mean()) < 0.01, name
    client = dataclasses.replace(obs.client, update_clip=half, update_noise=0.05)
    unnoised = simulate(dataclasses.replace(obs, client=client), aux, counts, 0.0, 0, keep_weights=True).weights
    assert norm(unnoised) == pytest.approx(half, rel=1e-4)  # the label estimate's own: clipped, not noised
    assert told(update_clip=half, update_noise=0.05) == (
        "Flower's LocalDpMod added Gaussian noise of std 0.05 to every entry of the update"
    )


def test_a_declared_augmentation_is_tried_with_and_without_where_the_optimiser_is_inferred():
    """Item 3 of the recipe's inference: where nothing states the optimiser, every candidate runs with the declared
    augmentation and without it, and the note gives each one's fit. This client trained on plain images."""
    from fedvit.attacks.label_distribution import candidate_recipes
    from fedvit.observed.augmentation import parse

    obs, _, _ = client_update(160, 1, alpha=0.5)
    declared = dataclasses.replace(obs.client, optimiser=None, augment=parse("crop:0.5+flip"))
    obs = dataclasses.replace(obs, client=declared)
    tried = candidate_recipes(obs)
    assert len(tried) == 8 and {c.augment for c in tried} == {declared.augment, None}
    found = estimate(obs, Auxiliary(*make_images(400, 99), "other images"))
    for name in ("SGD β 0.9", "SGD β 0.9, no augmentation", "Adam, no augmentation", "AdamW"):
        assert f"{name}: norm ×" in found.note, found.note
    # the plain client's update is told from the cropped candidates: the simulation runs without the crops
    assert found.augment is None and found.optimiser == "sgd" and found.fit.fits, found.note
    # stated optimiser: the declared augmentation is taken as stated (one candidate per momentum)
    stated = dataclasses.replace(obs, client=dataclasses.replace(declared, optimiser="sgd"))
    assert {c.augment for c in candidate_recipes(stated)} == {declared.augment}


@pytest.mark.parametrize("members, per_class_outside, lone", [(60, 40, False), (300, 3, True)])
def test_the_batched_null_judges_every_draw_as_the_real_split_is_judged(members, per_class_outside, lone):
    """The null judges its draws in batches; each draw's figures must be :func:`score_figures`' on that draw's split,
    for every kind of score: calibrated with ties, raw with and without ties, a class with one non-member (``lone``:
    ranked among all), a Gaussian fit (each member class with enough non-members), and a combination over rounds."""
    from fedvit.audit.membership_stats import (
        PARAMETRIC,
        RoundsScore,
        null_judged,
        null_parametric,
        null_roc_figures,
        resplit,
        score_figures,
        within_class_shuffles,
    )

    rng = np.random.default_rng(3)
    member_labels = rng.integers(0, 4, members)
    non_member_labels = np.r_[np.repeat(np.arange(4), per_class_outside), 4, 4, 5]
    non_member_labels = non_member_labels[rng.permutation(len(non_member_labels))]
    if lone:
        member_labels[:2] = 5  # class 5 has one non-member: ranked among all of them

    def values(shift: float, rounded: bool = False) -> tuple[np.ndarray, np.ndarray]:
        inside, outside = rng.normal(shift, 1, len(member_labels)), rng.normal(0, 1, len(non_member_labels))
        return (np.round(inside, 1), np.round(outside, 1)) if rounded else (inside, outside)  # ties

    tied, raw = Score("tied", "", *values(0.3, rounded=True)), Score("raw", "", *values(0.2), per_class=False)
    raw_tied = Score("raw, tied", "", *values(0.3, rounded=True), per_class=False)
    family = [tied, raw, raw_tied, Score("fit", "", *values(0.5)),
              RoundsScore("rounds", "", (Score("part", "", *values(0.1)), raw, tied))]  # fmt: skip
    classes = np.r_[member_labels, non_member_labels]
    is_member = np.r_[np.ones(len(member_labels), bool), np.zeros(len(non_member_labels), bool)]
    resolution = fpr_resolution(member_labels, non_member_labels)[0]
    masks = np.stack(list(within_class_shuffles(is_member, classes, 25, seed=1)))
    for kind in family:
        batched = null_roc_figures(null_judged(kind, classes, masks), masks, resolution)
        batched[PARAMETRIC] = null_parametric(kind, classes, masks)
        for d, mask in enumerate(masks):
            one = score_figures(resplit(kind, mask), classes[mask], classes[~mask], resolution).named()
            assert list(one) == list(batched), kind.name
            for figure, value in one.items():
                if value is None:
                    assert batched[figure] is None, (kind.name, figure)
                else:
                    assert batched[figure][d] == pytest.approx(value, abs=1e-12), (kind.name, figure, d)
    assert (null_parametric(family[3], classes, masks) is None) == lone  # the fit was compared where it applies



@pytest.mark.parametrize("tied_at_the_edge", [False, True])
def test_the_batched_null_reads_a_tpr_whose_point_lies_at_the_last_false_positive_allowed(tied_at_the_edge):
    """The batched ROC walks only the images that can hold a point with FPR ≤ the largest target: here the real
    split (and its mirror) puts the last member right after the 2 false positives that 1% FPR of 200 non-members
    allows (TPR 100% there), or tied with a third non-member (TPR 90%: the run ends past 1%); each draw must read
    what :func:`score_figures` reads on it."""
    from fedvit.audit.membership_stats import null_roc_figures, resplit, score_figures

    inside = np.r_[np.full(9, 10.0), 5.0]
    outside = np.r_[6.0, 6.0, 5.0 if tied_at_the_edge else 0.0, np.zeros(197)]
    score = Score("edge", "", inside, outside, per_class=False)
    classes = np.zeros(len(inside) + len(outside), np.int64)
    is_member = np.r_[np.ones(len(inside), bool), np.zeros(len(outside), bool)]
    masks = np.stack([is_member, np.roll(is_member, 1)])
    resolution = fpr_resolution(classes[is_member], classes[~is_member])[0]
    batched = null_roc_figures(np.r_[inside, outside], masks, resolution)
    assert batched["tpr@0.01"][0] == (0.9 if tied_at_the_edge else 1.0)
    for d, mask in enumerate(masks):
        one = score_figures(resplit(score, mask), classes[mask], classes[~mask], resolution).named()
        for figure, value in batched.items():
            assert value is None if one[figure] is None else value[d] == pytest.approx(one[figure], abs=1e-12)

def test_the_projection_solves_the_normal_equations_by_cholesky_and_falls_back_where_it_misses():
    """Gᵀa with G Gᵀ a = G r is r's projection onto G's row space whichever factor solves it: Cholesky on a full-rank
    G (the pseudo-inverse's projection to float64 rounding), the pseudo-inverse where G's rows repeat (G Gᵀ
    singular: Cholesky fails or misses the normal equations)."""
    from fedvit.attacks.membership import factorised, gram_matrix

    g = torch.randn(40, 300, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    r = torch.randn(300, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for rows, expected in ((g, "cholesky"), (torch.cat([g, g[:5]]), "pseudo-inverse")):
        a, used = factorised(gram_matrix(rows)).solve(rows @ r)
        assert used == expected
        reference = rows.T @ (torch.linalg.pinv(rows @ rows.T, hermitian=True, rtol=1e-10) @ (rows @ r))
        assert torch.allclose(rows.T @ a, reference, rtol=1e-7, atol=1e-9)
        assert not torch.allclose(rows.T @ a, r, atol=1e-3)  # a projection, not the identity


def test_the_alignment_takes_each_images_loss_slope_along_the_direction_without_its_gradient():
    """Forward mode gives each image's ⟨∇ℓ, d⟩ (the alignment's per-image figure) that the per-image gradients dotted
    with d give, on a partial set of parameters too; a direction of the wrong length is refused."""
    from fedvit.attacks.membership import loss_slopes, parameter_count, per_sample_gradients

    torch.manual_seed(0)
    model = Net().eval()
    images, labels = make_textures(20, 3)
    for names in (None, ["fc3.weight", "fc3.bias", "conv1.weight"]):
        direction = torch.randn(parameter_count(model, names), generator=torch.Generator().manual_seed(1))
        reference = torch.cat([g @ direction for g in per_sample_gradients(model, images, labels, names)])
        slopes = loss_slopes(model, images, labels, names, direction)
        np.testing.assert_allclose(slopes, reference.double().numpy(), rtol=1e-4, atol=1e-6)
        assert np.abs(slopes).max() > 1e-3  # not trivially zero
    with pytest.raises(ValueError, match="the direction has"):
        loss_slopes(model, images, labels, None, torch.zeros(5))


def test_membership_takes_the_label_estimate_as_an_input_whatever_the_order_of_the_measures(monkeypatch):
    """The shadow updates and the power twin simulate the label estimate's counts: measure_all runs the estimate as
    a stage of its own and gives its output to membership (``Held.estimate``), so listing the measures in another
    order (membership first) changes no outcome. Membership once read the counts from a shared scratch object that
    only the label entry's place at the head of ``MEASURES`` filled in time."""
    from fedvit.audit import registry
    from fedvit.core.budget import AuditConfig

    obs, images, labels = client_update(192, 1, alpha=0.5)
    others = make_images(600, 99)
    held = registry.Held(images, labels, None, True, AuditConfig(), {}, Auxiliary(*others, "other images"),
                         Candidates((images, labels), others, "other images"),
                         registry.MeasureOptions(references=2))  # fmt: skip
    measured = registry.measure_all(obs, held)
    assert measured.held.estimate.simulated_counts is not None and measured.held.split.pool is not None
    alignment = measured.findings[f"membership: {registry.ALIGNMENT}"]
    assert alignment.status.startswith("applied"), alignment.status  # the shadows ran on the estimate's counts
    monkeypatch.setattr(registry, "MEASURES", tuple(reversed(registry.MEASURES)))
    reordered = registry.measure_all(obs, held)
    assert {n: f.status for n, f in reordered.findings.items()} == {n: f.status for n, f in measured.findings.items()}
    first, again = registry.evidence(measured).leakage, registry.evidence(reordered).leakage
    assert again["membership"].figures.auc == first["membership"].figures.auc and again["labels"] == first["labels"]
