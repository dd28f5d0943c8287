"""cnnapp: the model, the offline data and the training loop."""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NUM_CLASSES = 10
MOMENTUM = 0.9  # the app's own choice, on no record the server or the wire sees


class Net(nn.Module):
    """The CNN of Flower's PyTorch quickstart (LeNet-style, 32x32 RGB input)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)  # as Flower's quickstart writes it: needs contiguous memory
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


MEAN, STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)  # the Normalize of Flower's quickstart


def draw_labels(rng: np.random.Generator, count: int, alpha: float) -> np.ndarray:
    """Classes uniform, or (``alpha`` > 0) drawn from class shares ~ Dirichlet(alpha), a non-IID client."""
    shares = rng.dirichlet([alpha] * NUM_CLASSES) if alpha > 0 else np.full(NUM_CLASSES, 1 / NUM_CLASSES)
    return rng.choice(NUM_CLASSES, count, p=shares) if alpha > 0 else rng.integers(0, NUM_CLASSES, count)


def class_colours(labels: np.ndarray) -> np.ndarray:
    """[n, 3, 1, 1]: each class's hue as a colour direction (cosines 120 degrees apart, in [-1, 1])."""
    hue = 2 * np.pi * labels / NUM_CLASSES
    return np.stack([np.cos(hue + 2 * np.pi * c / 3) for c in range(3)], 1)[:, :, None, None]


def make_images(count: int, seed: int, alpha: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """``count`` offline images in [0, 1] (smooth colour blobs; the class shifts the hue) and their labels
    (:func:`draw_labels`)."""
    rng = np.random.default_rng(seed)
    labels = draw_labels(rng, count, alpha)
    yy, xx = np.mgrid[0:32, 0:32] / 31.0
    images = np.empty((count, 3, 32, 32), np.float32)
    for i, label in enumerate(labels):
        cx, cy, r = rng.uniform(0.2, 0.8, 3)
        blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (0.05 + 0.1 * r))
        colour = class_colours(np.array([label]))[0]
        images[i] = 0.5 + 0.4 * colour * blob + 0.05 * rng.standard_normal((3, 32, 32))
    return np.clip(images, 0, 1), labels


def make_textures(count: int, seed: int, alpha: float = 0.0, cast: float = 0.03) -> tuple[np.ndarray, np.ndarray]:
    """``count`` photograph-like offline images in [0, 1] and their labels (:func:`draw_labels`): colour textures
    with the 1/f amplitude spectrum of natural photographs (pixel std 0.15), the class only a faint colour cast
    (``cast``). Unlike :func:`make_images`, a CNN fits the images it trains on long before it generalises to others
    of their class: the memorisation that membership inference looks for."""
    rng = np.random.default_rng(seed)
    labels = draw_labels(rng, count, alpha)
    fy, fx = np.meshgrid(np.fft.fftfreq(32), np.fft.fftfreq(32), indexing="ij")
    frequency = np.hypot(fx, fy)
    amplitude = np.divide(1.0, frequency, out=np.zeros_like(frequency), where=frequency > 0)  # no DC term
    spectrum = rng.standard_normal((count, 3, 32, 32)) + 1j * rng.standard_normal((count, 3, 32, 32))
    texture = np.fft.ifft2(amplitude * spectrum).real
    texture /= texture.std(axis=(1, 2, 3), keepdims=True)
    return np.clip(0.5 + 0.15 * texture + cast * class_colours(labels), 0, 1).astype(np.float32), labels


def partition_size(sizes: str, partition_id: int) -> int:
    """Images held by partition ``partition_id`` (the run config's comma-separated ``partition-sizes``)."""
    values = [int(s) for s in sizes.split(",")]
    return values[partition_id % len(values)]


