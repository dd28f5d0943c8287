"""The audit: one pipeline for every Flower app. Per captured train exchange (:mod:`fedvit.capture.reader`):

1. the model: fedvit's ViT from the run config a capture of fedvit's app recorded, else the user's
   :class:`~fedvit.observed.model_spec.ModelSpec` (``--model``);
2. what the reply carries and the client's recipe: fedvit's run config names both; for another app they are
   read from the reply's distance to the received weights and the records (each value with its source);
3. every leakage measure of :mod:`fedvit.audit.registry` that applies (label counts, membership, the image
   attacks), each that does not with the reason, and per leakage type its evidence against its null;
4. scores against the clients' images (recorded ground truth or ``--data``) beside no-information references;
5. one report (:mod:`fedvit.audit.report`) and the leakage-vs-utility frontier (:mod:`fedvit.audit.frontier`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from tqdm import tqdm

from fedvit.attacks.holdings import Auxiliary, Candidates
from fedvit.attacks.membership import forget_received_projection
from fedvit.attacks.reidentification import Gallery
from fedvit.attacks.scores import Score
from fedvit.attacks.simulation import ModelInputError, trial_logits
from fedvit.audit.entries import ClientRounds, RecipeFitted, UpdateAudit
from fedvit.audit.evidence import threat_model, verdict_detail
from fedvit.audit.fedvit_run import fedvit_observation, model_skeleton
from fedvit.audit.figures import BAND_DRAWS, label_figure, png, roc_figure
from fedvit.audit.frontier import frontier_rows, write_frontier
from fedvit.audit.html import Picture, write_html
from fedvit.audit.json_fields import as_json
from fedvit.audit.members import member_membership
from fedvit.audit.membership_stats import Roc
from fedvit.audit.metrics import BATCH_SCORING, SETTINGS, reference_rows, reid_setting
from fedvit.audit.node_matching import with_matched_nodes
from fedvit.audit.registry import (
    LABELS,
    Held,
    MeasureOptions,
    MembershipSplit,
    best_image,
    evidence,
    judge_rounds,
    measure_all,
    membership_scores,
)
from fedvit.audit.report import AuditReport, json_text, markdown, save_grid
from fedvit.audit.secagg import (
    NotRebuilt,
    RoundEntry,
    SecureAggregation,
    aggregate_exchange,
    describe_rounds,
    secagg_rounds,
)
from fedvit.audit.summary import (
    client_findings,
    client_name,
    client_of,
    jointly_leaking,
    short_verdict,
    together,
)
from fedvit.audit.user_data import Truths, UserData, run_config
from fedvit.capture.reader import (
    NOTHING_ON_THE_WIRE,
    AuditInputError,
    Exchange,
    load_exchanges,
    load_handshake,
    unreadable_links,
)
from fedvit.capture.writer import FEDVIT_SWITCH
from fedvit.core.budget import DEFAULT_DECOYS, AuditConfig
from fedvit.core.config import Config, ConfigError, parse_config
from fedvit.core.params import HEAD_BIAS
from fedvit.core.results import atomic_write
from fedvit.observed.app_code import (
    CLASSIFIER_LOSSES,
    App,
    AppCodeError,
    CentralDp,
    CodeRecipe,
    central_dp,
    load_app,
    not_a_classifier,
    read_code,
)
from fedvit.observed.app_facts import read_normalisation
from fedvit.observed.model_spec import ModelSpec, head_bias, model_settings
from fedvit.observed.observation import Observation, Reconstruction, dense_update, recipe
from fedvit.observed.recipe import ClientRecipe, map_part, read_recipe, sent_kind

log = logging.getLogger("fedvit.audit")
OLD_LAYOUT_COMMIT = "154885d"  # the last fedvit that wrote and read captures/round-N/partition-P
# what no record of another app carries and the attacks take as given (the update's own math may contradict them)
UNRECORDED = ("weight decay 0 (assumed)", "optimiser SGD (assumed)", "no data augmentation (assumed)")


def unrecorded(client: ClientRecipe) -> list[str]:
    """What another app's update is assumed to do that no record says (an optimiser on record is not assumed)."""
    return [a for a in UNRECORDED if not (a.startswith("optimiser") and client.optimiser is not None)
            and not (a.startswith("weight decay") and (client.optimiser == "adamw" or client.source_of("weight decay")))
            and not (a.startswith("no data augmentation") and client.augment is not None)]  # fmt: skip


