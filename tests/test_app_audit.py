"""The one audit pipeline on a third-party app's captures with the user's own model (fedvit.audit.pipeline,
model_spec.py).

Exchanges are made here as the test app's ClientApp makes them (its own train loop) and recorded by fedvit's
capture path; the audit sees only the capture folder and the model factory."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from fedvit.attacks.holdings import Auxiliary
from fedvit.attacks.simulation import simulate
from fedvit.audit.api import audit_captures, find_spec_file, read_spec_file, spec_from
from fedvit.audit.evidence import MembershipEvidence
from fedvit.audit.json_fields import json_keys
from fedvit.audit.membership_stats import RocFigures
from fedvit.audit.pipeline import AuditOptions, run_audit
from fedvit.audit.registry import MeasureOptions
from fedvit.audit.user_data import UserData
from fedvit.capture.reader import NOTHING_ON_THE_WIRE, AuditInputError
from fedvit.capture.writer import add_direction, capture_stem
from fedvit.core.budget import AuditConfig
from fedvit.observed.model_spec import ModelSpec, SpecError, model_settings
from fedvit.observed.observation import Observation
from fedvit.observed.recipe import ClientRecipe, map_state, sent_kind
from tests.report_checks import check_html, check_markdown

APP = Path(__file__).parent / "thirdparty_app"
sys.path.insert(0, str(APP))

from cnnapp.task import Net, load_data, partition_size, train  # noqa: E402

SPEC = ModelSpec("cnnapp.task:Net", app_dir=str(APP))
DATA = UserData("cnnapp_partitions:partition", {}, decoy_partitions=tuple(range(4, 40)), app_dir=str(APP))
BUDGET = AuditConfig(iterations=60, restarts=1, max_seconds=60)
SHADOWS = MeasureOptions(references=3)  # three shadow updates behind membership: enough to test it, quick on CPU


def audit_app_captures(captures: Path, out: Path, spec: ModelSpec, budget: AuditConfig, **options) -> dict:
    """The audit of another app's captures, as ``fedvit audit --model`` runs it."""
    return run_audit(captures, out, AuditOptions(spec=spec, budget=budget, **options))


def capture_exchange(
    root: Path,
    node: int,
    partition: int,
    server_round: int = 1,
    fedsgd: bool = False,
    batch: int = 4,
    clip: float | None = None,
    local_dp: dict[str, float] | None = None,
    recorded_partition: bool = False,
) -> None:
    """One train exchange of the test app (FedAvg, 1 local epoch at ``batch``, lr 0.05; or a FedSGD gradient),
    captured; ``clip``: Flower's client-side clipping (the bound in the ConfigRecord, the update scaled to it);
    ``local_dp``: the reply through Flower's own LocalDpMod with these settings, which the run config carries;
    ``recorded_partition``: the partition in the capture, as capture_mod records the node config's."""
    torch.manual_seed(server_round)
    model = Net()
    start = {n: t.clone() for n, t in model.state_dict().items()}
    received = ArrayRecord(model.state_dict())
    config = ConfigRecord({"lr": 0.05, "local-epochs": 1, "server-round": server_round}
                          | ({"clipping_norm": clip} if clip else {}))  # fmt: skip
    instruction = Message(RecordDict({"arrays": received, "config": config}), dst_node_id=node, message_type="train")
    images, labels = load_data(partition, partition_size("1,2,3,4", partition), 7)
    if fedsgd:
        loss = torch.nn.functional.cross_entropy(model((torch.as_tensor(images) - 0.5) / 0.5), torch.as_tensor(labels))
        loss.backward()
        reply_arrays = ArrayRecord({n: p.grad for n, p in model.named_parameters()})
    else:
        train(model, images, labels, epochs=1, lr=0.05, batch_size=batch, seed=server_round)
        state = model.state_dict()
        if clip:  # fixedclipping_mod: the whole update scaled by min(1, C / ‖Δ‖)
            norm = float(torch.sqrt(sum(((state[n] - start[n]) ** 2).sum() for n in state)))
            state = {n: start[n] + (state[n] - start[n]) * min(1.0, clip / norm) for n in state}
        reply_arrays = ArrayRecord(state)
    metrics = MetricRecord({"train_loss": 1.0, "num-examples": len(labels)})
    reply = Message(RecordDict({"arrays": reply_arrays, "metrics": metrics}), reply_to=instruction)
    run_config = {"batch-size": batch, "partition-sizes": "1,2,3,4", "seed": 7}
    if local_dp:
        from flwr.clientapp.mod import LocalDpMod

        np.random.seed(server_round)  # Flower's noise draws from NumPy's global generator
        mod = LocalDpMod(*(local_dp[f"local-dp-{k}"] for k in ("clipping-norm", "sensitivity", "epsilon", "delta")))
        context = Context(run_id=5, node_id=node, node_config={}, state=RecordDict(), run_config={})
        reply = mod(instruction, context, lambda _m, _c: reply)
        run_config |= local_dp
    stem = capture_stem(root, 5, server_round, node, "train")
    head = {"run-id": 5, "round": server_round, "node": node, "run_config": run_config}
    if recorded_partition:  # as capture_mod records it from the node config
        head["partition"] = partition
    add_direction(stem, "received", instruction, **head)
    add_direction(stem, "sent", reply, **head)


DP_STEPS, DP_LR, DP_NOISE, DP_DELTA = 100, 3.0, 35.0, 1e-5


def capture_dp_exchange(root: Path, node: int, partition: int, noise: float) -> float:
    """One train exchange of a DP-GD client (the test app's ``train_dp``: full batch, per-image clipping to 1,
    noise multiplier ``noise``) on its 50 images and the canaries it included, captured with the claim its reply
    metrics make in Opacus' names: the ε of noise multiplier :data:`DP_NOISE` whatever ``noise`` it ran with.
    Returns the claimed ε."""
    from cnnapp.task import gdp_epsilon, train_dp
    from cnnapp_partitions import canaries, dp

    torch.manual_seed(1)
    model = Net()
    received = ArrayRecord(model.state_dict())
    (images, labels), (planted, planted_labels, included) = dp(partition), canaries(partition)
    x, y = np.concatenate([images, planted[included]]), np.concatenate([labels, planted_labels[included]])
    config = ConfigRecord({"lr": DP_LR, "local-epochs": DP_STEPS, "server-round": 1})
    instruction = Message(RecordDict({"arrays": received, "config": config}), dst_node_id=node, message_type="train")
    loss = train_dp(model, x, y, DP_STEPS, DP_LR, 1.0, noise, seed=1)
    epsilon = gdp_epsilon(DP_STEPS, DP_NOISE, DP_DELTA)
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(y), "epsilon": epsilon,
                            "target_delta": DP_DELTA, "noise_multiplier": DP_NOISE, "max_grad_norm": 1.0})  # fmt: skip
    reply = Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=instruction)
    stem = capture_stem(root, 5, 1, node, "train")
    head = {"run-id": 5, "round": 1, "node": node, "run_config": {"batch-size": len(y)}}  # full batch
    add_direction(stem, "received", instruction, **head)
    add_direction(stem, "sent", reply, **head)
    return epsilon


@pytest.mark.long  # minutes: scheduled first (conftest)
def test_a_dp_claim_is_read_and_tested_against_planted_canaries(tmp_path):
    """A DP-GD client that reports its ε (Opacus' metric names) with 128 canaries planted, each included with
    probability ½: the audit reads the claim and, scoring the canaries (included against left out), finds it
    consistent; the same client with its noise switched off, still claiming the noisy run's ε, memorises its
    canaries and is flagged: the empirical ε (a 95% Clopper–Pearson lower bound) exceeds the claim. The audit is
    asked for membership alone (``--leakage membership``), as a DP claim's check is: labels and images are reported
    as not asked for, and the label estimate, which no asked-for figure rests on here, does not run."""
    claimed = {}
    for name, noise in (("noisy", DP_NOISE), ("noiseless", 0.0)):
        claimed[name] = capture_dp_exchange(tmp_path / name, 21, 1, noise)
    assert 0.5 < claimed["noisy"] == claimed["noiseless"] < 1.5
    data = UserData("cnnapp_partitions:dp", {"21": 1}, tuple(range(4, 40)), str(APP),
                    canaries="cnnapp_partitions:canaries")  # fmt: skip
    asked = MeasureOptions(references=0, leakage=("membership",))
    reports = {name: audit_app_captures(tmp_path / name, tmp_path / f"{name}-out", SPEC, BUDGET, data=data,
                                        measures=asked) for name in claimed}  # fmt: skip
    for name, report in reports.items():
        (row,) = report["updates"]
        for kind in ("labels", "images"):
            evidence = row["leakage"][kind]  # every field of its type; not measured: the figures empty
            assert (evidence["status"], evidence["why"]) == ("not measured", "not asked for: --leakage membership")
            assert not evidence["clears"] and all(evidence[k] is None for k in ("error", "top1") if k in evidence)
        assert "labels not measured (not asked for: --leakage membership)" in report["verdict-detail"]
        assert "class-mix search" not in json.dumps(row)  # the label estimate did not run
        assert f"privacy claim ε {claimed[name]:g}, δ 1e-05, noise multiplier 35, clipping norm 1 (reply metrics)" in (
            row["recipe"])  # fmt: skip
        member = row["leakage"]["membership"]
        assert member["non-member-source"].startswith("canaries left out") or "canaries left out of 128" in (
            member["non-member-source"]), member  # fmt: skip
        assert member["members"] + member["non-members"] == 128
        assert row["attacks"]["membership: shadow alignment"].startswith("not applicable")
        privacy = member["privacy"]
        assert privacy["claimed-epsilon"] == pytest.approx(claimed[name]) and privacy["delta"] == DP_DELTA
    noisy, noiseless = (reports[n]["updates"][0]["leakage"]["membership"]["privacy"] for n in ("noisy", "noiseless"))
    assert noisy["consistent"] and noisy["empirical-epsilon"] <= claimed["noisy"], noisy
    assert not noiseless["consistent"] and noiseless["empirical-epsilon"] > claimed["noiseless"], noiseless
    assert "consistent with the claimed ε in 1 of 1" in reports["noisy"]["verdict-detail"]
    assert reports["noiseless"]["verdict-detail"].startswith("LEAKS") and "DP claim violated in 1 of 1" in (
        reports["noiseless"]["verdict-detail"])  # fmt: skip
    assert "violates the claimed ε" in (tmp_path / "noiseless-out" / "audit.md").read_text()


