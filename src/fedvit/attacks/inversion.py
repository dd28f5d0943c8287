"""Optimisation-based gradient inversion of a captured update, for any batch size, FedSGD and FedAvg/FedProx.

A candidate batch x (pixels in [0, 1]) goes through the client's known local work on the model it received,
and x is moved until the simulated update matches the observed one (Inverting Gradients, Geiping et al. 2020:
1 − cosine over the shared entries, total-variation prior, Adam on the signed gradient, box projection, restarts,
and the unrolled local steps of FedAvg). The position-embedding gradient gets an extra cosine term
(APRIL's optimisation variant: it is the attention model's most revealing gradient). Labels come from the
head-bias gradient (fedvit.attacks.labels); where that is hidden, soft labels are optimised with the images (DLG).

Defence-aware by construction: entries a mask dropped (fresh or locked masks, the fixed-position method) are
left out of the match; the client's Madry PGD recipe is re-run on the candidates; an encrypted model is attacked
as received (without the key it yields the encrypted-domain image, which is scored as it is).

Double backward through timm's fused attention is not implemented on CPU, so the attack's model copy uses the
explicit attention path (the function is the same). It runs on the device the audit names ("auto": CUDA where
available). Restarts are batched: every restart is simulated with its own copy of the weights in one vmapped
forward pass, and one backward pass moves them all (Adam is elementwise, so this is the same as running them one
after another, only without the sequential passes).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedvit.attacks.april import collusion_key, decrypt_observation, embedding_route
from fedvit.attacks.labels import recover_labels
from fedvit.attacks.local_sgd import gradients, local_sgd
from fedvit.core.budget import AuditConfig
from fedvit.core.model import normalize, resolve_device
from fedvit.core.params import POS_EMBED
from fedvit.observed.observation import (
    ClientRecipe,
    Observation,
    Reconstruction,
    as_gradient,
    attack_model,
    attacker_seed,
    image_geometry,
    recipe,
    simulated,
)


def observed_target(obs: Observation) -> dict[str, torch.Tensor]:
    """What the simulation must reproduce: the gradient (FedSGD) or the weight change w_received − w_sent."""
    return {n: torch.as_tensor(u, dtype=torch.float32) for n, u in as_gradient(obs).update.items()}


def kept_entries(obs: Observation) -> dict[str, torch.Tensor] | None:
    """Which entries the attacker can match: the payload's keep-masks (the mask is on the wire), else all."""
    if obs.masks is None:
        return None
    return {n: torch.as_tensor(m.astype(bool)) for n, m in obs.masks.items()}