def probe_model(model: Any, spec: ModelSpec, code: CodeRecipe | None) -> None:
    """One forward pass of two images of the spec's input through the user's model before any figure rests on it:
    a model that fails on them or returns no logits stops the audit with one line (:class:`ModelInputError`), with
    what the app's training code says its loss is where that explains it (a reconstruction loss: not a
    classifier)."""
    loss = code.loss if code is not None else None
    other_loss = loss is not None and loss.read and loss.value not in CLASSIFIER_LOSSES
    try:
        trial_logits(model, spec.input_shape)
    except ModelInputError as err:
        if other_loss:
            raise ModelInputError(f"{err}; {not_a_classifier(loss)}") from err.__cause__
        raise
    if other_loss:  # the forward gives [B, K], but the code trains it on another loss: K are no classes
        raise ModelInputError(f"{spec.factory}: {not_a_classifier(loss)}")


@dataclasses.dataclass
class AuditOptions:
    """How to audit: the model of another app's captures, the budget, the scoring data and the reporting."""

    spec: ModelSpec | None = None  # another app's model (fedvit's captures name their own)
    budget: AuditConfig | None = None  # None: a fedvit run's own audit.*; another app's: AuditConfig() by model
    tv_by_model: bool = True  # another app's model: the TV weight by model family (False: ``budget.tv`` stands)
    overrides: dict[str, str] = dataclasses.field(default_factory=dict)  # recipe values the user knows
    app: Path | None = None  # the app's code (a folder or a FAB): else the FAB a tap kept or the folder a mod named
    sent_as: str = "auto"  # "gradient" | "weights": what another app's replies carry, when the distance misleads
    data: UserData | None = None  # the clients' data for scoring (else the ground truth fedvit's clients recorded)
    decoys: int = DEFAULT_DECOYS  # test-split decoys beside recorded ground truth (0: no re-identification)
    device: str | None = None  # default: a fedvit run's own ``device``, else "auto"
    title: str | None = None
    dataset_mean: np.ndarray | None = None  # the benchmark's "dataset mean image" reference
    gallery: Gallery | None = None  # decoys for every update (default: each run's test split, ``decoys`` of them)
    app_facts: tuple[dict[str, str], ...] = ()  # ``fedvit audit-app``: what it read from the app, with sources
    # what every measure reads (the budgets, shadow references, fit check and leakage types asked for)
    measures: MeasureOptions = dataclasses.field(default_factory=MeasureOptions)


class Audited(NamedTuple):
    """What the pipeline produced for one exchange: its observation, truth and reconstructions by attack."""

    obs: Observation
    truth: np.ndarray | None
    reconstructions: dict[str, Reconstruction]


class Exchanged(NamedTuple):
    """What the audit keeps of one exchange attacked (:func:`attack_exchange`): its report rows, its update entry,
    each attack's reconstruction and re-identification ranks, the strongest membership score's judged values (the
    ROC; None: none ran) and the membership scores with the split they were taken on (a client's rounds combine
    them; None: no membership candidates)."""

    rows: list[dict[str, Any]]
    update: UpdateAudit
    reconstructions: dict[str, Reconstruction]
    ranks: dict[str, list[int] | None]
    roc: Roc | None
    scores: tuple[list[Score], MembershipSplit] | None


class Written(NamedTuple):
    """An audit written out: ``audit.json``'s content, the report it was written from, and per exchange what was
    attacked."""

    report: dict[str, Any]
    audit: AuditReport
    attacked: list[Audited]


# ---------------------------------------------------------------------------- reading


def is_fedvit(ex: Exchange) -> bool:
    """Whether the exchange is of fedvit's own app (its recorded run config is fedvit's)."""
    return FEDVIT_SWITCH in ex.run_config