def load_data(
    partition_id: int, size: int, seed: int, alpha: float = 0.0, images: str = "blobs"
) -> tuple[np.ndarray, np.ndarray]:
    """A client's own images and labels (raw pixels in [0, 1]); ``alpha`` > 0: Dirichlet(alpha) class shares;
    ``images``: "blobs" (:func:`make_images`) or "textures" (photograph-like: :func:`make_textures`)."""
    makers = {"blobs": make_images, "textures": make_textures}
    if images not in makers:
        raise ValueError(f"images must be one of {sorted(makers)}, not {images!r}")
    return makers[images](size, seed * 1000 + partition_id, alpha)


def normalize(x: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    return (x - mean) / std


def train(net: Net, images: np.ndarray, labels: np.ndarray, epochs: int, lr: float, batch_size: int, seed: int):
    """SGD with momentum (:data:`MOMENTUM`) on mean cross-entropy; returns the mean training loss."""
    torch.manual_seed(seed)
    data = TensorDataset(normalize(torch.as_tensor(images)), torch.as_tensor(labels))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=MOMENTUM)
    net.train()
    losses = []
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return float(np.mean(losses))


def test(net: Net, images: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    net.eval()
    with torch.no_grad():
        logits = net(normalize(torch.as_tensor(images)))
        loss = F.cross_entropy(logits, torch.as_tensor(labels)).item()
        accuracy = (logits.argmax(1).numpy() == labels).mean()
    return float(loss), float(accuracy)


def make_canaries(partition_id: int, count: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``count`` canaries for a partition: uniform-noise images (out of distribution) with random labels, each
    included in the client's training with probability 1/2 (Steinke, Nasr and Jagielski, arXiv 2305.08846);
    returns (images, labels, included)."""
    rng = np.random.default_rng([seed, partition_id, 424242])
    images = rng.random((count, 3, 32, 32)).astype(np.float32)
    return images, rng.integers(0, NUM_CLASSES, count), rng.random(count) < 0.5


def train_dp(net: Net, images: np.ndarray, labels: np.ndarray, steps: int, lr: float, clip: float,
             noise_multiplier: float, seed: int) -> float:  # fmt: skip
    """DP-GD (Abadi et al., 2016, full batch): per step each image's gradient clipped to norm ``clip``, summed,
    Gaussian noise of std ``noise_multiplier * clip`` added, divided by the batch, one SGD step; returns the mean
    loss."""
    from torch.func import functional_call, grad, vmap

    generator = torch.Generator().manual_seed(seed)
    x, y = normalize(torch.as_tensor(images)), torch.as_tensor(labels)
    params = {n: p.detach() for n, p in net.named_parameters()}

    def loss_of(weights, image, label):
        return F.cross_entropy(functional_call(net, weights, (image[None],)), label[None])

    per_image = vmap(grad(loss_of), in_dims=(None, 0, 0))
    losses = []
    for _ in range(steps):
        grads = per_image(params, x, y)
        norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads.values()))
        scale = (clip / (norms + 1e-12)).clamp(max=1.0)
        for n, p in params.items():
            summed = (grads[n] * scale.view(-1, *[1] * (grads[n].dim() - 1))).sum(0)
            noise = torch.randn(p.shape, generator=generator) * noise_multiplier * clip
            params[n] = p - lr * (summed + noise) / len(y)
        with torch.no_grad():
            losses.append(F.cross_entropy(functional_call(net, params, (x,)), y).item())
    net.load_state_dict(params, strict=False)
    return float(np.mean(losses))


def gdp_epsilon(steps: int, noise_multiplier: float, delta: float) -> float:
    """The app's accountant for DP-GD without subsampling: each step is a Gaussian mechanism of sensitivity 1 in
    units of the clipping norm, so T steps are μ-GDP with μ = √T / σ (Dong, Roth and Su, arXiv 1905.02383), and
    (ε, δ)-DP for the ε solving δ = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    mu = np.sqrt(steps) / noise_multiplier
    gap = lambda eps: norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * norm.cdf(-eps / mu - mu / 2) - delta  # noqa: E731
    return float(brentq(gap, 0.0, 500.0))