def simulate(
    model: nn.Module,
    params: dict[str, torch.Tensor],
    x: torch.Tensor,
    label_logits: torch.Tensor,
    rec: ClientRecipe,
    adversary: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
    correction: dict[str, torch.Tensor] | None = None,
    per_epoch: bool = False,
) -> dict[str, torch.Tensor]:
    """The client's update for candidate pixels ``x`` [restarts, examples, C, H, W], differentiable in x; every
    entry of the result has a leading restart dimension.

    FedSGD: ∇ of the mean cross-entropy. FedAvg/FedProx: w₀ − w_end after the unrolled local SGD (momentum as
    torch's SGD), each epoch in consecutive chunks of B candidates: the client's shuffled order is unknown, and
    the candidates are a set, so the attacker fixes one (an approximation for E > 1 or mismatched label chunks).
    ``label_logits`` [restarts, examples, K] are near-one-hot (recovered labels) or learned soft labels;
    ``correction`` (SCAFFOLD's c − c_i) is added to every local gradient. Each restart runs on its own (expanded)
    copy of the weights, so one ``autograd.grad`` of the summed losses yields every restart's own gradient.
    ``per_epoch``: x and ``label_logits`` hold one candidate set per epoch ([restarts, epochs · examples, ...]),
    epoch e training on its own set (the FedAvg-aware attack: each epoch's order is free).
    """
    restarts = x.shape[0]
    start = {n: p.expand(restarts, *p.shape) for n, p in params.items()}
    if restarts == 1:  # vmap's batched-weight kernels cost ~40% more on CPU than plain ones for a single restart

        def forward(w: dict[str, torch.Tensor], xb: torch.Tensor) -> torch.Tensor:
            return functional_call(model, {n: t[0] for n, t in w.items()}, (normalize(model, xb[0]),))[None]

    else:
        forward = torch.func.vmap(lambda w, xb: functional_call(model, w, (normalize(model, xb),)), randomness="same")

    def batch_loss(weights: dict[str, torch.Tensor], chunk: slice) -> torch.Tensor:
        """The summed cross-entropy of every restart's candidates in ``chunk`` (each restart's own gradient)."""
        xb, yb = x[:, chunk], label_logits[:, chunk]
        if adversary is not None:
            xb = adversary(xb, yb)
        logits = forward(weights, xb)
        return -(torch.softmax(yb, -1) * torch.log_softmax(logits, -1)).sum(-1).mean(-1).sum()

    if rec.sends_gradient:
        return gradients(batch_loss(start, slice(0, rec.batch)), start, differentiable=True)
    chunks = [  # each epoch in consecutive chunks of B candidates (its own candidate set when ``per_epoch``)
        slice(first, min(first + rec.batch, offset + rec.examples))
        for offset in (epoch * rec.examples if per_epoch else 0 for epoch in range(rec.epochs))
        for first in range(offset, offset + rec.examples, rec.batch)
    ]
    end = local_sgd(start, batch_loss, chunks, rec.lr, rec.momentum, proximal_mu=rec.proximal_mu,
                    correction=correction, differentiable=True)  # fmt: skip
    return {n: start[n] - end[n] for n in start}


def _per_restart(values: torch.Tensor) -> torch.Tensor:
    """The mean over everything but the leading restart dimension."""
    return values.flatten(1).mean(1)