class Reader:
    """Captured exchanges as observations, with what the wire showed before them: round 0's key handshake,
    SCAFFOLD's control variates (captures in round order) and the colluders' known images."""

    def __init__(self, options: AuditOptions) -> None:
        self.options = options
        self._handshakes: dict[Path, Any] = {}
        self._controls: dict[tuple[Path, int], dict[str, np.ndarray]] = {}
        self._colluders: dict[Path, list[tuple[int, np.ndarray, dict[str, np.ndarray]]]] = {}
        self._skeleton: Any = None
        self._apps: dict[Path, App | str] = {}  # the app code of each path (or why it could not be read)

    def observe(self, ex: Exchange, index: int = 1) -> Observation:
        """``ex`` as the attacker holds it; ``index`` (1-based, in audit order) seeds another app's random starts."""
        obs = self._fedvit(ex) if is_fedvit(ex) else self._other_app(ex, index)
        client = recipe(obs)
        setting = f"round {ex.round}, B={client.batch}" + (
            ", FedSGD" if client.sends_gradient else f", {client.steps} local steps"
        )
        obs.meta.update({"node": ex.node, "partition": ex.partition, "round": ex.round, "update": ex.label,
                         "defence-name": obs.defence.name, "setting": setting, "batch-size": client.batch,
                         "local-steps": 1 if client.sends_gradient else client.steps})  # fmt: skip
        obs.meta.update(ex.meta)  # a producer's own labels (the benchmark's defence and setting)
        return obs

    def _fedvit(self, ex: Exchange) -> Observation:
        """A capture of fedvit's app: its run config names the model, the defence and the recipe."""
        try:
            config = parse_config(ex.run_config)
        except ConfigError as err:
            raise AuditInputError(f"{ex.label}: the recorded run config does not parse ({err})") from None
        received = ex.received
        num_classes = int(received[HEAD_BIAS].shape[0])
        expected = {n: tuple(p.shape) for n, p in model_skeleton(config, num_classes).named_parameters()}
        got = {n: tuple(a.shape) for n, a in received.items()}
        if got != expected:
            bad = sorted(set(got.items()) ^ set(expected.items()))[:3]
            raise AuditInputError(f"{ex.stem}: the capture does not match the model of its run config (e.g. {bad})")
        update, masks = dense_update(ex.sent_records, expected)
        run = ex.stem.parent.parent.parent  # run-<id>/captures/round-NNNN/<stem>
        plain, cipher = (None, None) if config.encryption.mode == "private-init" else self._handshake(run)
        meta = {
            "label": f"p{ex.partition} r{ex.round}",
            "num-examples": ex.sent_metrics.get("num-examples"),
            "round": ex.round,  # the recipe's learning rate after decay
        }
        return fedvit_observation(
            config,
            update,
            received,
            num_classes,
            masks=masks,
            known_plaintext=plain,
            known_ciphertext=cipher,
            known_images=self._known_images(ex, config) if config.encryption.enabled else None,
            correction=self._correction(ex, config, run),
            meta=meta,
        )

    def _handshake(self, run: Path) -> tuple[Any, Any]:
        if run not in self._handshakes:  # the wire saw the public initial layers go down and their encryption
            self._handshakes[run] = load_handshake(run) or (None, None)
        return self._handshakes[run]

    def _correction(self, ex: Exchange, config: Config, run: Path) -> dict[str, np.ndarray] | None:
        """SCAFFOLD: c − c_i, with c from the train message and c_i summed from the client's earlier
        control-deltas on the wire (zeros before its first round)."""
        if config.strategy != "scaffold":
            return None
        control = ex.received_records["control"]
        key = (run, -1 if ex.partition is None else ex.partition)
        mine = self._controls.get(key, {})
        correction = {n: control[n] - mine.get(n, np.zeros_like(control[n])) for n in control}
        delta = ex.sent_records.get("control-delta", {})
        self._controls[key] = {n: mine.get(n, 0) + d for n, d in delta.items()}
        return correction

    def _known_images(self, ex: Exchange, config: Config) -> list[tuple[np.ndarray, dict[str, np.ndarray]]] | None:
        """Colluders (the benchmark's threat model): other clients' images and their single-image updates under the
        same key, from the captures (with ground truth) a producer named in ``meta.colluders``."""
        folder = ex.meta.get("colluders")
        if not folder:
            return None
        folder = Path(folder)
        if folder not in self._colluders:
            exchanges, _ = load_exchanges(folder)
            known = []
            for colluder in exchanges:
                truth = colluder.ground_truth()
                if truth is not None:
                    update = self._fedvit(colluder).update
                    known.append((int(colluder.partition), np.asarray(truth["images"])[0], update))
            self._colluders[folder] = sorted(known, key=lambda k: k[0])
        return [(image, update) for p, image, update in self._colluders[folder] if p != ex.partition]

    def _other_app(self, ex: Exchange, index: int) -> Observation:
        """A capture of another app: the user's model, the reply's kind and the recipe read from the records."""
        spec = self.options.spec
        if spec is None:
            raise AuditInputError(
                f"{ex.label} is not from fedvit's app: give its model with --model package.module:factory "
                "(or a timm name), or write fedvit-audit.toml beside the captures"
            )
        code, code_note = self.code(ex)
        if self._skeleton is None:
            self._skeleton = spec.build(num_classes=int(list(ex.received.values())[-1].shape[0]))
            probe_model(self._skeleton, spec, code)
        base = self._skeleton
        names = [n for n, _ in base.named_parameters()]
        received, part = map_part(ex.received, base, f"{ex.label} (received)")
        sent, sent_part = map_part(ex.sent, base, f"{ex.label} (sent)")
        if sent_part != part:
            raise AuditInputError(
                f"{ex.label}: the received arrays fit {part or 'the whole model'}, the sent ones "
                f"{sent_part or 'the whole model'}"
            )
        trained = None
        if part:  # a partial update: the rest of the model is the --model weights, public and frozen
            public = {n: t.detach().numpy() for n, t in base.state_dict().items()}
            received, sent = public | received, public | sent
            trained = tuple(n for n in names if n in sent and n.startswith(f"{part}."))
        kind, evidence = sent_kind(received, sent, list(trained or names))
        told = self.options.sent_as != "auto"
        if kind == "ambiguous" and not told:
            raise AuditInputError(
                f"{ex.label}: the reply reads neither as weights nor as a gradient ({evidence}): give --sent weights "
                "or --sent gradient"
            )
        kind = self.options.sent_as if told else kind
        client = read_recipe(ex, kind, self.options.overrides, code)
        bias = head_bias(base)
        classes = int(received[bias].shape[0]) if bias else int(list(received.values())[-1].shape[0])
        meta = {
            "label": f"r{ex.round} n{ex.node}",
            "num-examples": client.examples,
            "app-code": code_note,
            "sent": f"{kind} ({evidence})"
            + (", as told" if told else "")
            + (
                f"; of {part} only ({len(trained)} of {len(names)} parameter tensors): the rest is --model's "
                "weights, taken as the public weights the client froze"
                if trained
                else ""
            ),
        }
        return Observation(
            update={n: sent[n] for n in names},
            received=received,
            num_classes=classes,
            meta=meta,
            spec=spec,
            skeleton=base,
            client=client,
            head_bias=bias or "",
            start_seed=index,
            trained=trained,
        )

    def app_of(self, ex: Exchange) -> App | str:
        """The app code behind ``ex`` (``--app``, else the FAB a wire tap kept, else the folder a capture mod named),
        or why there is none; read once per path."""
        path = self.options.app or ex.app_code
        if path is None:
            why = {
                "wire-tap": "the tap kept no app bundle for this run (it sees none on TLS links, and none before "
                "a node fetched it)"
            }.get(ex.observer or "", "the capture names no app folder")
            return f"none: {why}; give --app DIR|FAB to read the recipe from the app's code"
        path = Path(path)
        if path not in self._apps:
            try:
                self._apps[path] = load_app(path)
            except (AppCodeError, OSError) as err:
                if self.options.app is not None:
                    raise AuditInputError(f"--app: {err}") from None
                self._apps[path] = f"not read ({err})"
        return self._apps[path]

    def code(self, ex: Exchange) -> tuple[CodeRecipe | None, str]:
        """What the app's training code says for ``ex`` (None: no code, or code not read), and where it came from or
        why there is none."""
        app = self.app_of(ex)
        if isinstance(app, str):
            return None, app
        source = (
            "--app"
            if self.options.app is not None
            else ("the app bundle the tap kept" if ex.observer == "wire-tap" else "the app folder the capture named")
        )
        code = read_code(app, {"run config": ex.run_config, "ConfigRecord": ex.received_config})
        return code, f"{app.where} ({source})" + "".join(f"; {n}" for n in code.notes)

    def budget(self, ex: Exchange, obs: Observation) -> tuple[AuditConfig, str]:
        """The optimisation budget for ``obs`` (read from ``ex``) and how the report states it: a fedvit run's own
        (or the user's) ``audit.*``; for another app's model the user's budget with the start, kept candidate and
        (unless the user set it) TV weight that :func:`fedvit.observed.model_spec.model_settings` chooses for the
        model family."""
        if (config := run_config(ex)) is not None:
            budget = self.options.budget or config.audit
            return budget, budget.describe()
        settings, why = model_settings(obs.skeleton)
        tv_note = f" ({why}; --tv sets the weight)" if self.options.tv_by_model else " (--tv)"
        if not self.options.tv_by_model:
            settings.pop("tv")
        budget = dataclasses.replace(self.options.budget or AuditConfig(), **settings)
        start = "Gaussian start on the normalised scale" if budget.init == "gaussian" else "uniform start"
        text = (  # a user's model: no closed-form start, no position-embedding term to speak of
            f"{budget.iterations} Adam steps × {budget.restarts} restart(s), ≤ {budget.max_seconds:g} s per update, "
            f"step {budget.lr:g}, TV {budget.tv:g}{tv_note}, {start}, keeps the lowest "
            + ("gradient match" if budget.keep == "match" else "total objective")
        )
        return budget, text


