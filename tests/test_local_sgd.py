"""The attacks' one simulation of local SGD against the honest client's own training loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedvit.attacks.local_sgd import local_sgd
from fedvit.clients.training import local_epochs
from fedvit.core.config import DataConfig, ModelConfig
from fedvit.core.data import load_dataset
from fedvit.core.model import build_model, normalize

SIZE, EPOCHS, BATCH, LR, MOMENTUM = 80, 2, 32, 0.1, 0.9


@pytest.mark.parametrize("variant", ["fedavg", "fedprox", "scaffold"])
def test_the_simulation_reproduces_the_clients_torch_sgd_to_the_bit(variant):
    """Same batches, same start: the client's ``torch.optim.SGD`` (momentum, FedProx's term, SCAFFOLD's correction)
    and ``local_sgd`` end on bit-identical weights, whether or not the steps stay differentiable."""
    images = load_dataset(DataConfig(synthetic_train_size=SIZE), 0, "train")
    model = build_model(ModelConfig(), images.num_classes, seed=0)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    mu = 0.5 if variant == "fedprox" else 0.0
    generator = torch.Generator().manual_seed(1)
    correction = {n: 1e-3 * torch.randn(p.shape, generator=generator) for n, p in start.items()}
    correction = correction if variant == "scaffold" else None
    client = local_epochs(
        model, images, np.arange(SIZE), epochs=EPOCHS, batch_size=BATCH, lr=LR, momentum=MOMENTUM, img_size=32,
        rng=np.random.default_rng(0), device=torch.device("cpu"), proximal_mu=mu,
        correction=None if correction is None else {n: c.numpy() for n, c in correction.items()},
    ).arrays  # fmt: skip

    rng = np.random.default_rng(0)  # the client's order: one permutation per epoch
    orders = [rng.permutation(SIZE) for _ in range(EPOCHS)]
    batches = [images.batch(order[first : first + BATCH], 32) for order in orders for first in range(0, SIZE, BATCH)]

    def batch_loss(weights: dict[str, torch.Tensor], batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(functional_call(model, weights, (normalize(model, x),)), y)

    for differentiable in (False, True):
        params = {n: t.clone().requires_grad_(True) for n, t in start.items()}
        end = local_sgd(params, batch_loss, batches, LR, MOMENTUM, proximal_mu=mu, correction=correction,
                        differentiable=differentiable)  # fmt: skip
        assert set(end) == set(client)
        moved = [n for n in client if not np.array_equal(client[n], start[n].numpy())]
        assert len(moved) == len(client)  # every parameter trained, so equality below is not trivial
        unequal = [n for n in client if not np.array_equal(end[n].detach().numpy(), client[n])]
        assert not unequal, f"{variant} (differentiable={differentiable}): {unequal[:3]}"
        assert all(w.grad_fn is not None for w in end.values()) == differentiable


def test_the_differentiable_steps_carry_the_gradient_through_every_step():
    """The unrolled update is differentiable in what the losses depend on (here a scale on the inputs)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    x, y = torch.randn(8, 4), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    scale = torch.tensor(1.0, requires_grad=True)

    def batch_loss(weights: dict[str, torch.Tensor], chunk: slice) -> torch.Tensor:
        return F.cross_entropy(functional_call(layer, weights, (scale * x[chunk],)), y[chunk])

    def moved(s: float) -> float:
        with torch.no_grad():
            scale.fill_(s)
        params = {n: p.detach().requires_grad_(True) for n, p in layer.named_parameters()}
        end = local_sgd(params, batch_loss, [slice(0, 4), slice(4, 8)] * 2, 0.5, 0.9, differentiable=True)
        return sum(((end[n] - params[n]) ** 2).sum() for n in end)

    value = moved(1.0)
    (analytic,) = torch.autograd.grad(value, scale)
    numeric = (moved(1.0 + 1e-3).item() - moved(1.0 - 1e-3).item()) / 2e-3
    assert analytic.item() == pytest.approx(numeric, rel=1e-2) and abs(numeric) > 1e-4


