"""The client's local training as every attack simulates it: image inversion (differentiable, unrolled in the
candidate pixels), the label-distribution estimate and the membership shadows (plain steps on auxiliary images).

Step rules of torch's ``SGD`` (dampening 0, no Nesterov), ``Adam`` and ``AdamW`` (no AMSGrad; torch's default
betas and eps) written out of place, so the same function unrolls under autograd and reproduces a client that trains
with the torch optimiser to the bit (the kernels are torch's own: ``add`` with ``alpha``, ``lerp``, ``addcmul``,
``addcdiv``; ``w - lr * v`` rounds differently in about 2% of the entries). FedProx's proximal term and SCAFFOLD's
correction enter exactly as the honest client applies them (``fedvit.clients.training.local_epochs``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

from fedvit.observed.recipe import SIMULATED_OPTIMISERS

Batch = TypeVar("Batch")
Weights = dict[str, torch.Tensor]
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # torch's defaults (no record carries them)
ADAMW_WEIGHT_DECAY = 0.01  # torch's AdamW default, where no record carries the weight decay


def gradients(loss: torch.Tensor, weights: Weights, differentiable: bool) -> Weights:
    """∂loss/∂w for every entry of ``weights`` (zeros where the loss does not use one); ``differentiable`` keeps the
    graph so the result can be differentiated again (the inversion's double backward)."""
    names = list(weights)
    grads = torch.autograd.grad(loss, [weights[n] for n in names], create_graph=differentiable, allow_unused=True)
    return {n: torch.zeros_like(weights[n]) if g is None else g for n, g in zip(names, grads, strict=True)}


def sgd_step(
    weights: Weights, grads: Weights, velocity: Weights, lr: float, momentum: float, weight_decay: float = 0.0
) -> tuple[Weights, Weights]:
    """One step of torch's SGD: g ← g + λw; v ← g at the first step, else m·v + g; w ← w − lr·v. Returns the new
    weights and velocity (the inputs are left as they are)."""
    new_weights, new_velocity = {}, {}
    for name, w in weights.items():
        g = grads[name] if weight_decay == 0 else torch.add(grads[name], w, alpha=weight_decay)
        if momentum != 0:
            g = g if name not in velocity else velocity[name] * momentum + g
            new_velocity[name] = g
        new_weights[name] = torch.add(w, g, alpha=-lr)
    return new_weights, new_velocity


@dataclasses.dataclass(frozen=True)
class AdamState:
    """Adam's moments after ``step`` steps (empty before the first)."""

    step: int = 0
    first: Weights = dataclasses.field(default_factory=dict)
    second: Weights = dataclasses.field(default_factory=dict)


def adam_step(
    weights: Weights, grads: Weights, state: AdamState, lr: float, weight_decay: float = 0.0, decoupled: bool = False
) -> tuple[Weights, AdamState]:
    """One step of torch's Adam (``decoupled``: AdamW): g ← g + λw (Adam) or w ← w(1 − lr λ) (AdamW);
    m ← β₁m + (1−β₁)g, v ← β₂v + (1−β₂)g², w ← w − lr/(1−β₁ᵗ) · m / (√v / √(1−β₂ᵗ) + ε) (Kingma & Ba, "Adam",
    arXiv 1412.6980, Algorithm 1; Loshchilov & Hutter, "Decoupled Weight Decay Regularization", arXiv 1711.05101,
    Algorithm 2)."""
    (beta1, beta2), t = ADAM_BETAS, state.step + 1
    step_size, root = lr / (1 - beta1**t), (1 - beta2**t) ** 0.5
    new_weights, first, second = {}, {}, {}
    for name, w in weights.items():
        g = grads[name]
        if weight_decay != 0 and decoupled:
            w = w * (1 - lr * weight_decay)
        elif weight_decay != 0:
            g = torch.add(g, w, alpha=weight_decay)
        m = state.first.get(name, torch.zeros_like(w)).lerp(g, 1 - beta1)
        v = torch.addcmul(state.second.get(name, torch.zeros_like(w)) * beta2, g, g, value=1 - beta2)
        first[name], second[name] = m, v
        new_weights[name] = torch.addcdiv(w, m, v.sqrt() / root + ADAM_EPS, value=-step_size)
    return new_weights, AdamState(t, first, second)


@dataclasses.dataclass(frozen=True)
class DpSgd:
    """DP-SGD's gradient (Abadi et al., "Deep Learning with Differential Privacy", CCS 2016, arXiv 1607.00133,
    Algorithm 1, as Opacus takes it): each image's gradient scaled to norm at most C (by min(1, C / (‖g‖ + 1e-6))),
    N(0, σ²C²) noise added to their sum, divided by the batch size. ``per_sample(weights, batch)``: the batch's
    per-image gradients [B, ...] by name; ``generator``: the noise's randomness."""

    noise_multiplier: float
    clipping_norm: float
    per_sample: Callable[[Weights, Any], Weights]
    generator: torch.Generator

    def gradients(self, weights: Weights, batch: Any) -> Weights:
        per = self.per_sample(weights, batch)
        size = len(next(iter(per.values())))
        norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in per.values()))
        factor = (self.clipping_norm / (norms + 1e-6)).clamp(max=1.0)
        out = {}
        for name, g in per.items():
            summed = torch.einsum("b,b...->...", factor, g)
            noise = torch.randn(summed.shape, generator=self.generator) * (self.noise_multiplier * self.clipping_norm)
            out[name] = (summed + noise) / size
        return out