# ---------------------------------------------------------------------------- the pipeline


def attack_exchange(
    obs: Observation, budget: AuditConfig, truth: tuple, options: AuditOptions, position: str,
    aux: Auxiliary | None = None, candidates: Candidates | None = None, device: str | None = None,
) -> Exchanged:  # fmt: skip
    """Every registry entry on one observation (:func:`fedvit.audit.registry.measure_all`): what the audit keeps of
    it (:class:`Exchanged`). ``aux``: labelled images that are not the client's (the label simulation's);
    ``candidates``: membership's; ``device``: where the optimisation attacks run (default ``options.device``)."""
    images, labels, gallery, exact = truth
    client = recipe(obs)
    started = time.perf_counter()
    held = Held(images, labels, gallery, exact, budget, {**obs.meta, "defence": obs.defence.name}, aux,
                candidates, options.measures, device or options.device, position)  # fmt: skip
    measured = measure_all(obs, held)  # a measure may estimate a recipe value: the one recipe from here on
    obs, findings, held = measured.obs, measured.findings, measured.held
    judged = evidence(measured)
    client = recipe(obs)
    rows = [row for f in findings.values() for row in f.rows]
    best, best_scores = best_image(findings)
    if images is not None and best is not None:  # the no-information references of the image attacks that ran
        rows += reference_rows(obs, images, options.dataset_mean, gallery, held.head)
    statuses = {n: f.status for n, f in findings.items() if f.status is not None and f.applied}
    statuses |= {n: f.status for n, f in findings.items() if f.status is not None and not f.applied}
    labelled = findings[LABELS].rows[0]
    fit = held.estimate.recipe_fit
    update = UpdateAudit(
        update=obs.meta.get("update") or obs.meta["label"],
        node=obs.meta.get("node"),
        round=obs.meta.get("round"),
        partition=obs.meta.get("partition"),
        sent=obs.meta.get("sent") or ("gradient" if client.sends_gradient else "weights") + " (run config)",
        batch=client.batch,
        steps=client.steps,
        examples=client.examples,
        recipe=client.described(),
        recipe_sources=list(client.sources),  # per value: "value (where it came from)"
        app_code=obs.meta.get("app-code"),
        recipe_fit=None if fit is None else RecipeFitted.of(
            fit, held.options.fit_check and not held.estimate.fit_unchecked,
            held.estimate.fit_unchecked or (None if held.options.fit_check else "--no-fit-check")),  # fmt: skip
        # recipe values no record carries and nothing estimated, and (another app) what no record can carry
        assumptions=client.assumed() + ([] if obs.defence.fedvit else unrecorded(client)),
        labels=labelled["labels"],
        label_accuracy=labelled["label-accuracy"],
        frozen_features=held.features.note,  # a partial update: its head on cached features?
        attacks=statuses,
        best_attack=best,
        leakage=judged.leakage,
        seconds=round(time.perf_counter() - started, 1),
        best=best_scores,
    )
    recs = {n: f.reconstruction for n, f in findings.items() if f.reconstruction is not None}
    ranks = {n: f.scores.reid_ranks for n, f in findings.items() if f.reconstruction is not None}
    split = held.split
    scores = None if split is None else (membership_scores(findings), split)
    return Exchanged(rows, update, recs, ranks, judged.roc, scores)