def test_a_leakage_type_not_asked_for_is_not_measured_unless_an_asked_for_figure_rests_on_it():
    """--leakage: a type not asked for reports why; the label estimate still runs where membership's shadow
    updates or its power twin simulate what it estimates (neither runs where canaries are scored)."""
    from types import SimpleNamespace

    from fedvit.audit.registry import Held, not_asked

    def held(leakage: tuple[str, ...], references: int, canaries: bool) -> Held:
        return Held(None, None, None, False, BUDGET, {}, candidates=SimpleNamespace(canaries=canaries),
                    options=MeasureOptions(references=references, leakage=leakage))  # fmt: skip

    assert not_asked("labels", held(("membership",), 8, False)) is None  # the shadow updates rest on it
    assert not_asked("labels", held(("membership",), 0, False)) is None  # the power twin does
    assert not_asked("labels", held(("membership",), 0, True)) == "not asked for: --leakage membership"
    assert not_asked("labels", held(("membership", "images"), 8, True)) == "not asked for: --leakage membership,images"
    assert not_asked("images", held(("membership",), 8, False)) == "not asked for: --leakage membership"
    assert not_asked("labels", held(("images",), 8, False)) == "not asked for: --leakage images"
    assert all(not_asked(k, held(("labels", "membership", "images"), 0, True)) is None
               for k in ("labels", "membership", "images"))  # fmt: skip
    for given in (iter(["membership", "label"]), "membership, label"):  # an iterator read once; the CLI's form
        with pytest.raises(ValueError, match=r"got \['label', 'membership'\]"):
            audit_captures(Path("no-captures"), leakage=given)


def test_the_measures_options_refuse_values_no_measure_can_use():
    """The measures' options check their own values, so the API, ``fedvit-audit.toml`` and a direct
    ``AuditOptions`` fail alike, before any capture is read."""
    for bad, message in (({"references": -1}, "membership references must be >= 0, got -1"),
                         ({"budgets": ()}, r"budgets must be Adam steps >= 1, got \[\]"),
                         ({"budgets": (50, 0)}, r"got \[50, 0\]"),
                         ({"leakage": ()}, "leakage must name some of")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            MeasureOptions(**bad)
    with pytest.raises(ValueError, match="membership references must be >= 0"):
        audit_captures(Path("no-captures"), membership_references=-2)
    with pytest.raises(ValueError, match=r"budgets must be Adam steps >= 1, got \[0, 10\]"):
        audit_captures(Path("no-captures"), budgets=[10, 0])
    with pytest.raises(ValueError, match=r"decoys \(--decoys\) must be >= 0, got -3"):
        audit_captures(Path("no-captures"), decoys=-3)
    assert MeasureOptions(budgets=(10, 50)).references == MeasureOptions().references > 0  # one default


def test_labels_are_exact_and_reconstructions_are_scored_against_the_users_partitions(tmp_path):
    for node, partition in ((11, 0), (12, 1), (13, 2), (14, 3)):  # B = 1, 2, 3, 4: one local step each
        capture_exchange(tmp_path / "cap", node, partition)
    data = UserData(DATA.source, {"11": 0, "12": 1, "13": 2, "14": 3}, DATA.decoy_partitions, DATA.app_dir)
    report = audit_app_captures(tmp_path / "cap", tmp_path / "out", SPEC, BUDGET, data=data)
    rows = {r["update"]: r for r in report["updates"]}
    assert len(rows) == 4
    for node, partition in ((11, 0), (12, 1), (13, 2), (14, 3)):
        row = rows[f"run 5 round 1 node {node}"]
        _, labels = load_data(partition, partition + 1, 7)
        assert row["labels"] == {int(c): int(n) for c, n in zip(*np.unique(labels, return_counts=True), strict=True)}
        assert row["label-accuracy"] == 1.0 and row["batch"] == partition + 1 and row["steps"] == 1
        assert row["sent"].startswith("weights")
        assert "lr 0.05 (ConfigRecord)" in row["recipe"] and "batch-size 4 (run config)" in row["recipe"]
        assert {"momentum 0 (assumed plain SGD)", "weight decay 0 (assumed)"} <= set(row["assumptions"])
        assert row["reid-gallery"] > 30 and row["psnr"] is not None
        assert row["attacks"]["APRIL-E (naive)"].startswith("not applicable: no patch embedding")
        assert row["attacks"]["known-plaintext"].startswith("not applicable: this capture is another app")
    # exact counts clear the prior exactly where the update holds enough images for their interval to clear it
    cleared = [u["update"] for u in report["updates"] if u["leakage"]["labels"]["clears"]]
    assert cleared == [u["update"] for u in report["updates"]
                       if u["examples"] >= u["leakage"]["labels"]["images-needed"]], report["updates"]
    assert cleared and report["verdict-detail"].startswith(f"LEAKS: labels beyond the null in {len(cleared)} of 4")
    assert "4 of 4 exactly right" in report["verdict-detail"]
    assert all(u["leakage"]["labels"]["null-error"] > 0.5 for u in report["updates"])  # the prior: 1-4 images
    assert (tmp_path / "out" / "grid.png").stat().st_size > 0
    assert "Verdict" in (tmp_path / "out" / "audit.md").read_text()
    assert json.loads((tmp_path / "out" / "audit.json").read_text())["updates"][0]["update"].startswith("run 5")


def without_timings(value):
    """``value`` (audit.json's content) without the seconds each stage took: the one field a rerun may change."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k != "seconds" and not k.endswith("-seconds")}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def test_two_audits_of_one_capture_give_identical_figures(tmp_path):
    """The audit is seeded throughout: the label search, the shadows, the power twin, the nulls and the inversions
    give the same audit.json twice (the timings aside); the update simulated over two steps, so the searches run."""
    capture_exchange(tmp_path / "cap", 15, 3, 1, batch=2)
    data = UserData(DATA.source, {"15": 3}, DATA.decoy_partitions, DATA.app_dir)
    for out in ("first", "second"):
        audit_app_captures(tmp_path / "cap", tmp_path / out, SPEC, BUDGET, data=data, measures=SHADOWS)
    first, second = (json.loads((tmp_path / out / "audit.json").read_text()) for out in ("first", "second"))
    assert first["updates"][0]["steps"] == 2 and first["updates"][0]["recipe-fit"] is not None
    assert without_timings(first) == without_timings(second)


def test_membership_of_a_multi_step_update_against_shadow_updates(tmp_path):
    """--membership-references: the label estimate's simulation makes the shadows, on half the non-members, and every
    score of the family is taken on the other half; each update states its power (a simulated update like it with
    known members); a node's two rounds are combined. One local step has nothing to simulate and says so."""
    for server_round in (1, 2):
        capture_exchange(tmp_path / "cap", 15, 3, server_round, batch=2)  # 4 images, batch 2: two local steps
    data = UserData(DATA.source, {"15": 3}, DATA.decoy_partitions, DATA.app_dir)
    report = audit_app_captures(tmp_path / "cap", tmp_path / "out", SPEC, BUDGET, data=data, measures=SHADOWS)
    row = report["updates"][0]
    member = row["leakage"]["membership"]
    assert row["steps"] == 2 and member["status"] == "measured"
    # one recipe: the momentum the label estimate found is the update's, in its recipe line, not among its assumptions
    (estimated,) = [part for part in row["recipe"].split("; ") if part.startswith("momentum ")]
    momentum = estimated.split()[1]
    assert estimated == f"momentum {momentum} (inferred from the update)"
    (optimiser,) = [part for part in row["recipe"].split("; ") if part.startswith("optimiser ")]
    assert optimiser.startswith("optimiser sgd (inferred from the update: after the passes, SGD β 0: norm ×")
    assert f"SGD β {momentum} inferred from the update" in row["attacks"]["labels (head-bias gradient)"]
    assert row["recipe-fit"]["fits"] and row["recipe-fit"]["recipe"] == f"SGD β {momentum}", row["recipe-fit"]
    assert (
        not [a for a in row["assumptions"] if a.startswith("momentum")]
        and "weight decay 0 (assumed)" in (row["assumptions"])
    )
    assert row["attacks"]["membership: shadow alignment"].startswith(
        "applied: the update beyond 3 shadow updates, against each image's gradient"
    )
    assert set(member["scores"]) == {"loss of the sent weights", "loss of the sent weights, per class", "loss drop",
                                     "shadow alignment"}  # fmt: skip
    assert member["auc"] == max(s["auc"] for s in member["scores"].values() if s["clears-null"] == member["clears"])
    assert member["members"] == 4 and member["non-member-source"].startswith("the other half of")
    power = member["power"]
    assert power["status"] == "measured" and 1 <= power["simulated"]["members"] <= 4, power
    assert isinstance(power["could-have-seen"], bool) and power["observed-auc"] <= member["auc"] + 1e-12
    text = (tmp_path / "out" / "audit.md").read_text()
    assert "power of the loss scores: an update like this one, simulated with" in text
    assert "### Membership per client" in text
    (client,) = report["clients"]
    assert client["client"] == "partition 3" and len(client["updates"]) == 2
    combined = client["membership"]
    assert combined["status"] == "measured" and combined["reference"].endswith("over 2 update(s)"), combined
    assert "membership over each client's updates" in report["verdict-detail"]

    capture_exchange(tmp_path / "one", 14, 3)  # batch 4: one local step, nothing to simulate
    data = UserData(DATA.source, {"14": 3}, DATA.decoy_partitions, DATA.app_dir)
    (row,) = audit_app_captures(tmp_path / "one", tmp_path / "out1", SPEC, BUDGET, data=data, measures=SHADOWS)[
        "updates"]  # fmt: skip
    assert row["attacks"]["membership: shadow alignment"].startswith("not applicable: shadow updates need a multi")
    assert row["leakage"]["membership"]["power"]["status"] == "not measured"


def test_the_python_api_takes_plain_types_returns_a_typed_result_and_prints_nothing(tmp_path, capsys):
    """``fedvit.audit_captures("dir", out="dir", model=..., data=..., **budget)``: str paths, the model as the class
    itself, the budget as keywords; a typed result; nothing on stdout. The report opens with the short verdict and the
    per-client table, and its HTML page (three pictures inline) opens in Chromium without console messages."""
    import fedvit
    from fedvit.audit.summary import ClientFinding, Finding

    for server_round in (1, 2):
        capture_exchange(tmp_path / "cap", 15, 3, server_round, batch=2)
    capture_exchange(tmp_path / "cap", 16, 1)
    capsys.readouterr()
    result = fedvit.audit_captures(
        str(tmp_path / "cap"), out=str(tmp_path / "out"), model=Net, app_dir=str(APP),
        data="cnnapp_partitions:partition", partitions={15: 3, 16: 1}, decoy_partitions="4-39", membership_references=3,
        iterations=40,
        restarts=1, max_seconds=30,
    )  # fmt: skip
    assert capsys.readouterr().out == ""
    assert isinstance(result, fedvit.AuditResult) and isinstance(result.verdict, str)
    # 2 and 4 images, each count exact: neither alone can clear its prior (their intervals reach it), the two
    # together do; partition 3's two rounds train on the same 4 images, so they are not pooled as 8
    assert result.verdict.startswith("No client's own figure clears its null; Together: labels of the 2 clients"), (
        result.verdict)  # fmt: skip
    assert [c.client for c in result.clients] == ["partition 1", "partition 3"]  # in partition order
    assert all(isinstance(c, ClientFinding) and isinstance(c.labels, Finding) for c in result.clients)
    one, three = result.clients
    assert three.updates == ("run 5 round 1 node 15", "run 5 round 2 node 15") and one.updates == (
        "run 5 round 1 node 16",)  # fmt: skip
    assert {c.labels.word for c in result.clients} == {"not resolvable"}, result.clients
    assert all("error 0.0%" in c.labels.figure and "exact counts need ≥ " in c.labels.figure for c in result.clients)
    assert three.membership.word in ("leaks", "no evidence", "could not have seen", "not resolvable")
    assert one.dp_claim.word == "not measured" and one.dp_claim.why
    assert {"json", "markdown", "html", "membership-roc", "labels", "grid"} <= set(result.paths)
    assert json.loads(result.paths["json"].read_text())["verdict"] == result.verdict
    report = check_markdown(tmp_path / "out")
    assert report["findings"][1]["membership"]["word"] == three.membership.word
    for update in report["updates"]:  # measured membership: its figures, null and operating points as typed
        member = update["leakage"]["membership"]
        assert member["status"] == "measured" and tuple(member) == json_keys(MembershipEvidence), member
        assert tuple(member["null"]) == json_keys(RocFigures) and set(member["operating-points"]) == {
            "0.001", "0.01", "resolution"}  # fmt: skip
    check_html(tmp_path / "out", pictures=3)

    with pytest.raises(TypeError, match="cannot be named as module:name"):
        fedvit.audit_captures(tmp_path / "cap", out=tmp_path / "x", model=lambda: Net())
    with pytest.raises(ValueError, match="budget: .*audit.iterations"):
        fedvit.audit_captures(tmp_path / "cap", out=tmp_path / "x", model=Net, iterations=0)
    with pytest.raises(ValueError, match="partitions .* give data"):
        fedvit.audit_captures(tmp_path / "cap", out=tmp_path / "x", model=Net, partitions={15: 3})


def test_the_api_pages_example_runs(tmp_path, monkeypatch):
    """docs/reference/api.md's example, run as written from a copy of the test app's folder with captures in it."""
    text = (Path(__file__).parents[1] / "docs" / "reference" / "api.md").read_text()
    section = text[text.index("## Audit from Python") :]
    example = section[section.index("```python\n") + 10 : section.index("\n```", section.index("```python"))]
    app = tmp_path / "app"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__"))
    for node, partition in ((11, 0), (12, 1)):
        capture_exchange(app / "captures", node, partition, recorded_partition=True)
    monkeypatch.chdir(app)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(example, "api.md", "exec"), {})
    lines = printed.getvalue().splitlines()
    # 1 and 2 images, each count exact: neither client alone can clear the prior, the two together do
    assert lines[0].startswith("No client's own figure clears its null; Together: labels of the 2 clients"), lines
    assert any(line.startswith("partition 0 labels: not resolvable | membership:") for line in lines), lines
    assert lines[-1] == "report: audit/audit.html" and (app / "audit" / "audit.html").is_file()


