"""The client side of SecAgg+: Flower's ``secaggplus_mod`` around fedvit's Message-API train handler.

Flower 1.41/1.42 offer SecAgg+ only through the legacy API: the server's ``SecAggPlusWorkflow`` sends four train
messages per round, and at the third ``secaggplus_mod`` calls the app with a legacy ``fitins`` and masks the
``fitres`` it returns. :func:`secagg_mod` runs Flower's mod on the messages that carry SecAgg+'s records and, inside
it, :func:`legacy_train` turns the ``fitins`` into the train message fedvit's handler (and its DP mod) takes, and
the reply back into a ``fitres``. Every other message passes untouched.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE
from flwr.compat.common import recorddict_compat as compat

from fedvit.core.secagg import ARRAY_NAMES, CLIPPED_METRIC

Handler = Callable[[Message, Context], Message]


def secagg_mod(msg: Message, context: Context, call_next: Handler) -> Message:
    """ClientApp mod: a train message of the SecAgg+ protocol goes through Flower's ``secaggplus_mod``, with the
    app behind :func:`legacy_train`; any other message goes straight to ``call_next``."""
    if msg.metadata.message_type != MessageType.TRAIN or RECORD_KEY_CONFIGS not in msg.content.config_records:
        return call_next(msg, context)
    return secaggplus_mod(msg, context, lambda m, c: legacy_train(m, c, call_next))


def legacy_train(msg: Message, context: Context, call_next: Handler) -> Message:
    """The legacy ``fitins`` as fedvit's train message ('arrays' by the names the server sent, 'config'), through
    ``call_next``, and its reply as a legacy ``fitres`` (the arrays in the same order, num-examples, metrics)."""
    fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    config = dict(fitins.config)
    names = json.loads(str(config.pop(ARRAY_NAMES, "null")))
    arrays = parameters_to_ndarrays(fitins.parameters)
    if not isinstance(names, list) or len(names) != len(arrays):
        raise ValueError(f"a SecAgg+ train instruction must name its {len(arrays)} arrays in '{ARRAY_NAMES}' "
                         "(a JSON list)")
    msg.content = RecordDict({
        "arrays": ArrayRecord({name: Array(a) for name, a in zip(names, arrays, strict=True)}),
        "config": ConfigRecord(config),
    })  # fmt: skip
    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    metrics = dict(reply.content["metrics"])
    update = [reply.content["arrays"][name].numpy() for name in names]
    metrics[CLIPPED_METRIC] = clipped_entries(update, int(metrics["num-examples"]), context)
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(update), int(metrics["num-examples"]), metrics)
    reply.content = compat.fitres_to_recorddict(fitres, keep_input=False)
    return reply


def clipped_entries(update: list[np.ndarray], num_examples: int, context: Context) -> int:
    """How many entries SecAgg+ will clip: it scales the model by num-examples / max-weight, then clips it to
    [-clipping-range, clipping-range] before quantising (the settings from its setup stage, in the node's state)."""
    state = context.state.config_records[RECORD_KEY_STATE]
    ratio = num_examples / float(state["max_weight"])
    bound = float(state["clipping_range"])
    return int(sum(np.count_nonzero(np.abs(a.astype(np.float64) * ratio) > bound) for a in update))