def audit_exchanges(
    exchanges: list[Exchange], out: Path, options: AuditOptions, notes: list[str] | None = None,
    secure: Secured | None = None, tls_links: int = 0,
) -> Written:  # fmt: skip
    """Attack and score every exchange; write ``audit.json``, ``audit.md``, ``grid.png`` and the frontier under
    ``out`` (``tls_links``: links a wire tap could not read)."""
    out.mkdir(parents=True, exist_ok=True)
    reader, truths = Reader(options), Truths(options.data, options.decoys, options.gallery)
    truths.hold(exchanges)
    if (said := unstated_normalisation(reader, exchanges)) is not None:
        notes = [*(notes or []), said]
    rows, updates, attacked, grid_ranks, budgets, observers = [], [], [], [], {}, []
    rocs: dict[str, list[tuple[str, Roc]]] = {}
    by_client: dict[str, list[tuple[str, Any]]] = {}
    try:  # the round's pool gradients (up to GRADIENT_BYTES / 2) are released however the audit ends
        for k, ex in enumerate(tqdm(exchanges, desc="audit", unit="update")):
            obs = reader.observe(ex, k + 1)
            budget, text = reader.budget(ex, obs)
            device = options.device or (config.device if (config := run_config(ex)) is not None else None)
            budgets[budget_text(text, options.measures.budgets)] = None
            truth = truths.of(ex, obs)
            aux = truths.auxiliary(ex, obs) if recipe(obs).several_steps else None
            candidates = truths.candidates(ex, obs, truth[0], truth[1])
            done = attack_exchange(obs, budget, truth, options, f"update {k + 1}/{len(exchanges)}", aux, candidates,
                                   device)  # fmt: skip
            update, scores = done.update, done.scores
            rows += done.rows
            observers.append(ex.observer)
            grid_ranks.append(done.ranks)
            if done.roc is not None:
                rocs.setdefault(client_of(update), []).append((f"round {update.round}", done.roc))
            if scores is not None and scores[0]:
                by_client.setdefault(client_of(update), []).append((update.update, scores))
                if slices := truths.slices.get(ex.label):  # a SecAgg+ aggregate: each member's images in it
                    split, power = scores[1], update.membership.power
                    members = member_membership(scores[0], split.candidates, split.seed, slices, power)
                    update = dataclasses.replace(update, membership_members=members)
            updates.append(update)
            attacked.append(Audited(obs, truth[0], done.reconstructions))
            log.info(f"audit: {update.update}: labels {update.labels}; " + (
                "unscored" if update.best is None else
                f"best {update.best_attack} {update.best.psnr:.2f} dB, re-id top-1 "
                + ("—" if update.best.reid_top1 is None else f"{update.best.reid_top1:.0%}")
            ) + f" ({update.seconds:.0f} s)")  # fmt: skip
    finally:
        forget_received_projection()
    models = dict.fromkeys(
        f"fedvit's {a.obs.spec.factory.removeprefix('fedvit ')} (run config)"
        if a.obs.defence.fedvit
        else a.obs.spec.describe()
        for a in attacked
    )
    clients = rounds_combined(by_client)
    masked = [client_name(node, recorded, options.data) for node, recorded in (secure.masked if secure else [])]
    findings = client_findings(updates, clients, masked)
    joint = jointly_leaking(updates, findings)
    audit = AuditReport(
        title=options.title or "fedvit audit",
        model="; ".join(models) or "— (no update was readable: nothing attacked)",
        read_from_app=[dict(f) for f in options.app_facts],
        threat_model=threat_model(observers, any(u.assumptions for u in updates), tls_links),
        verdict=short_verdict(findings, NOTHING_ON_THE_WIRE, secured=bool(secure and secure.rounds),
                              jointly=together(joint)),
        findings=findings,
        together=joint,
        verdict_detail=verdict_detail([u.leakage for u in updates], NOTHING_ON_THE_WIRE,
                                      [c.membership for c in clients]),
        metrics=SETTINGS | {"batch": BATCH_SCORING, "re-identification": reid_setting(truths.galleries)},
        budget=list(budgets),
        updates=updates,
        clients=clients,
        rows=rows,
        summary=frontier_rows(rows, {}),  # each attack's means per defence and setting
        notes=list(notes or []) + truths.notes,
        secure_aggregation=None if not (secure and secure.rounds) else SecureAggregation(secure.rounds),
    )
    report = as_json(audit)
    atomic_write(out / "audit.json", json_text(report).encode())
    atomic_write(out / "audit.md", markdown(audit).encode())
    save_grid([(a.obs, a.truth, a.reconstructions) for a in attacked], out / "grid.png", grid_ranks)
    write_frontier(rows, out, {})
    drawn = pictures(updates, rocs, out, any(a.reconstructions for a in attacked))
    write_html(report, findings, drawn, out / "audit.html")
    return Written(report, audit, attacked)