def test_without_data_the_report_is_unscored_and_a_gradient_is_recognised(tmp_path):
    capture_exchange(tmp_path / "cap", 21, 2, fedsgd=True)
    report = audit_app_captures(tmp_path / "cap", tmp_path / "out", SPEC, BUDGET)
    (row,) = report["updates"]
    _, labels = load_data(2, 3, 7)
    assert row["sent"].startswith("gradient") and row["batch"] == 3
    assert sum(row["labels"].values()) == 3 and row["labels"] == {
        int(c): int(n) for c, n in zip(*np.unique(labels, return_counts=True), strict=True)
    }
    assert row["psnr"] is None and "images not measured" in report["verdict-detail"]
    # nothing checked
    assert report["verdict-detail"].startswith("unverified: labels estimated for 1 update(s), unverified")
    assert "unscored" in (tmp_path / "out" / "audit.md").read_text()


def test_recipe_overrides_are_used_and_stated(tmp_path):
    capture_exchange(tmp_path / "cap", 31, 1)
    budget = AuditConfig(iterations=2, restarts=1)
    report = audit_app_captures(tmp_path / "cap", tmp_path / "out", SPEC, budget, overrides={"batch-size": "1"})
    (row,) = report["updates"]
    assert row["batch"] == 1 and row["steps"] == 2 and "batch-size 1 (override)" in row["recipe"]


def test_arrays_map_by_name_or_order_and_mismatches_are_listed():
    model = Net()
    state = {n: t.numpy() for n, t in model.state_dict().items()}
    assert map_state(state, model, "x").keys() == state.keys()
    by_order = map_state({str(i): a for i, a in enumerate(state.values())}, model, "x")
    assert list(by_order) == list(state)
    wrapped = {f"_module.{n}": a for n, a in state.items()}  # an Opacus GradSampleModule's state_dict
    assert map_state(wrapped, model, "x").keys() == state.keys()
    renamed = {("features." + n if n.startswith("conv") else n): a for n, a in state.items()}
    with pytest.raises(AuditInputError, match=r"missing \['conv1.weight'.*unexpected \['features.conv1.weight'"):
        map_state(renamed, model, "x")
    wrong = dict(state, **{"fc3.bias": np.zeros(7, np.float32)})
    with pytest.raises(AuditInputError, match=r"fc3.bias: captured \(7,\), model \(10,\)"):
        map_state(wrong, model, "x")


def test_sent_kind_tells_weights_from_gradients():
    w = {"a": np.ones(100, np.float32)}
    assert sent_kind(w, {"a": w["a"] - 0.01}, ["a"])[0] == "weights"
    assert sent_kind(w, {"a": np.full(100, 0.01, np.float32)}, ["a"])[0] == "gradient"
    # weights after long training at a large lr: far from what was received (distance 7.6) yet their norm grew
    grown = {"a": np.random.default_rng(0).normal(0, 8.0, 100).astype(np.float32)}
    assert sent_kind(w, grown, ["a"])[0] == "weights"
    kind, evidence = sent_kind(w, {"a": np.full(100, 0.3, np.float32)}, ["a"])
    assert kind == "ambiguous" and "median ‖sent‖/‖received‖ 0.3, 0 of 1 layers agree" == evidence