@pytest.mark.parametrize(("name", "weight_decay"), [("adam", 0.0), ("adam", 1e-3), ("adamw", 0.01)])
def test_the_simulation_reproduces_torch_adam_and_adamw_to_the_bit(name, weight_decay):
    """Same batches, same start: ``torch.optim.Adam``/``AdamW`` and ``local_sgd(optimiser=...)`` end on
    bit-identical weights, whether or not the steps stay differentiable."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 6, generator=generator), torch.randint(0, 3, (4,), generator=generator))
               for _ in range(7)]  # fmt: skip
    kind = torch.optim.Adam if name == "adam" else torch.optim.AdamW
    optimiser = kind(model.parameters(), lr=0.01, weight_decay=weight_decay)
    for x, y in batches:
        optimiser.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimiser.step()

    def batch_loss(weights: dict[str, torch.Tensor], batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, weights, (batch[0],)), batch[1])

    for differentiable in (False, True):
        params = {n: t.clone().requires_grad_(True) for n, t in start.items()}
        end = local_sgd(params, batch_loss, batches, 0.01, 0.0, weight_decay=weight_decay, optimiser=name,
                        differentiable=differentiable)  # fmt: skip
        for n, p in model.named_parameters():
            assert not torch.equal(p.detach(), start[n])
            assert torch.equal(end[n].detach(), p.detach()), f"{name} (differentiable={differentiable}): {n}"
    with pytest.raises(ValueError, match="optimiser 'rmsprop' is not simulated"):
        local_sgd(start, batch_loss, batches, 0.01, 0.0, optimiser="rmsprop")


def test_dp_sgd_clips_each_images_gradient_and_adds_noise_of_sigma_c():
    """DP-SGD's step (Abadi et al., Algorithm 1): without noise and with a bound no gradient reaches, plain SGD's;
    with a small bound, the mean of the per-image gradients each clipped to it (computed here image by image);
    with noise, each entry moves by lr·σC/B times a standard normal more."""
    from torch.func import grad, vmap

    from fedvit.attacks.local_sgd import DpSgd

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 40), torch.nn.ReLU(), torch.nn.Linear(40, 3))
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))

    def batch_loss(weights, batch):
        return F.cross_entropy(functional_call(model, weights, (batch[0],)), batch[1])

    def per_sample(weights, batch):
        one = lambda w, xi, yi: F.cross_entropy(functional_call(model, w, (xi[None],)), yi[None])  # noqa: E731
        return vmap(grad(one), in_dims=(None, 0, 0))(weights, *batch)

    def step(sigma: float, bound: float, seed: int = 0) -> dict[str, torch.Tensor]:
        dp = DpSgd(sigma, bound, per_sample, torch.Generator().manual_seed(seed))
        return local_sgd(start, batch_loss, [(x, y)], 0.1, 0.0, dp_sgd=dp)

    plain = local_sgd(start, batch_loss, [(x, y)], 0.1, 0.0)
    for name, w in step(0.0, 1e6).items():
        torch.testing.assert_close(w, plain[name], rtol=0, atol=1e-6)
    bound = 0.05
    clipped = {n: torch.zeros_like(p) for n, p in start.items()}
    for i in range(len(y)):
        weights = {n: p.clone().requires_grad_(True) for n, p in start.items()}
        grads = torch.autograd.grad(batch_loss(weights, (x[i : i + 1], y[i : i + 1])), list(weights.values()))
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        assert norm > bound  # every image's gradient is clipped, so the test is not trivial
        for n, g in zip(weights, grads, strict=True):
            clipped[n] += g * (bound / (norm + 1e-6)) / len(y)
    without_noise = step(0.0, bound)
    for name, w in without_noise.items():
        torch.testing.assert_close(w, start[name] - 0.1 * clipped[name], rtol=0, atol=1e-6)
    noised = step(2.0, bound, seed=3)
    moved = torch.cat([(noised[n] - without_noise[n]).detach().flatten() for n in start]) / (0.1 * 2.0 * bound / 8)
    assert abs(float(moved.std()) - 1) < 0.1 and abs(float(moved.mean())) < 0.1
    with pytest.raises(ValueError, match="DP-SGD is simulated without FedProx"):
        local_sgd(start, batch_loss, [(x, y)], 0.1, 0.0, proximal_mu=0.1,
                  dp_sgd=DpSgd(1.0, 1.0, per_sample, torch.Generator()))  # fmt: skip