def pictures(
    updates: list[UpdateAudit], rocs: dict[str, list[tuple[str, Roc]]], out: Path, attacked: bool
) -> list[Picture]:
    """The report's pictures, each also a file under ``out``: the membership ROC per client, the label counts and,
    where an image attack ran, the reconstruction grid (written by :func:`save_grid`)."""
    found = []
    if rocs:
        found.append(Picture(
            "Membership inference, per client", "ROC of the strongest membership score on log–log axes, one curve per "
            "update, drawn only above the FPR resolution (1 / the fewest non-members of a member's class); grey: "
            f"the same values with the member labels shuffled within each class ({BAND_DRAWS} shuffles, 95%).",
            png(roc_figure(rocs))))  # fmt: skip
    if (labels := label_figure(updates)) is not None:
        found.append(Picture(
            "Label counts per update", "The class counts recovered from the update (red) against the prior's, N × the "
            "population's class shares (the no-information guess, black), and the true counts (blue) where the "
            "scoring data gives them.", png(labels)))  # fmt: skip
    if attacked and (out / "grid.png").is_file():
        found.append(Picture("Reconstructions", "Each true image beside each attack's reconstruction matched to it.",
                             (out / "grid.png").read_bytes()))  # fmt: skip
    names = {"Membership inference, per client": "membership-roc.png", "Label counts per update": "labels.png"}
    for picture in found:
        if picture.title in names:
            atomic_write(out / names[picture.title], picture.png)
    return found