def test_a_tls_only_capture_says_the_wire_shows_nothing(tmp_path):
    """The threat model is the wire tap's on TLS (metadata only, what the server side would need), and the links are
    counted as tap.json counts them: those still open when the tap stopped never reach connections.jsonl."""
    (tmp_path / "cap").mkdir()
    (tmp_path / "cap" / "connections.jsonl").write_text(json.dumps({"protocol": "tls", "readable": False}) + "\n")
    report = audit_app_captures(tmp_path / "cap", tmp_path / "out", SPEC, BUDGET)
    assert report["verdict"] == NOTHING_ON_THE_WIRE and report["rows"] == [] and report["updates"] == []
    assert report["threat-model"].startswith("passive eavesdropper on the wire, every link TLS: connection metadata")
    assert "CapturingStrategy" in report["threat-model"] and "parameter-aware" not in report["threat-model"]
    assert "(1 TLS or HTTP/2 link(s) in tap.json)" in report["threat-model"]
    assert report["model"] == "— (no update was readable: nothing attacked)"
    summary = {"connections": {"http": 0, "tls": 4, "http2": 0}}
    (tmp_path / "cap" / "tap.json").write_text(json.dumps(summary))
    report = audit_app_captures(tmp_path / "cap", tmp_path / "out", SPEC, BUDGET)
    assert "(4 TLS or HTTP/2 link(s) in tap.json)" in report["threat-model"]
    assert any(note.startswith("4 link(s) were TLS or HTTP/2") for note in report["notes"])
    with pytest.raises(AuditInputError, match="no captured train exchanges"):
        audit_app_captures(tmp_path / "out", tmp_path / "out2", SPEC, BUDGET)


def test_model_spec_from_toml_and_clear_errors(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "fedvit-audit.toml").write_text(
        '[model]\nfactory = "cnnapp.task:Net"\ninput = [3, 32, 32]\nmean = 0.5\napp-dir = "app"\n'
    )
    found = find_spec_file(tmp_path / "run")
    values = read_spec_file(found)["model"]
    spec = spec_from(values)
    assert spec.app_dir == str((tmp_path / "app").resolve()) and spec.mean == (0.5, 0.5, 0.5)
    assert isinstance(ModelSpec("cnnapp.task:Net", app_dir=str(APP)).build(), Net)
    assert ModelSpec("resnet18").build(num_classes=10).fc.out_features == 10
    with pytest.raises(SpecError, match="loss 'mse' is not supported"):
        ModelSpec("x:y", loss="mse")
    with pytest.raises(SpecError, match="cannot import 'nowhere_pkg.mod'.*--app-dir"):
        ModelSpec("nowhere_pkg.mod:Net").build()
    with pytest.raises(SpecError, match="neither package.module:callable nor a timm model name"):
        ModelSpec("not-a-model").build()
    with pytest.raises(SpecError, match="mean and std need 1 values"):
        spec_from({"factory": "a:b", "input": [1, 28, 28], "mean": [0.5, 0.5, 0.5]})


class HuggingFaceStyle(torch.nn.Module):
    """A model whose forward returns an output object with ``.logits`` (as Hugging Face's classifiers do)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Net()

    def forward(self, x: torch.Tensor):
        return type("Output", (), {"logits": self.net(x)})()


def test_a_model_that_returns_an_output_object_is_attacked_through_its_logits():
    from fedvit.attacks.inversion import invert
    from fedvit.attacks.labels import mean_softmax
    from fedvit.observed.observation import Observation, attack_model
    from fedvit.observed.recipe import ClientRecipe

    model = HuggingFaceStyle()
    spec = ModelSpec("x:y", builder=HuggingFaceStyle)
    state = {n: t.numpy() for n, t in model.state_dict().items()}
    obs = Observation(
        update={n: np.ones(p.shape, np.float32) for n, p in model.named_parameters()},
        received=state,
        num_classes=10,
        spec=spec,
        skeleton=spec.build(),
        client=ClientRecipe(2, 2, 1, 0.0, 0.0, 0.0, 0, True),
        head_bias="net.fc3.bias",
        start_seed=1,
    )
    probs = mean_softmax(attack_model(obs), spec.input_shape)
    assert probs.shape == (10,) and abs(probs.sum() - 1) < 1e-6
    out = invert(obs, AuditConfig(iterations=2, restarts=2), device="cpu")
    assert len(out.images) == 2 and out.steps == 4  # the batched (vmap) path ran through the hook


def test_the_cli_reads_fedvit_audit_toml_beside_the_captures_and_flags_win(tmp_path, capsys):
    from fedvit.app.cli import main

    capture_exchange(tmp_path / "cap", 41, 2)
    (tmp_path / "cap" / "fedvit-audit.toml").write_text(
        f'[model]\nfactory = "cnnapp.task:Net"\napp-dir = "{APP}"\n'
        "[recipe]\nbatch-size = 1\n"
        '[data]\nloader = "cnnapp_partitions:partition"\npartitions = {"41" = 2}\ndecoy-partitions = "4-20"\n'
    )
    out = tmp_path / "out"
    assert main(["audit", str(tmp_path / "cap"), "--out", str(out), "--iterations", "2", "--restarts", "1",
                 "--recipe", "batch-size=3"]) == 0  # fmt: skip
    report = json.loads((out / "audit.json").read_text())
    (row,) = report["updates"]
    assert row["partition"] == 2 and "batch-size 3 (override)" in row["recipe"] and row["reid-gallery"] > 15
    why = "breaching's recipe, which led on a CNN and a ResNet-18; not a ViT; --tv sets the weight"
    budget = " ".join(report["budget"])
    assert f"TV 0.4 ({why}), Gaussian start on the normalised scale, keeps the lowest total objective" in budget
    assert main(["audit", str(tmp_path / "cap"), "--out", str(out), "--iterations", "1", "--tv", "0.1"]) == 0
    assert ", TV 0.1 (--tv), Gaussian start" in json.loads((out / "audit.json").read_text())["budget"][0]
    capsys.readouterr()
    (tmp_path / "cap" / "fedvit-audit.toml").unlink()
    assert main(["audit", str(tmp_path / "cap"), "--out", str(out), "--model", "nowhere.mod:Net"]) == 2
    assert "cannot import 'nowhere.mod'" in capsys.readouterr().err
    assert main(["audit", str(tmp_path / "cap"), "--out", str(out), "--model", "cnnapp.task:Net",
                 "--partition", "41=2"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "partitions (--partition): these describe the clients' data: give data (--data) as well" in err


def test_a_dataset_name_scores_against_fedvits_partition_and_its_test_split(tmp_path, capsys):
    """``--data synthetic``: the partition is fedvit's (as its own app splits the data, node config's
    num-partitions from the capture), decoys the test split; bad settings and a missing count are refused."""
    from fedvit.app.cli import main
    from fedvit.core.config import parse_config
    from fedvit.core.data import client_data

    settings = {"synthetic-train-size": 40}
    config = parse_config({"data.name": "synthetic", "data.synthetic-train-size": 40})
    part = client_data(config.data, config.seed, 2, 10)
    x, y = part.images.batch(part.train, 32)
    model = Net()
    torch.nn.functional.cross_entropy(model((x - 0.5) / 0.5), y).backward()
    instruction = Message(RecordDict({"arrays": ArrayRecord(model.state_dict())}), dst_node_id=51, message_type="train")
    grads = ArrayRecord({n: p.grad for n, p in model.named_parameters()})
    reply = Message(
        RecordDict({"arrays": grads, "metrics": MetricRecord({"num-examples": len(y)})}), reply_to=instruction
    )
    for node, node_config in ((51, {"partition-id": 2, "num-partitions": 10}), (52, {})):
        stem = capture_stem(tmp_path / "cap" / str(node), 6, 1, node, "train")
        head = {"run-id": 6, "round": 1, "node": node, "partition": 2, "node-config": node_config, "run_config": {}}
        add_direction(stem, "received", instruction, **head)
        add_direction(stem, "sent", reply, **head)

    data = UserData("synthetic", {}, settings=settings, image_size=32)
    assert np.array_equal(data.load(2, 10)[0], x.numpy())  # exactly the images the client trained on
    report = audit_app_captures(tmp_path / "cap" / "51", tmp_path / "out", SPEC, BUDGET, data=data)
    (row,) = report["updates"]
    assert row["partition"] == 2 and row["reid-gallery"] == 100 and row["psnr"] is not None
    assert row["label-accuracy"] == 1.0 and not report["notes"]
    with pytest.raises(AuditInputError, match="give --num-partitions"):
        audit_app_captures(tmp_path / "cap" / "52", tmp_path / "out", SPEC, BUDGET, data=UserData("synthetic", {}))
    base = ["audit", str(tmp_path / "cap" / "52"), "--out", str(tmp_path / "out"), "--model", "cnnapp.task:Net",
            "--app-dir", str(APP), "--iterations", "2", "--restarts", "1", "--data", "synthetic"]  # fmt: skip
    assert main([*base, "--data-option", "partitioner=nope"]) == 2
    assert "data.partitioner" in capsys.readouterr().err
    assert main([*base, "--num-partitions", "10", "--data-option", "synthetic-train-size=40"]) == 0
    (row,) = json.loads((tmp_path / "out" / "audit.json").read_text())["updates"]
    assert row["partition"] == 2 and row["reid-gallery"] == 100
    assert main([*base[:-1], "cnnapp_partitions:partition", "--data-option", "seed=1"]) == 2
    assert "apply to a dataset name" in capsys.readouterr().err


def test_april_runs_on_a_users_vit_and_is_refused_for_a_model_without_its_embeddings(tmp_path):
    """A timm ViT given by name: APRIL-E's closed form recovers one image from its gradient (exact here: N = 4
    patches ≤ D − 1), and the registry says why it does not apply to the test app's CNN."""
    from fedvit.attacks import april
    from fedvit.audit.metrics import psnr
    from fedvit.audit.registry import applicable
    from fedvit.core.model import normalize
    from fedvit.observed.observation import Observation
    from fedvit.observed.recipe import ClientRecipe

    spec = ModelSpec("vit_tiny_patch16_224", input_shape=(3, 32, 32), num_classes=10)
    torch.manual_seed(0)
    model = spec.build()
    images, labels = load_data(3, 1, 7)
    x = torch.as_tensor(images)
    torch.nn.functional.cross_entropy(model(normalize(model, x)), torch.as_tensor(labels)).backward()
    gradient = {n: 0.05 * p.grad.numpy() for n, p in model.named_parameters()}  # a one-step weight change
    state = {n: t.detach().numpy() for n, t in model.state_dict().items()}

    def observed(net, spec_, update) -> Observation:
        return Observation(update=update, received=state if net is model else {}, num_classes=10,
                           spec=spec_, skeleton=net, client=ClientRecipe(1, 1, 1, 0.0, 0.0, 0.0, 0, True))  # fmt: skip

    vit = observed(model, spec, gradient)
    chosen, _ = applicable(vit)
    assert "APRIL-E (naive)" in [a.name for a in chosen]
    rec = april.embedding_route(vit)
    assert psnr(rec.image, images[0]) > 40 and "rank G_p = 4 of N = 4" in rec.note
    assert model_settings(model)[0] == {"tv": 0.05, "init": "noise", "keep": "match"}  # the settings by model family
    assert model_settings(Net())[0] == {"tv": 0.4, "init": "gaussian", "keep": "objective"}
    cnn = Net()
    _, refused = applicable(observed(cnn, SPEC, {n: p.detach().numpy() for n, p in cnn.named_parameters()}))
    assert refused["APRIL-E (naive)"].startswith("no patch embedding")