def match_loss(
    sim: dict[str, torch.Tensor],
    target: dict[str, torch.Tensor],
    kept: dict[str, torch.Tensor] | None,
    pos_weight: float,
) -> torch.Tensor:
    """Per restart ([restarts]; ``sim`` has a leading restart dimension, ``target`` has none): 1 − cosine between
    the simulated and observed updates over the entries the attacker sees, plus ``pos_weight`` · (1 − cosine) on
    the position-embedding gradient alone (when any of it was sent)."""
    dot = sim_sq = tgt_sq = pos_term = torch.zeros(())
    for name, t in target.items():
        s = sim[name]
        if kept is not None:
            s, t = s[:, kept[name]], t[kept[name]]
        if t.numel() == 0:
            continue
        s = s.flatten(1)
        dot = dot + s @ t.flatten()
        sim_sq = sim_sq + (s * s).sum(1)
        tgt_sq = tgt_sq + (t * t).sum()
        if name == POS_EMBED and pos_weight > 0 and bool(t.any()):
            pos_term = pos_term + pos_weight * (1 - F.cosine_similarity(s, t.flatten()[None], dim=1))
    return 1 - dot / (sim_sq.sqrt() * tgt_sq.sqrt() + 1e-12) + pos_term


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Per restart (``x`` [restarts, examples, C, H, W]): mean absolute difference of neighbouring pixels
    (anisotropic TV)."""
    return _per_restart((x[..., 1:, :] - x[..., :-1, :]).abs()) + _per_restart((x[..., :, 1:] - x[..., :, :-1]).abs())


def patch_border_variation(x: torch.Tensor, patch: int) -> torch.Tensor:
    """Per restart: GradViT's patch prior (Hatamizadeh et al. 2022), the mean absolute difference of neighbouring
    pixels across patch borders only, where ViT reconstructions show seams (each patch is embedded on its own)."""
    rows = _per_restart((x[..., patch::patch, :] - x[..., patch - 1 : -1 : patch, :]).abs())
    cols = _per_restart((x[..., :, patch::patch] - x[..., :, patch - 1 : -1 : patch]).abs())
    return rows + cols


def madry_simulator(obs: Observation, model: nn.Module, count: int) -> Callable | None:
    """The client's Madry AT as the attacker re-runs it: the first ``count`` samples of each step replaced by
    their PGD versions (which samples the client picked is unknown; slots are interchangeable). The PGD
    perturbation is treated as a constant of x (its own dependence on x is not differentiated)."""
    if count == 0:
        return None
    from fedvit.clients.adversarial import pgd

    attack = recipe(obs).pgd
    if attack is None:
        raise ValueError("the recipe names adversarial samples but no PGD attack")
    generator = torch.Generator().manual_seed(attacker_seed(obs))

    def adversary(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:  # [restarts, batch, ...]
        head = xb[:, :count].detach().flatten(0, 1)
        delta = pgd(model, head, yb[:, :count].argmax(-1).flatten(), attack, generator) - head
        return torch.cat([xb[:, :count] + delta.view_as(xb[:, :count]), xb[:, count:]], dim=1)

    return adversary


def initial_images(
    obs: Observation,
    model: nn.Module,
    rec: ClientRecipe,
    restart: int,
    budget: AuditConfig,
    labels: torch.Tensor | None = None,
) -> tuple[torch.Tensor, str]:
    """Restart 0 starts from APRIL-E's closed form where it applies (one image, FedSGD, position-embedding
    gradient sent); every other start is seeded noise (:func:`noise_start`; ``model``: the attack's copy, whose
    normalisation the Gaussian start inverts), or with ``audit.init = "test-split"`` test-split images of the
    recovered classes (``labels``: one per candidate; random test images where unknown)."""
    c, h, w, _ = image_geometry(obs)
    closed_form = budget.closed_form_start and rec.examples == 1 and rec.sends_gradient
    if restart == 0 and closed_form and obs.masks is None and POS_EMBED in obs.update and obs.update[POS_EMBED].any():
        closed = embedding_route(obs)
        if closed.image is not None:
            return torch.as_tensor(closed.image, dtype=torch.float32)[None], "closed-form start"
    generator = torch.Generator().manual_seed(attacker_seed(obs) * 1000 + restart)
    if budget.init == "test-split":
        return test_split_start(obs, rec.examples, h, labels, generator), "test-split start (stronger threat model)"
    return noise_start(budget.init, (rec.examples, c, h, w), model, generator), "random start"


def noise_start(init: str, shape: tuple[int, ...], model: nn.Module, generator: torch.Generator) -> torch.Tensor:
    """Random candidate pixels in [0, 1]: uniform ("noise"), or N(0, 1) on the model's normalised scale clamped to
    the pixel box ("gaussian", breaching's start: most mass near the mean, many saturated pixels)."""
    if init != "gaussian":
        return torch.rand(*shape, generator=generator)
    normalised = torch.randn(*shape, generator=generator)
    zero, one = normalize(model, torch.zeros(1, shape[-3], 1, 1)), normalize(model, torch.ones(1, shape[-3], 1, 1))
    return ((normalised - zero) / (one - zero)).clamp(0, 1)  # normalize is affine: invert it per channel


def test_split_start(
    obs: Observation, examples: int, size: int, labels: torch.Tensor | None, generator: torch.Generator
) -> torch.Tensor:
    """One test-split image per candidate, of its recovered class where known: what an attacker holding
    in-distribution data (the server's test split) starts from. Never a client's image (train split)."""
    test = obs.test_split()
    picks = []
    for k in range(examples):
        pool = np.arange(len(test))
        if labels is not None:
            same = np.flatnonzero(test.labels == int(labels[k]))
            pool = same if len(same) else pool
        picks.append(int(pool[int(torch.randint(len(pool), (1,), generator=generator))]))
    return test.batch(np.asarray(picks), size)[0].float()


def labels_for(obs: Observation, rec: ClientRecipe, num_classes: int) -> tuple[torch.Tensor, bool, str]:
    """Label logits per candidate: the recovered counts as near-one-hot rows (fixed), or learnable zeros."""
    counts, reason = recover_labels(obs)
    if counts is None or int(counts.sum()) != rec.examples:
        return torch.zeros(rec.examples, num_classes), True, f"labels learned (not recoverable: {reason or 'count'})"
    labels = np.repeat(np.arange(len(counts)), counts)
    logits = torch.full((rec.examples, num_classes), -30.0)
    logits[torch.arange(rec.examples), torch.as_tensor(labels)] = 30.0
    return logits, False, "labels from the head-bias gradient"


GROUP_EVERY = 50  # Adam steps between updates of the group consensus


def prior_weight(schedule: str, step: int, iterations: int) -> float:
    """The image priors' weight factor at ``step`` of ``iterations``: 1 ("constant"), or ½(1 + cos(π·t/T))
    ("cosine": priors strong early, gradient matching alone at the end)."""
    if schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * step / max(iterations, 1)))
    return 1.0


