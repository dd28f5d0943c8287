"""The client's local SGD as every attack simulates it: image inversion (differentiable, unrolled in the
candidate pixels), the label-distribution estimate and the membership shadows (plain steps on auxiliary images).

One step rule, torch's ``SGD`` (dampening 0, no Nesterov) written out of place, so the same function unrolls under
autograd and reproduces a client that trains with ``torch.optim.SGD`` to the bit (``torch.add`` with ``alpha`` is
the kernel torch's optimiser uses; ``w - lr * v`` rounds differently in about 2% of the entries). FedProx's
proximal term and SCAFFOLD's correction enter exactly as the honest client applies them
(``fedvit.clients.training.local_epochs``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import torch

Batch = TypeVar("Batch")
Weights = dict[str, torch.Tensor]


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
) -> Weights:
    """The weights after one SGD step per batch from ``params``: ``batch_loss(weights, batch)`` is the step's loss
    (a scalar); FedProx adds μ/2 · ‖w − w_received‖² (``proximal_mu``), SCAFFOLD adds ``correction`` (c − c_i) to
    every gradient (Karimireddy et al., 2020, Algorithm 1, line 10). ``differentiable``: the steps stay on the
    autograd graph (the result is differentiable in whatever the losses depend on); otherwise each step's weights
    are detached leaves, as in an optimiser."""
    anchor = params if differentiable else {n: p.detach() for n, p in params.items()}
    weights = dict(anchor) if differentiable else {n: p.clone().requires_grad_(True) for n, p in anchor.items()}
    velocity: Weights = {}
    for batch in batches:
        loss = batch_loss(weights, batch)
        if proximal_mu > 0:
            loss = loss + proximal_mu / 2 * sum(((weights[n] - anchor[n]) ** 2).sum() for n in weights)
        grads = gradients(loss, weights, differentiable)
        if correction is not None:
            grads = {n: g + correction[n] for n, g in grads.items()}
        if differentiable:
            weights, velocity = sgd_step(weights, grads, velocity, lr, momentum, weight_decay)
            continue
        with torch.no_grad():
            weights, velocity = sgd_step(weights, grads, velocity, lr, momentum, weight_decay)
        weights = {n: w.requires_grad_(True) for n, w in weights.items()}
    return weights