def rounds_combined(by_client: dict[str, list[tuple[str, Any]]]) -> list[ClientRounds]:
    """Per client with two or more audited updates, its membership over all of them (:func:`judge_rounds`)."""
    out = []
    for client, found in by_client.items():
        if len(found) < 2:
            continue
        started = time.perf_counter()
        log.info(f"audit: {client}: membership over its {len(found)} updates")
        evidence = judge_rounds([scores for _, scores in found])
        out.append(ClientRounds(client, [name for name, _ in found], evidence, round(time.perf_counter() - started,
                                                                                     1)))  # fmt: skip
    return out


def budget_text(text: str, budgets: tuple[int, ...] | None) -> str:
    """The optimisation budget as the report states it, with the budgets of ``--budgets`` where given."""
    if budgets:
        text = f"budgets (Adam steps per restart): {', '.join(map(str, budgets))}; otherwise " + text
    return text


def run_audit(captures: Path, out: Path, options: AuditOptions | None = None) -> dict[str, Any]:
    """Audit every captured train exchange under ``captures`` (a capture root, a run folder or a ``captures/``
    folder of any Flower app): see the module docstring. Returns the report (``audit.json``'s content); progress and
    notes go to the ``fedvit.audit`` logger. Raises :class:`AuditInputError` with what to change. The public entry
    point with plain types is :func:`fedvit.audit.api.audit_captures`."""
    return audit_captured(captures, out, options).report


def audit_captured(captures: Path, out: Path, options: AuditOptions | None = None) -> Written:
    """:func:`run_audit`, returning everything it wrote (:class:`Written`)."""
    options = options or AuditOptions()
    captures = Path(captures)
    if not captures.exists():
        raise AuditInputError(f"no captures in {captures}: no such folder")
    exchanges, skipped = load_exchanges(captures)
    hidden = unreadable_links(captures)
    notes = [f"skipped {s}" for s in skipped]
    central = app_central_dp(exchanges, options)
    secure = secure_aggregation(exchanges, notes, central)  # SecAgg+'s stages out, the aggregates in
    exchanges = secure.exchanges
    data, matched = with_matched_nodes(exchanges, options.data, options.spec)
    if matched is not None:
        log.info(f"audit: {matched}")
        notes.append(matched)
        options = dataclasses.replace(options, data=data)
    if hidden:
        notes.append(
            f"{hidden} link(s) were TLS or HTTP/2: relayed as bytes, only connection metadata recorded (no "
            "messages, and no app bundle to read the client's recipe from: give --app DIR|FAB)"
        )
    if not exchanges and not hidden and not secure.rounds:
        old = (
            " (these are fedvit's captures in the layout before the one capture layout, captures/round-N/partition-P:"
            f" fedvit at commit {OLD_LAYOUT_COMMIT} audits them, or capture the run again)"
        )
        raise AuditInputError(
            f"no captured train exchanges (node-<id>.json) under {captures}"
            + (old if any(captures.rglob("partition-*.json")) else "")
        )
    log.info(f"audit: {len(exchanges)} captured update(s) under {captures}")
    title = options.title or f"fedvit audit of {captures}"
    if options.spec is not None and exchanges and all(is_fedvit(ex) for ex in exchanges):
        raise AuditInputError("--model: these are captures of fedvit's own app, whose run config names its model")
    return audit_exchanges(exchanges, Path(out), dataclasses.replace(options, title=title), notes, secure, hidden)