def group_consensus(candidates: list[torch.Tensor]) -> list[torch.Tensor]:
    """Group consistency (Yin et al. 2021, "See through gradients"): the restarts' candidate batches registered
    to restart 0's order (one-to-one assignment on pixel distance) and averaged; returned once per restart, in
    that restart's own order, as the target its regulariser pulls towards."""
    from scipy.optimize import linear_sum_assignment

    reference = candidates[0]
    orders = []
    for x in candidates:
        cost = torch.cdist(x.flatten(1), reference.flatten(1)).cpu().numpy()  # [own image, reference image]
        rows, cols = linear_sum_assignment(cost)
        order = np.empty(len(x), dtype=np.int64)
        order[cols] = rows  # order[j]: own image matched to reference image j
        orders.append(torch.as_tensor(order, device=x.device))
    mean = torch.stack([x[order] for x, order in zip(candidates, orders, strict=True)]).mean(0)
    out = []
    for order in orders:
        own = torch.empty_like(mean)
        own[order] = mean  # back to this restart's order
        out.append(own)
    return out


EPOCH_TIE = 1.0  # weight of the pull of each epoch's candidate set towards the epochs' registered mean
EPOCH_EVERY = 10  # Adam steps between registrations of the epochs' sets


def epoch_consensus(x: torch.Tensor, epochs: int) -> torch.Tensor:
    """The order-invariant prior of the FedAvg-aware attack (Dimitrov et al., "Data Leakage in Federated
    Averaging", TMLR 2022, arXiv 2206.12395): ``x`` [epochs · N, C, H, W] holds one candidate set per local epoch;
    each set is registered to epoch 0's order (one-to-one assignment on pixel distance, :func:`group_consensus`)
    and the mean of the registered sets is returned in every epoch's own order, [epochs · N, C, H, W]."""
    return torch.cat(group_consensus(list(x.view(epochs, -1, *x.shape[1:]))))


@dataclasses.dataclass(frozen=True)
class MatchProblem:
    """What the optimisation matches, model-agnostic: the attack's model copy and its parameters (the weights the
    client received), the observed update, the entries the attacker sees, the client's recipe, the label logits
    (fixed, or learned when ``learn_labels``) and one start per restart [restarts, examples, C, H, W]."""

    model: nn.Module
    params: dict[str, torch.Tensor]
    target: dict[str, torch.Tensor]
    kept: dict[str, torch.Tensor] | None
    recipe: ClientRecipe
    labels: torch.Tensor
    learn_labels: bool
    starts: torch.Tensor
    start_notes: list[str]
    adversary: Callable | None = None
    correction: dict[str, torch.Tensor] | None = None
    patch: int = 0  # the patch size for the patch-border prior (0: none)
    per_epoch: bool = False  # one candidate set per local epoch, tied by EPOCH_TIE (the FedAvg-aware attack)