def test_a_fedvit_run_and_another_apps_capture_share_one_report_schema(tmp_path):
    """One pipeline: a fedvit run captured with capture.enabled and the test app's capture give audit.json files
    with the same top-level keys; another app's capture without --model fails in one line saying what to give."""
    from fedvit.app.cli import main
    from fedvit.audit.entries import RecipeFitted, UpdateAudit
    from fedvit.audit.evidence import ImageEvidence, LabelEvidence
    from fedvit.audit.report import TOP_LEVEL_KEYS, AuditReport
    from fedvit.audit.summary import ClientFinding, Finding
    from fedvit.core.config import Config
    from tests.helpers import run_in_process

    run = Config().to_dict() | {"num-server-rounds": 1, "batch-size": 1, "centralized-evaluation": False,
                                "capture.enabled": True, "out-dir": str(tmp_path), "run-name": "r"}  # fmt: skip
    run_dir, _ = run_in_process(run, num_nodes=2)
    budget = ["--iterations", "2", "--restarts", "1"]
    assert main(["audit", str(run_dir), "--out", str(tmp_path / "fedvit"), *budget]) == 0
    capture_exchange(tmp_path / "cap", 11, 0)
    assert main(["audit", str(tmp_path / "cap"), "--out", str(tmp_path / "app"), "--model", "cnnapp.task:Net",
                 "--app-dir", str(APP), *budget]) == 0  # fmt: skip
    fedvit, app = (json.loads((tmp_path / d / "audit.json").read_text()) for d in ("fedvit", "app"))
    assert tuple(fedvit) == tuple(app) == TOP_LEVEL_KEYS == json_keys(AuditReport)
    assert len(fedvit["updates"]) == 2 and len(app["updates"]) == 1
    # below the top: every object of the report has the keys its type defines, in both reports
    for report in (fedvit, app):
        for finding in report["findings"]:
            assert tuple(finding) == json_keys(ClientFinding)
            assert all(tuple(finding[k]) == json_keys(Finding) for k in ("labels", "membership", "images", "dp-claim"))
        for update in report["updates"]:
            assert tuple(update) == json_keys(UpdateAudit), set(update) ^ set(json_keys(UpdateAudit))
            kinds = {"labels": LabelEvidence, "membership": MembershipEvidence, "images": ImageEvidence}
            assert {k: tuple(e) for k, e in update["leakage"].items()} == {k: json_keys(t) for k, t in kinds.items()}
            member = update["leakage"]["membership"]
            assert member["null"] is None or tuple(member["null"]) == json_keys(RocFigures), member
            assert update["recipe-fit"] is None or tuple(update["recipe-fit"]) == json_keys(RecipeFitted)
    with pytest.raises(AuditInputError, match="not from fedvit's app: give its model with --model"):
        run_audit(tmp_path / "cap", tmp_path / "x")


def test_image_inversion_is_not_attempted_beyond_what_it_can_recover():
    """An update of 1,864 images over 466 local steps (a Flower example's round) gets no optimisation run that would
    spend its budget on a few steps: the registry says why, and label recovery still applies."""
    from fedvit.audit.registry import MAX_IMAGES, OPTIMISATION, applicable, labels_apply
    from fedvit.observed.observation import Observation
    from fedvit.observed.recipe import ClientRecipe

    model = Net()
    state = {n: t.numpy() for n, t in model.state_dict().items()}

    def update_of(examples: int, batch: int) -> Observation:
        client = ClientRecipe(examples, batch, 1, 0.1, 0.0, 0.0, 0, False)
        return Observation(update=state, received=state, num_classes=10, spec=SPEC, skeleton=model,
                           client=client, head_bias="fc3.bias")  # fmt: skip

    chosen, refused = applicable(update_of(1864, 4))
    assert OPTIMISATION not in [a.name for a in chosen]
    assert refused[OPTIMISATION].startswith("not attempted: 1864 images over 466 local step(s)")
    assert labels_apply(update_of(1864, 4)) is None
    assert OPTIMISATION in [a.name for a in applicable(update_of(MAX_IMAGES, 4))[0]]


def test_image_references_are_listed_beside_an_image_attack_and_not_computed_without_one(tmp_path, monkeypatch):
    """The no-information references (the best flat image; APRIL's minimum-norm limit) are the null of an image
    attack's figures: listed where an image attack ran, not computed where none did (an update of more images than
    inversion is attempted on: here the limit lowered to 2)."""
    from fedvit.audit import registry

    capture_exchange(tmp_path / "cap", 15, 3)
    data = UserData(DATA.source, {"15": 3}, DATA.decoy_partitions, DATA.app_dir)
    ran = audit_app_captures(tmp_path / "cap", tmp_path / "ran", SPEC, BUDGET, data=data)
    assert ran["updates"][0]["leakage"]["images"]["status"] == "measured"
    assert [r for r in ran["rows"] if "reference" in r["attack"]], ran["rows"]
    monkeypatch.setattr(registry, "MAX_IMAGES", 2)
    skipped = audit_app_captures(tmp_path / "cap", tmp_path / "none", SPEC, BUDGET, data=data)
    assert skipped["updates"][0]["leakage"]["images"]["status"] == "not measured"
    assert not [r for r in skipped["rows"] if "reference" in r["attack"]], skipped["rows"]


def test_a_reply_that_reads_neither_as_weights_nor_as_a_gradient_asks_for_sent(tmp_path):
    model = Net()
    instruction = Message(RecordDict({"arrays": ArrayRecord(model.state_dict())}), dst_node_id=61, message_type="train")
    scaled = ArrayRecord({n: 0.3 * t for n, t in model.state_dict().items()})
    reply = Message(RecordDict({"arrays": scaled, "metrics": MetricRecord({"num-examples": 2})}), reply_to=instruction)
    stem = capture_stem(tmp_path / "cap", 7, 1, 61, "train")
    head = {"run-id": 7, "round": 1, "node": 61, "run_config": {}}
    add_direction(stem, "received", instruction, **head)
    add_direction(stem, "sent", reply, **head)
    with pytest.raises(AuditInputError, match=r"neither as weights nor as a gradient .*give --sent weights"):
        audit_app_captures(tmp_path / "cap", tmp_path / "out", SPEC, BUDGET)
    report = audit_app_captures(tmp_path / "cap", tmp_path / "out", SPEC, AuditConfig(iterations=1, restarts=1),
                                sent_as="weights")  # fmt: skip
    assert (
        report["updates"][0]["sent"].startswith("weights (median ‖sent‖/‖received‖ 0.3")
        and "as told" in (report["updates"][0]["sent"])
    )


def test_a_measure_added_to_the_registry_reaches_the_report(tmp_path, monkeypatch):
    """The registry is the one way in: an entry (applicability, run) appears in the update's "attacks" line, its rows
    in the report's rows, its evidence under its leakage type, and one that does not apply says why."""
    from fedvit.audit import registry
    from fedvit.observed.observation import recipe

    def run(obs, held):
        row = held.head | {"attack": "probe", "budget": None, "psnr": None, "ssim": None, "seconds": 0.0,
                           "note": f"{recipe(obs).steps} step(s)"}  # fmt: skip
        return registry.Outcome([row], "applied: probe")

    probe = registry.Measure("probe", "images", lambda obs, held: None, run)
    refusing = registry.Measure("refusing probe", "images", lambda obs, held: "never applies", run)
    monkeypatch.setattr(registry, "MEASURES", (*registry.MEASURES, probe, refusing))
    capture_exchange(tmp_path / "cap", 11, 1)
    data = UserData(DATA.source, {"11": 1}, DATA.decoy_partitions, DATA.app_dir)
    report = audit_app_captures(tmp_path / "cap", tmp_path / "out", SPEC, BUDGET, data=data)
    (update,) = report["updates"]
    assert update["attacks"]["probe"] == "applied: probe"
    assert update["attacks"]["refusing probe"] == "not applicable: never applies"
    assert list(update["attacks"]).index("probe") < list(update["attacks"]).index("refusing probe")
    assert [r["note"] for r in report["rows"] if r["attack"] == "probe"] == ["1 step(s)"]
    assert update["leakage"]["labels"]["status"] == "measured"  # the entries before it unchanged
    assert "probe" in (tmp_path / "out" / "audit.md").read_text()


