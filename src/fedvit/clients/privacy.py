"""Differential privacy of one client update through Flower's own client mods (``dp.mode``).

"central": Flower's ``fixedclipping_mod`` clips the update to the norm C that the server's
``DifferentialPrivacyClientSideFixedClipping`` wrapper sends (``fedvit.strategies.privacy``), which then noises the
aggregate. "local": Flower's ``LocalDpMod`` clips to C and adds Gaussian noise itself before the reply leaves.
Both mods read the reply as new weights next to the received ones; a FedSGD reply is a gradient, so
:func:`dp_mod` shows them the model that gradient moves to, w − lr·g (float64: lr·g is small next to w), and turns
their result back into a gradient. The wire then carries exactly what Flower's mod produced.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp.mod import LocalDpMod, fixedclipping_mod
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM, get_norm
from flwr.supercore.task_identity import TaskIdentity

from fedvit.core.config import SERVER_LR_STRATEGIES, Config, ConfigError, DPConfig, parse_config_cached

Handler = Callable[[Message, Context], Message]
Mod = Callable[[Message, Context, Handler], Message]


def local_epsilon(dp: DPConfig) -> float:
    """ε of one release of the Gaussian mechanism with std σ·C at ``dp.delta`` (σ = √(2 ln(1.25/δ)) / ε, Dwork &
    Roth 2014, Thm. A.1; their bound is stated for ε < 1, larger values are only indicative)."""
    if dp.noise_multiplier == 0:
        return math.inf
    return math.sqrt(2 * math.log(1.25 / dp.delta)) / dp.noise_multiplier


def flower_dp_mod(dp: DPConfig) -> Mod:
    """Flower's mod for ``dp.mode``. ``LocalDpMod`` draws std sensitivity·√(2 ln(1.25/δ))/ε; with sensitivity C and
    ε = :func:`local_epsilon` that is σ·C."""
    if dp.mode == "central":
        return fixedclipping_mod
    if dp.mode == "local":
        return LocalDpMod(dp.clipping_norm, dp.clipping_norm, local_epsilon(dp), dp.delta)
    raise ValueError(f"no DP mod for dp.mode={dp.mode!r}")


def local_noise_std(mod: LocalDpMod) -> float:
    """The std of the noise ``LocalDpMod`` adds, from its own settings."""
    return local_dp_noise_std(mod.sensitivity, mod.epsilon, mod.delta)


def local_dp_noise_std(sensitivity: float, epsilon: float, delta: float) -> float:
    """``LocalDpMod``'s Gaussian std, sensitivity·√(2 ln(1.25/δ))/ε (the Gaussian mechanism, Dwork & Roth 2014,
    Thm. A.1), as Flower computes it."""
    return sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def dp_mod(msg: Message, context: Context, call_next: Handler) -> Message:
    """ClientApp mod: train replies pass through Flower's DP mod when ``dp.mode`` is on; everything else is
    untouched."""
    if msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, context)
    try:
        config = parse_config_cached(context.run_config)
    except ConfigError:
        return call_next(msg, context)  # the handler reports the config error
    if not config.dp.enabled:
        return call_next(msg, context)
    return privatize(config, msg, context, call_next)


def privatize(config: Config, msg: Message, context: Context, call_next: Handler) -> Message:
    """The reply of ``call_next`` after Flower's DP mod, with the DP metrics added to its 'metrics'.

    Records: 'arrays' (the update) and 'metrics'; the metrics gain ``dp-update-norm`` (before clipping),
    ``dp-clipped`` and, in local mode, ``dp-noise-std``.
    """
    sends_gradient = config.strategy in SERVER_LR_STRATEGIES
    lr = float(msg.content["config"].get("lr", config.lr))
    received = {name: a.numpy().astype(np.float64) for name, a in msg.content["arrays"].items()}
    seen: dict[str, float] = {}

    def as_model(inner_msg: Message, inner_context: Context) -> Message:
        reply = call_next(inner_msg, inner_context)
        if reply.has_error():
            return reply
        update = {name: a.numpy().astype(np.float64) for name, a in reply.content["arrays"].items()}
        if sends_gradient:  # the model the server reaches with this gradient alone
            model = {name: received[name] - lr * g for name, g in update.items()}
        else:
            model = update
        seen["norm"] = get_norm([model[name] - received[name] for name in model])
        reply.content["arrays"] = _record(model)
        return reply

    mod = flower_dp_mod(config.dp)
    out = mod(msg, context, as_model)
    if out.has_error():
        return out
    model = {name: a.numpy() for name, a in out.content["arrays"].items()}
    if sends_gradient:
        model = {name: (received[name] - w) / lr for name, w in model.items()}
    out.content["arrays"] = _record({name: w.astype(np.float32) for name, w in model.items()})
    metrics = out.content["metrics"]
    metrics["dp-update-norm"] = seen["norm"]
    metrics["dp-clipped"] = float(seen["norm"] > config.dp.clipping_norm)
    if isinstance(mod, LocalDpMod):
        metrics["dp-noise-std"] = local_noise_std(mod)
    return out


def privatize_offline(
    config: Config,
    received: dict[str, np.ndarray],
    records: dict[str, dict[str, np.ndarray]],
    metrics: dict[str, float | int],
    lr: float,
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, float | int]]:
    """:func:`privatize` for a reply computed outside a Flower run (``runner.train`` called directly, as the
    audit benchmark does): the same train message and reply, built with Flower's classes, through the same mod."""
    config_record = ConfigRecord({"server-round": 1, "lr": lr})
    if config.dp.mode == "central":
        config_record[KEY_CLIPPING_NORM] = config.dp.clipping_norm  # what the server's DP wrapper would send
    with _task_identity():
        msg = Message(
            RecordDict({"arrays": _record(received), "config": config_record}),
            dst_node_id=1,
            message_type=MessageType.TRAIN,
        )

        def handler(m: Message, _context: Context) -> Message:
            content = RecordDict({name: _record(arrays) for name, arrays in records.items()})
            content["metrics"] = MetricRecord(dict(metrics))
            return Message(content, reply_to=m)

        context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
        out = privatize(config, msg, context, handler)
    if out.has_error():
        raise RuntimeError(f"Flower's DP mod refused the update: {out.error.reason}")
    arrays = {name: {k: a.numpy() for k, a in rec.items()} for name, rec in out.content.array_records.items()}
    return arrays, dict(out.content["metrics"])


@contextmanager
def _task_identity() -> Iterator[None]:
    """Flower's Message needs a task identity; outside a Flower run there is none, so lend one meanwhile."""
    try:
        TaskIdentity.run_id  # noqa: B018 - raises when unset
        lent = False
    except RuntimeError:
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        lent = True
    try:
        yield
    finally:
        if lent:
            TaskIdentity.run_id = TaskIdentity.node_id = TaskIdentity.task_id = None


def _record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({name: Array(np.ascontiguousarray(a)) for name, a in arrays.items()})