def optimise(
    problem: MatchProblem, budget: AuditConfig, device: torch.device, progress: Callable[[int, int], None] | None
) -> tuple[torch.Tensor, str, float, int]:
    """Adam on the candidates until the simulated update matches the target (Inverting Gradients' loop; see the
    module docstring): returns the best candidate batch, its start's note, its gradient match and the Adam steps
    taken over all restarts."""
    model, params, target, kept, rec = problem.model, problem.params, problem.target, problem.kept, problem.recipe
    deadline = time.monotonic() + budget.max_seconds
    total = budget.iterations * budget.restarts
    best: tuple[float, torch.Tensor, str, float] | None = None  # (ranking value, images, note, gradient match)
    done = 0  # Adam steps over all restarts
    x = problem.starts.to(device).requires_grad_(True)
    labels = problem.labels.to(device)
    label_logits = labels.expand(budget.restarts, *labels.shape).clone().requires_grad_(problem.learn_labels)
    optimised = [x] + ([label_logits] if problem.learn_labels else [])
    optimizer = torch.optim.Adam(optimised, lr=budget.lr)
    milestones = [int(budget.iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=0.1)
    grouped = budget.group_weight > 0 and budget.restarts > 1
    consensus: torch.Tensor | None = None
    for step in range(budget.iterations + 1):
        if grouped and step >= budget.iterations // 2 and step % GROUP_EVERY == 0:
            consensus = torch.stack(group_consensus(list(x.detach())))
        if problem.per_epoch and step % EPOCH_EVERY == 0:
            epoch_mean = torch.stack([epoch_consensus(c, rec.epochs) for c in x.detach()])
        optimizer.zero_grad(set_to_none=True)
        sim = simulate(model, params, x, label_logits, rec, problem.adversary, problem.correction, problem.per_epoch)
        match = match_loss(sim, target, kept, budget.pos_weight)
        prior = prior_weight(budget.prior_schedule, step, budget.iterations)
        loss = match + prior * budget.tv * total_variation(x)
        if budget.patch_tv > 0 and problem.patch:
            loss = loss + prior * budget.patch_tv * patch_border_variation(x, problem.patch)
        if consensus is not None:
            loss = loss + budget.group_weight * _per_restart((x - consensus) ** 2)
        if problem.per_epoch:
            loss = loss + EPOCH_TIE * _per_restart((x - epoch_mean) ** 2)
        ranked = (match if budget.keep == "match" else loss).detach()
        winner = int(ranked.argmin())
        if best is None or float(ranked[winner]) < best[0]:  # the candidates just evaluated (before their step)
            best = (float(ranked[winner]), x[winner].detach().clone(), problem.start_notes[winner],
                    float(match[winner].detach()))  # fmt: skip
        if time.monotonic() > deadline or step == budget.iterations:
            break
        loss.sum().backward(inputs=optimised)  # the weights need no second-order gradient: skip that pass
        x.grad.sign_()
        optimizer.step()
        scheduler.step()
        with torch.no_grad():
            x.clamp_(0, 1)
        done += budget.restarts
        if progress is not None:
            progress(done, total)
    assert best is not None
    _, images, note, match_value = best
    if problem.per_epoch:  # the epochs' sets registered to epoch 0's order and averaged: one image each
        images = epoch_consensus(images, rec.epochs)[: rec.examples]
        note += f"; {rec.epochs} per-epoch image sets tied (weight {EPOCH_TIE:g}) and averaged"
    if grouped:
        note += f"; group consistency {budget.group_weight:g} over {budget.restarts} restarts"
    return images, note, match_value, done


def steps_note(budget: AuditConfig, rec: ClientRecipe, match_value: float, done: int) -> str:
    """The optimisation's closing note: the match reached and the steps it took (of those asked)."""
    total = budget.iterations * budget.restarts
    capped = " (time cap)" if done < total else ""
    return (
        f"gradient match 1−cos {match_value:.2e}; {rec.examples} image(s), {rec.steps} local step(s); "
        f"{done} of {total} Adam steps{capped}"
    )


def invert(
    obs: Observation,
    budget: AuditConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
    device: str | None = None,
    per_epoch: bool = False,
) -> Reconstruction:
    """Reconstruct the client's images from one observed update (see the module docstring).

    ``budget``: default, ``AuditConfig()`` (the audit passes a fedvit run's own ``audit.*``); ``device``: default
    "auto" (CUDA where there is one). Returns all candidates as ``Reconstruction.images``; ``progress(done,
    total)`` is called per Adam step. ``per_epoch``: the FedAvg-aware attack (:func:`fedavg_aware_invert`).
    """
    if (why := simulated(obs)) is not None:
        return Reconstruction(None, why)
    budget = budget or AuditConfig()
    if budget.init == "test-split" and obs.test_split is None:
        return Reconstruction(None, "audit.init = test-split needs a fedvit run's dataset")
    rec = recipe(obs)
    device = resolve_device(device or "auto")
    model = attack_model(obs).to(device)
    kept = kept_entries(obs)
    correction = None
    if obs.correction is not None:
        correction = {n: torch.as_tensor(c, dtype=torch.float32, device=device) for n, c in obs.correction.items()}
    labels, learn_labels, label_note = labels_for(obs, rec, obs.num_classes)  # once: restarts share them
    known = None if learn_labels else labels.argmax(1)
    sets = rec.epochs if per_epoch else 1
    if per_epoch:  # each epoch's batches hold an unknown shuffle of the labels: a seeded guess per epoch
        generator = torch.Generator().manual_seed(attacker_seed(obs))
        labels = torch.cat([labels] + [labels[torch.randperm(len(labels), generator=generator)]
                                       for _ in range(sets - 1)])  # fmt: skip
    if obs.start_seed is None and not per_epoch:  # fedvit's updates: a closed-form or seeded start per restart
        starts = [initial_images(obs, model, rec, restart, budget, known) for restart in range(budget.restarts)]
    else:  # another app's, or one set per epoch: every restart's noise from one generator
        generator = torch.Generator().manual_seed(obs.start_seed or attacker_seed(obs))
        shape = (budget.restarts, sets * rec.examples, *image_geometry(obs)[:3])
        starts = [(start, "random start") for start in noise_start(budget.init, shape, model, generator)]
    problem = MatchProblem(
        model=model,
        params={n: p.detach().requires_grad_(True) for n, p in model.named_parameters()},
        target={n: t.to(device) for n, t in observed_target(obs).items()},
        kept=None if kept is None else {n: m.to(device) for n, m in kept.items()},
        recipe=rec,
        labels=labels,
        learn_labels=learn_labels,
        starts=torch.stack([image for image, _ in starts]),
        start_notes=[f"{note}; {label_note}" for _, note in starts],
        adversary=madry_simulator(obs, model, rec.adversarial),
        correction=correction,
        patch=image_geometry(obs)[3],
        per_epoch=per_epoch,
    )
    images, note, match_value, done = optimise(problem, budget, device, progress)
    note += "; " + steps_note(budget, rec, match_value, done)
    if POS_EMBED in obs.update and (
        not obs.update[POS_EMBED].any() or (problem.kept is not None and not problem.kept[POS_EMBED].any())
    ):
        note += "; no position-embedding gradient"
    batch = images.cpu().numpy().astype(np.float64)
    return Reconstruction(batch[0], note, images=tuple(batch), steps=done)


def fedavg_aware_invert(
    obs: Observation,
    budget: AuditConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
    device: str | None = None,
) -> Reconstruction:
    """The FedAvg-aware attack (Dimitrov et al., "Data Leakage in Federated Averaging", TMLR 2022, arXiv
    2206.12395): the client's epochs simulated each on its own candidate set (the client reshuffles every epoch,
    so one set in one fixed order cannot fit every epoch), the sets tied by an order-invariant prior
    (:func:`epoch_consensus`) and averaged at the end; the labels of each epoch's batches are a seeded shuffle of
    the recovered counts."""
    return invert(obs, budget, progress, device, per_epoch=True)


def collusion_inversion(
    obs: Observation,
    budget: AuditConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
    device: str | None = None,
) -> Reconstruction:
    """Encryption, attacker with colluders: estimate the key from their images and updates
    (:func:`fedvit.attacks.april.collusion_key`), decrypt the observation, then run :func:`invert` in plaintext."""
    key = collusion_key(obs)
    if key is None:
        return Reconstruction(None, "no known images: the key cannot be estimated")
    e_a_t, inverse, note = key
    rec = invert(decrypt_observation(obs, e_a_t, inverse), budget, progress, device)
    return dataclasses.replace(rec, note=f"key from {note}; {rec.note}")