def unstated_normalisation(reader: Reader, exchanges: list[Exchange]) -> str | None:
    """Another app's mean and std where the user gave neither: the defaults, checked against the normalisation the
    app's code states (:func:`fedvit.observed.app_facts.read_normalisation`) — an AuditInputError naming --mean and
    --std where it states other values (every figure would rest on the wrong ones); the note that the defaults are
    assumed where no code is at hand or it states none; None where the code agrees (or the values were given)."""
    spec = reader.options.spec
    other = next((ex for ex in exchanges if not is_fedvit(ex)), None)
    if spec is None or spec.stated or other is None:
        return None
    assumed = f"mean and std not given: the defaults {list(spec.mean)} / {list(spec.std)} assumed"
    app = reader.app_of(other)
    if isinstance(app, str):
        return f"{assumed} (no app code to check them against: {app.split(';')[0]}; give --mean and --std)"
    mean, std = read_normalisation(app, {"run config": other.run_config})
    if mean.value is None or std.value is None:
        return f"{assumed} (the app's code does not fix them: {mean.how}; give --mean and --std)"
    if mean.how.startswith("no Normalize"):  # it may normalise where no Normalize is read (timm's transforms)
        return f"{assumed} (the app's code states no Normalize(...) to check them against; give --mean and --std)"
    channels = spec.input_shape[0]
    stated = [tuple(v.value) * (channels if len(v.value) == 1 else 1) for v in (mean, std)]
    if stated != [tuple(spec.mean), tuple(spec.std)]:
        values = [",".join(f"{x:g}" for x in v) for v in stated]
        raise AuditInputError(
            f"--mean and --std not given: the app's code normalises with mean {values[0]} and std {values[1]} "
            f"({mean.source}, {mean.how}), not the defaults {list(spec.mean)} / {list(spec.std)} every figure would "
            f"rest on: give --mean {values[0]} --std {values[1]}"
        )
    return None


class Secured(NamedTuple):
    """What the SecAgg+ rounds among the captures give the audit: the exchanges to attack (the others, and one per
    round for the aggregate), the report's entries per round and the nodes whose updates were masked."""

    exchanges: list[Exchange]
    rounds: list[RoundEntry]
    masked: list[tuple[Any, int | None]]  # (node, the partition its node config recorded)


def app_central_dp(exchanges: list[Exchange], options: AuditOptions) -> CentralDp | None:
    """The central DP the app's server code sets up (:func:`fedvit.observed.app_code.central_dp`), read from
    ``--app`` or the first capture that names its app's code, against that capture's run config."""
    for ex in exchanges:
        path = options.app or ex.app_code
        if path is None:
            continue
        try:
            app = load_app(Path(path))
        except (AppCodeError, OSError):
            continue
        return central_dp(app, {"run config": ex.run_config})
    return None


def secure_aggregation(exchanges: list[Exchange], notes: list[str], central: CentralDp | None = None) -> Secured:
    """Split SecAgg+'s rounds off (:mod:`fedvit.audit.secagg`): each node's masked vector is never attacked; each
    round's aggregate, rebuilt (or taken from the next broadcast), is audited as the server's view; its gap to the
    next broadcast is set beside ``central``'s noise where the app's code adds it."""
    rounds, rest = secagg_rounds(exchanges)
    entries, aggregates = describe_rounds(rounds, central.noise_std if central is not None else None)
    for found in rounds:
        aggregate = aggregates.get((found.run_id, found.round))
        if aggregate is None:
            continue
        try:
            rest.append(aggregate_exchange(found, aggregate))
        except NotRebuilt as err:
            notes.append(f"{found.label}: the aggregate is not audited ({err})")
    masked = {n: next(iter(r.stages[n].values())).partition for r in rounds for n in r.sampled}
    return Secured(rest, entries, sorted(masked.items()))