def test_every_usual_loader_form_becomes_the_contiguous_float_form_or_one_clear_refusal():
    """The user-data boundary: permuted torch tensors, NumPy transposes, uint8 [N, H, W, C], labels as a list or a
    tensor all give the same contiguous float64 [N, C, H, W]; anything else is one line naming what came back."""
    from fedvit.audit.user_data import normalized

    images, labels = load_data(3, 4, 7)  # float [N, C, H, W] in [0, 1], contiguous
    hwc8 = np.ascontiguousarray(np.round(images.transpose(0, 2, 3, 1) * 255).astype(np.uint8))  # as decoded
    want = hwc8.transpose(0, 3, 1, 2) / 255.0
    forms = {
        "torch permuted": (torch.from_numpy(hwc8).permute(0, 3, 1, 2).float() / 255, torch.as_tensor(labels)),
        "numpy transpose": (np.stack(list(hwc8)).transpose(0, 3, 1, 2) / 255.0, list(labels)),
        "uint8 NHWC": (hwc8, labels.astype(np.int32)),
        "uint8 NCHW tensor": (torch.from_numpy(hwc8).permute(0, 3, 1, 2), labels.tolist()),
    }
    assert not forms["torch permuted"][0].is_contiguous()  # channels-last strides, as a permuted loader has them
    for name, (x, y) in forms.items():
        got, got_labels = normalized(x, y, name)
        assert got.flags["C_CONTIGUOUS"] and got.dtype == np.float64 and got.shape == images.shape, name
        np.testing.assert_allclose(got, want, atol=1e-6, err_msg=name)
        assert got_labels.dtype == np.int64 and got_labels.tolist() == labels.tolist(), name
    refusals = {
        "normalised": ((images - 0.5) / 0.5, labels, "normalised?"),
        "0-255 floats": (images * 255, labels, "divide by 255"),
        "3-d": (images[0], labels, "[3, 32, 32]"),
        "few labels": (images, labels[:2], "labels numpy.ndarray"),
        "float labels": (images, labels.astype(np.float32), "float32 labels"),
    }
    for x, y, needle in refusals.values():
        with pytest.raises(AuditInputError) as err:
            normalized(x, y, "--data m:f(3)")
        message = str(err.value)
        assert "\n" not in message and needle in message and "--data m:f(3) returned images" in message, message