def optimiser_step(optimiser: str, momentum: float, weight_decay: float) -> Callable:
    """``step(weights, grads, state, lr) -> (weights, state)`` of the named optimiser (state: None at the start)."""
    if optimiser == "sgd":
        return lambda w, g, state, lr: sgd_step(w, g, state or {}, lr, momentum, weight_decay)
    if optimiser in ("adam", "adamw"):
        return lambda w, g, state, lr: adam_step(w, g, state or AdamState(), lr, weight_decay, optimiser == "adamw")
    raise ValueError(f"optimiser {optimiser!r} is not simulated (one of {', '.join(SIMULATED_OPTIMISERS)})")


def local_sgd(
    params: Weights,
    batch_loss: Callable[[Weights, Batch], torch.Tensor],
    batches: Iterable[Batch],
    lr: float,
    momentum: float,
    *,
    weight_decay: float = 0.0,
    proximal_mu: float = 0.0,
    correction: Weights | None = None,
    differentiable: bool = False,
    optimiser: str = "sgd",
    dp_sgd: DpSgd | None = None,
) -> Weights:
    """The weights after one optimiser step per batch from ``params`` (``optimiser``: ``sgd``, ``adam``, ``adamw``;
    ``momentum`` is SGD's): ``batch_loss(weights, batch)`` is the step's loss (a scalar); FedProx adds
    μ/2 · ‖w − w_received‖² (``proximal_mu``), SCAFFOLD adds ``correction`` (c − c_i) to every gradient
    (Karimireddy et al., 2020, Algorithm 1, line 10). ``differentiable``: the steps stay on the autograd graph (the
    result is differentiable in whatever the losses depend on); otherwise each step's weights are detached leaves,
    as in an optimiser. ``dp_sgd``: each step's gradient is DP-SGD's (:class:`DpSgd`; ``batch_loss`` still runs
    first, for what it records)."""
    if dp_sgd is not None and (differentiable or proximal_mu > 0 or correction is not None):
        raise ValueError("DP-SGD is simulated without FedProx, SCAFFOLD or unrolling")
    step = optimiser_step(optimiser, momentum, weight_decay)
    anchor = params if differentiable else {n: p.detach() for n, p in params.items()}
    weights = dict(anchor) if differentiable else {n: p.clone().requires_grad_(True) for n, p in anchor.items()}
    state = None
    for batch in batches:
        if dp_sgd is not None:
            batch_loss(weights, batch)  # for what the caller records on the way; the step's gradient is DP-SGD's
            grads = dp_sgd.gradients({n: w.detach() for n, w in weights.items()}, batch)
        else:
            loss = batch_loss(weights, batch)
            if proximal_mu > 0:
                loss = loss + proximal_mu / 2 * sum(((weights[n] - anchor[n]) ** 2).sum() for n in weights)
            grads = gradients(loss, weights, differentiable)
            if correction is not None:
                grads = {n: g + correction[n] for n, g in grads.items()}
        if differentiable:
            weights, state = step(weights, grads, state, lr)
            continue
        with torch.no_grad():
            weights, state = step(weights, grads, state, lr)
        weights = {n: w.requires_grad_(True) for n, w in weights.items()}
    return weights