class ViewNet(Net):
    """The quickstart CNN as Flower's example writes it: ``x.view(-1, 16 * 5 * 5)``, which refuses other strides."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def permuted_loader(partition: int):
    """A loader written the usual way: HWC uint8 images, permuted (channels-last strides) and scaled."""
    images, labels = load_data(partition, partition_size("1,2,3,4", partition), 7)
    hwc = np.ascontiguousarray(np.round(images.transpose(0, 2, 3, 1) * 255).astype(np.uint8))  # as decoded
    return torch.from_numpy(hwc).permute(0, 3, 1, 2).float() / 255, torch.as_tensor(labels)


def contiguous_loader(partition: int):
    images, labels = permuted_loader(partition)
    return images.contiguous().numpy(), labels.numpy()


def test_a_permuted_loader_audits_a_view_model_as_the_contiguous_one_does(tmp_path):
    for node, partition in ((11, 2), (12, 3)):
        capture_exchange(tmp_path / "cap", node, partition)
    assert not permuted_loader(2)[0].is_contiguous()
    spec = ModelSpec("tests.test_app_audit:ViewNet", app_dir=str(APP))
    reports = {}
    for name in ("permuted_loader", "contiguous_loader"):
        data = UserData(f"tests.test_app_audit:{name}", {"11": 2, "12": 3}, (0, 1), str(APP))
        reports[name] = audit_app_captures(tmp_path / "cap", tmp_path / name, spec, BUDGET, data=data)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(reports["permuted_loader"]["rows"]) == strip(reports["contiguous_loader"]["rows"])
    for permuted, contiguous in zip(*(r["updates"] for r in reports.values()), strict=True):
        for leakage in (permuted["leakage"], contiguous["leakage"]):
            leakage["membership"].pop("non-member-source")  # names the loader
        assert permuted["leakage"] == contiguous["leakage"] and permuted["labels"] == contiguous["labels"]


def get_model(num_classes: int, hidden: int = 84) -> torch.nn.Module:
    """A factory that needs arguments (``get_model(num_classes)``, as apps write them)."""
    model = Net()
    model.fc2, model.fc3 = torch.nn.Linear(120, hidden), torch.nn.Linear(hidden, num_classes)
    return model


def test_a_factory_with_arguments_is_built_from_the_command_line_or_the_toml(tmp_path, capsys):
    from fedvit.app.cli import main

    capture_exchange(tmp_path / "cap", 41, 2)
    base = ["audit", str(tmp_path / "cap"), "--out", str(tmp_path / "out"), "--iterations", "1", "--restarts", "1",
            "--app-dir", str(APP), "--model", "tests.test_app_audit:get_model"]  # fmt: skip
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "called with no arguments" in err and "num_classes" in err and "--model-arg KEY=VALUE" in err
    assert main([*base, "--model-arg", "num_classes=10", "--model-arg", "hidden=84"]) == 0
    report = json.loads((tmp_path / "out" / "audit.json").read_text())
    assert "tests.test_app_audit:get_model(hidden=84, num_classes=10) on 3×32×32" in report["model"]
    assert report["updates"][0]["sent"].startswith("weights")
    assert main([*base, "--model-arg", "num_classes=7"]) == 2  # the argument reaches the model: its head is 7 wide
    assert "fc3.weight: captured (10, 84), model (7, 84)" in (capsys.readouterr().err)
    assert main([*base, "--model-arg", "num_classes"]) == 2 and "--model-arg takes KEY=VALUE" in capsys.readouterr().err
    (tmp_path / "cap" / "fedvit-audit.toml").write_text("[model.args]\nnum_classes = 10\n")
    assert main(base) == 0


class HeadOnBackbone(torch.nn.Module):
    """The shape of Flower's ViT fine-tuning example: a public backbone (the test app's CNN layers, fixed by a seed in
    place of a pretrained download) and a classifier under ``heads.head``; the app federates ``model.heads`` only."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        torch.manual_seed(0)  # the public weights: every build the same
        net = Net()
        relu = torch.nn.ReLU()
        self.backbone = torch.nn.Sequential(
            net.conv1, relu, net.pool, net.conv2, relu, net.pool, torch.nn.Flatten(), net.fc1, relu, net.fc2, relu
        )
        self.heads = torch.nn.Sequential()
        self.heads.add_module("head", torch.nn.Linear(84, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads(self.backbone(x))


def capture_head_exchange(root: Path, node: int, partition: int, server_round: int, as_list: bool = False) -> None:
    """One train exchange of a head-only app: the server sends ``model.heads``' arrays (by name, or ``as_list``), the
    client trains the head on its frozen backbone (SGD, momentum 0.9, batch 2, 1 epoch) and replies with them."""
    model = HeadOnBackbone()
    torch.manual_seed(100 + server_round)
    model.heads.head.reset_parameters()
    model.backbone.requires_grad_(False)

    def arrays() -> ArrayRecord:
        state = model.heads.state_dict()
        return ArrayRecord([t.numpy() for t in state.values()]) if as_list else ArrayRecord(state)

    config = ConfigRecord({"lr": 0.05, "local-epochs": 1, "server-round": server_round})
    instruction = Message(RecordDict({"arrays": arrays(), "config": config}), dst_node_id=node, message_type="train")
    images, labels = load_data(partition, partition_size("1,2,3,4", partition), 7)
    train(model, images, labels, epochs=1, lr=0.05, batch_size=2, seed=server_round)
    metrics = MetricRecord({"num-examples": len(labels)})
    reply = Message(RecordDict({"arrays": arrays(), "metrics": metrics}), reply_to=instruction)
    stem = capture_stem(root, 6, server_round, node, "train")
    head = {"run-id": 6, "round": server_round, "node": node, "run_config": {"batch-size": 2, "seed": 7}}
    add_direction(stem, "received", instruction, **head)
    add_direction(stem, "sent", reply, **head)


def test_a_head_fine_tuned_on_a_frozen_backbone_is_audited_on_the_head(tmp_path, monkeypatch):
    """A capture of ``model.heads`` only maps onto that submodule (by name or as a list), the rest of the model is
    the --model weights; the simulations train the head alone (the backbone of a shadow stays as received), labels
    and membership are measured and image inversion says what it would need. The backbone's features are computed
    once and the head runs alone: the same figures as the whole model's."""

    from fedvit.audit import registry
    from fedvit.audit.pipeline import Reader
    from fedvit.capture.reader import load_exchanges

    spec = ModelSpec("tests.test_app_audit:HeadOnBackbone", app_dir=str(APP))
    for server_round in (1, 2):
        capture_head_exchange(tmp_path / "cap", 21, 3, server_round, as_list=server_round == 2)
    data = UserData(DATA.source, {"21": 3}, DATA.decoy_partitions, DATA.app_dir)
    report = audit_app_captures(tmp_path / "cap", tmp_path / "out", spec, BUDGET, data=data, measures=SHADOWS)
    assert len(report["updates"]) == 2
    for row in report["updates"]:
        assert "of heads only (2 of 10 parameter tensors)" in row["sent"], row["sent"]
        assert row["leakage"]["labels"]["status"] == "measured", row["leakage"]["labels"]
        assert row["leakage"]["membership"]["status"] == "measured", row["leakage"]["membership"]
        assert row["attacks"]["membership: shadow alignment"].startswith("applied: the update beyond 3 shadow")
        assert (
            "the update covers only 2 parameter tensor(s)"
            in row["attacks"]["gradient matching (optimisation, defence-aware)"]
        )
        # 90 auxiliary images of every class (no noise stand-ins needed) and 94 candidates
        assert row["frozen-features"].startswith("the frozen layers' outputs computed once for 90 auxiliary and 94")
    assert "frozen backbone: the frozen layers' outputs computed once" in (tmp_path / "out" / "audit.md").read_text()
    monkeypatch.setattr(registry, "on_features", lambda *args: "switched off")
    whole = audit_app_captures(tmp_path / "cap", tmp_path / "whole", spec, BUDGET, data=data, measures=SHADOWS)
    for cached, full in zip(report["updates"], whole["updates"], strict=True):
        assert full["frozen-features"] == "the whole model runs: switched off"
        assert cached["labels"] == full["labels"]
        figures = [{k: v["auc"] for k, v in u["leakage"]["membership"]["scores"].items()} for u in (cached, full)]
        assert figures[0] == pytest.approx(figures[1], abs=1e-9)
        power = [u["leakage"]["membership"]["power"]["simulated"]["auc"] for u in (cached, full)]
        assert power[0] == pytest.approx(power[1], abs=1e-9)

    exchanges, _ = load_exchanges(tmp_path / "cap")
    obs = Reader(AuditOptions(spec=spec, budget=BUDGET)).observe(exchanges[0])
    assert obs.trained == ("heads.head.weight", "heads.head.bias")
    images, labels = load_data(5, 20, 7)
    shadow = simulate(obs, Auxiliary(images, labels, "partition 5"), np.array([2, 2] + [0] * 8), 0.9, 0,
                      keep_weights=True)  # fmt: skip
    public = HeadOnBackbone().state_dict()
    for name, value in shadow.weights.items():
        if name.startswith("backbone."):
            np.testing.assert_array_equal(value, public[name].numpy(), err_msg=name)
    assert not np.array_equal(shadow.weights["heads.head.weight"], obs.received["heads.head.weight"])


class ScaledHead(HeadOnBackbone):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * super().forward(x)


def test_frozen_features_are_refused_where_the_backbone_is_not_deterministic_or_the_head_is_not_last():
    """BatchNorm, dropout or a layer after the head: the whole model runs, and the reason is said."""
    from fedvit.attacks.frozen_features import on_features
    from fedvit.attacks.holdings import Auxiliary

    images, labels = load_data(5, 8, 7)
    aux = Auxiliary(images, labels, "partition 5")

    def observed(model: torch.nn.Module) -> Observation:
        state = {k: v.numpy() for k, v in model.state_dict().items()}
        spec = ModelSpec("custom", builder=lambda: copy.deepcopy(model))
        client = ClientRecipe(8, 2, 1, 0.1, 0.0, 0.0, 0, False)
        return Observation(state, state, 10, spec=spec, skeleton=spec.build(), client=client,
                           trained=("heads.head.weight", "heads.head.bias"))  # fmt: skip

    plain = HeadOnBackbone()
    assert not isinstance(on_features(observed(plain), aux, None), str)
    normed = HeadOnBackbone()
    normed.backbone.insert(1, torch.nn.BatchNorm2d(6))
    assert on_features(observed(normed), aux, None) == (
        "the frozen backbone.1 is BatchNorm: its output depends on the batch"
    )
    dropped = HeadOnBackbone()
    dropped.backbone.append(torch.nn.Dropout(0.1))
    assert "drops activations at random" in on_features(observed(dropped), aux, None)
    assert "does more after heads.head than the head" in on_features(observed(ScaledHead()), aux, None)


def test_a_partial_capture_that_fits_several_parts_of_the_model_is_refused():
    from fedvit.observed.recipe import map_part

    model = HeadOnBackbone()
    fc = model.backbone[7].state_dict()  # weight and bias keys fit every Linear whose shapes agree: only fc1
    mapped, part = map_part({k: v.numpy() for k, v in fc.items()}, model, "capture")
    assert part == "backbone.7" and set(mapped) == {"backbone.7.weight", "backbone.7.bias"}
    twins = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with pytest.raises(AuditInputError, match=r"fit several parts of the model \(0, 1\)"):
        map_part({k: v.numpy() for k, v in twins[0].state_dict().items()}, twins, "capture")
    with pytest.raises(AuditInputError, match="match the model neither by name nor by order"):
        map_part({"x": np.zeros(3)}, model, "capture")


def capture_adam_exchange(root: Path, node: int, partition: int) -> None:
    """One train exchange of a client that trains with Adam (lr 0.01, batch 2, 1 epoch) and names its optimiser in
    the run config, as apps built on Flower's ViT example do."""
    torch.manual_seed(3)
    model = Net()
    config = ConfigRecord({"lr": 0.01, "local-epochs": 1, "server-round": 1})
    instruction = Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": config}),
                          dst_node_id=node, message_type="train")  # fmt: skip
    images, labels = load_data(partition, partition_size("1,2,3,4", partition), 7)
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = (torch.as_tensor(images) - 0.5) / 0.5, torch.as_tensor(labels)
    for first in range(0, len(y), 2):
        optimiser.zero_grad()
        torch.nn.functional.cross_entropy(model(x[first : first + 2]), y[first : first + 2]).backward()
        optimiser.step()
    metrics = MetricRecord({"num-examples": len(labels)})
    sent = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    reply = Message(sent, reply_to=instruction)
    stem = capture_stem(root, 8, 1, node, "train")
    head = {"run-id": 8, "round": 1, "node": node, "run_config": {"batch-size": 2, "optimizer": "Adam"}}
    add_direction(stem, "received", instruction, **head)
    add_direction(stem, "sent", reply, **head)


def test_an_optimiser_on_record_is_simulated_or_said_everywhere_it_matters(tmp_path, capsys):
    """A client that names Adam: the recipe states it (not assumed, no SGD momentum), the label counts say they are
    unverified (their relation is SGD's update), the shadow updates and the power twin train with Adam. An optimiser
    the simulations do not model (``--recipe optimizer=rmsprop``): they do not run and say why; the loss scores
    still do. An unknown --recipe key is refused, naming the keys."""
    from fedvit.app.cli import main

    capture_adam_exchange(tmp_path / "cap", 31, 3)
    data = UserData(DATA.source, {"31": 3}, DATA.decoy_partitions, DATA.app_dir)
    (row,) = audit_app_captures(tmp_path / "cap", tmp_path / "out", SPEC, BUDGET, data=data, measures=SHADOWS)[
        "updates"]  # fmt: skip
    assert "optimiser adam (run config)" in row["recipe"] and "optimiser SGD (assumed)" not in row["assumptions"]
    assert "momentum — (adam: betas 0.9, 0.999, eps 1e-8, torch's defaults, assumed)" in row["recipe"]
    assert "plain SGD" not in row["recipe"]
    labels = row["attacks"]["labels (head-bias gradient)"]
    assert "adam with torch's default betas" in labels and "momentum" not in labels
    assert "unverified: the client's optimiser is adam, which rescales every entry" in labels
    assert row["attacks"]["membership: shadow alignment"].startswith("applied: the update beyond 3 shadow")
    member = row["leakage"]["membership"]
    assert member["status"] == "measured" and "shadow alignment" in member["scores"]
    assert member["power"]["status"] == "measured"

    options = {"data": data, "measures": SHADOWS, "overrides": {"optimizer": "rmsprop"}}
    (row,) = audit_app_captures(tmp_path / "cap", tmp_path / "o1", SPEC, BUDGET, **options)["updates"]
    why = "the client's optimiser is rmsprop (override); fedvit simulates SGD, Adam, AdamW"
    assert "optimiser rmsprop (override)" in row["recipe"]
    assert row["attacks"]["membership: shadow alignment"] == f"not applicable: {why}"
    member = row["leakage"]["membership"]
    assert member["status"] == "measured" and "shadow alignment" not in member["scores"]
    assert (member["power"]["status"], member["power"]["why"]) == ("not measured", why)
    assert member["power"]["simulated"] is None and not member["power"]["could-have-seen"]
    base = ["audit", str(tmp_path / "cap"), "--out", str(tmp_path / "o2"), "--app-dir", str(APP),
            "--model", "cnnapp.task:Net"]  # fmt: skip
    assert main([*base, "--recipe", "learning_rat=0.1"]) == 2
    assert "recipe (--recipe) learning_rat: not a recipe key (one of" in capsys.readouterr().err
    assert main([*base, "--recipe", "augment=rotate"]) == 2
    assert "augment 'rotate': 'rotate' is not modelled (crop, crop:S, pad:P, flip, joined by +) (override)" in (
        capsys.readouterr().err)  # fmt: skip


def test_flowers_client_side_clipping_is_read_and_said_to_leave_the_update_unnoised_on_the_wire(tmp_path):
    """``clipping_norm`` in the ConfigRecord (Flower's DifferentialPrivacyClientSide*Clipping): the recipe says the
    update travels clipped but not noised; a clipped update's label counts are unverified (their scale is lost)."""
    capture_exchange(tmp_path / "cap", 41, 3, clip=0.01)
    (row,) = audit_app_captures(tmp_path / "cap", tmp_path / "out", SPEC, BUDGET)["updates"]
    assert ("update clipping norm 0.01 (ConfigRecord: Flower's client-side clipping; the server adds its noise after "
            "aggregation, so this update travels clipped, not noised: no DP against an eavesdropper on the link)"
            ) in row["recipe"]  # fmt: skip
    labels = row["attacks"]["labels (head-bias gradient)"]
    assert "unverified: the update was clipped to norm 0.01: its scale is unknown" in labels
    assert "clip scale estimated" in labels  # one step: the scale that makes the counts integral
    truth = np.bincount(load_data(3, partition_size("1,2,3,4", 3), 7)[1], minlength=10)
    assert row["labels"] == {c: int(n) for c, n in enumerate(truth) if n}


LOCAL_DP = {"local-dp-clipping-norm": 0.5, "local-dp-sensitivity": 0.5, "local-dp-epsilon": 2.0,
            "local-dp-delta": 1e-5}  # fmt: skip


def test_flowers_local_dp_settings_are_read_modelled_and_the_claim_tested(tmp_path):
    """LocalDpMod's four settings in the run config (or declared with --recipe): the recipe states the claim (ε per
    update) and the noise the mod added (its own formula), the label counts are unverified (noise on the head), and
    membership turns the test into an empirical ε beside the claim. Settings that leave the noise unknown (no δ) are
    refused, naming what is missing; ε 0 (an app's "off") is no claim."""
    from fedvit.capture.reader import load_exchanges
    from fedvit.observed.recipe import read_recipe

    capture_exchange(tmp_path / "cap", 51, 3, local_dp=LOCAL_DP)
    data = UserData(DATA.source, {"51": 3}, DATA.decoy_partitions, DATA.app_dir)
    report = audit_app_captures(tmp_path / "cap", tmp_path / "out", SPEC, BUDGET, data=data)
    (row,) = report["updates"]
    std = 0.5 * np.sqrt(2 * np.log(1.25 / 1e-5)) / 2.0  # LocalDpMod's own formula
    assert (f"privacy claim ε 2 per update, δ 1e-05 (Flower's LocalDpMod: the update clipped to norm 0.5, Gaussian "
            f"noise of std {std:.3g} on every entry; run config)") in row["recipe"]  # fmt: skip
    assert f"update clipping norm 0.5, then Gaussian noise of std {std:.3g} on every entry" in row["recipe"]
    assert "unverified: Flower's LocalDpMod added Gaussian noise" in row["attacks"]["labels (head-bias gradient)"]
    privacy = row["leakage"]["membership"]["privacy"]
    assert privacy["claimed-epsilon"] == 2.0 and privacy["delta"] == 1e-5 and privacy["consistent"], privacy
    assert "consistent with the claimed ε in 1 of 1" in report["verdict-detail"]

    (ex,), _ = load_exchanges(tmp_path / "cap")
    declared = read_recipe(dataclasses.replace(ex, run_config={"batch-size": 4}), "weights",
                           {k: str(v) for k, v in LOCAL_DP.items()})  # fmt: skip
    assert declared.update_noise == pytest.approx(std) and declared.privacy.source == "override"
    without_delta = {k: v for k, v in LOCAL_DP.items() if k != "local-dp-delta"}
    with pytest.raises(AuditInputError, match=r"local-dp-epsilon \(run config\) without local-dp-delta"):
        read_recipe(dataclasses.replace(ex, run_config=without_delta), "weights", {})
    off = read_recipe(dataclasses.replace(ex, run_config=LOCAL_DP | {"local-dp-epsilon": 0.0}), "weights", {})
    assert off.privacy is None and off.update_noise is None


def test_a_fedvit_local_dp_runs_recipe_carries_its_claim_and_its_noise():
    """fedvit's own dp.mode = "local": the claim (ε of one release at δ) and LocalDpMod's std, σ·C, in the recipe the
    simulations read; "central": the update clipped, no claim on the link; a FedSGD gradient: no update bound."""
    from fedvit.audit.fedvit_run import fedvit_recipe as config_recipe
    from fedvit.clients.privacy import flower_dp_mod, local_epsilon, local_noise_std
    from fedvit.core.config import parse_config

    base = {"strategy": "fedavg", "dp.clipping-norm": 0.2, "dp.noise-multiplier": 1.5}
    local = parse_config(base | {"dp.mode": "local"})
    client = config_recipe(local, {"num-examples": 32})
    assert client.privacy.epsilon == local_epsilon(local.dp) and client.update_clip == 0.2
    assert client.update_noise == pytest.approx(local_noise_std(flower_dp_mod(local.dp))) == pytest.approx(0.3)
    central = config_recipe(parse_config(base | {"dp.mode": "central"}), {"num-examples": 32})
    assert central.privacy is None and central.update_clip == 0.2 and central.update_noise is None
    fedsgd = config_recipe(parse_config(base | {"dp.mode": "local", "strategy": "fedsgd"}), {"num-examples": 32})
    assert fedsgd.privacy is not None and fedsgd.update_clip is None and fedsgd.update_noise is None


def test_a_declared_augmentation_is_in_the_recipe_and_the_loss_scores_take_its_views(tmp_path):
    """``--recipe augment=crop:0.5+flip``: the recipe says so (no "no data augmentation" assumption), the loss scores
    average over random views (other figures than the plain images'), the simulations train on views."""
    capture_adam_exchange(tmp_path / "cap", 31, 3)
    data = UserData(DATA.source, {"31": 3}, DATA.decoy_partitions, DATA.app_dir)
    runs = {}
    for augment in ("none", "crop:0.5+flip"):
        options = {"data": data, "measures": SHADOWS, "overrides": {"augment": augment}}
        (runs[augment],) = audit_app_captures(tmp_path / "cap", tmp_path / augment, SPEC, BUDGET, **options)["updates"]
    row = runs["crop:0.5+flip"]
    assert "augmentation random resized crop (scale 0.5–1) + horizontal flip (override)" in row["recipe"]
    assert "no data augmentation (assumed)" in runs["none"]["assumptions"]
    assert "no data augmentation (assumed)" not in row["assumptions"]
    plain, views = ({k: v["auc"] for k, v in r["leakage"]["membership"]["scores"].items()} for r in runs.values())
    assert plain != views
    assert row["leakage"]["membership"]["power"]["status"] == "measured"


def test_without_decoy_partitions_each_clients_others_are_the_other_clients_partitions():
    """Two clients whose capture records their partition ids, a loader with no partition beyond theirs: each
    client's auxiliary images and non-members are the other client's (they were uniform noise and no membership
    at all, as if --data were missing); with decoy partitions those are taken instead."""
    from fedvit.audit.user_data import Truths

    def loader(partition_id: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(partition_id)
        return rng.random((6 + partition_id, 3, 8, 8)), rng.integers(0, 3, 6 + partition_id)

    from fedvit.capture.reader import Exchange

    exchanges = [Exchange(Path(f"node-{n}"), 1, 1, n, p, 2, {}, {}, {}, {}, {}) for n, p in ((11, 0), (12, 1))]
    truths = Truths(UserData("test:loader", {}, loader=loader), decoys=99)
    assert truths.others(exchanges[0], None) is None  # before the audit says which partitions it holds
    truths = Truths(UserData("test:loader", {}, loader=loader), decoys=99)
    truths.hold(exchanges)
    for ex, other in zip(exchanges, (1, 0), strict=True):
        images, labels, source = truths.others(ex, None)
        assert len(images) == 6 + other and source.endswith(f"of partition {other} (test:loader)"), source
    decoyed = Truths(UserData("test:loader", {}, decoy_partitions=(2,), loader=loader), decoys=99)
    decoyed.hold(exchanges)
    assert decoyed.others(exchanges[0], None)[2].endswith("of partition 2 (test:loader)")


def test_an_audit_that_fails_midway_releases_the_rounds_pool_gradients(tmp_path, monkeypatch):
    """The alignment score keeps the round's pool gradients (up to half of GRADIENT_BYTES) for its other clients:
    an audit that raises on an update still releases them (a long-lived process, the Python API, would hold them)."""
    import fedvit.attacks.membership as membership
    import fedvit.audit.pipeline as pipeline

    capture_exchange(tmp_path / "cap", 21, 2, fedsgd=True)

    def failing(*args, **kwargs):
        membership._received_projection["round"] = (torch.zeros(1), None)
        raise RuntimeError("the attack failed")

    monkeypatch.setattr(pipeline, "attack_exchange", failing)
    with pytest.raises(RuntimeError, match="the attack failed"):
        audit_app_captures(tmp_path / "cap", tmp_path / "out", SPEC, BUDGET)
    assert not membership._received_projection
