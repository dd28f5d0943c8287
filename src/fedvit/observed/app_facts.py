"""What ``fedvit audit-app`` needs to know of a Flower app, read from its code (:mod:`ast`, never executed here):
the model the ClientApp trains (the class or factory it builds and its arguments), the normalisation of its
transforms, and the call through which a client loads its partition. Each fact carries its source (``task.py:41``)
the way the recipe's values do (:class:`fedvit.observed.app_code.Value`); a fact the code does not fix statically
is unread, with why and the flag that supplies it, never a guess.

The auditor's side then calls the app's loader (:mod:`fedvit.audit.app_loader`); the attacker's side never does.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
from typing import Any

from fedvit.observed.app_code import (
    App,
    Module,
    Unread,
    Value,
    _called_name,
    _module_name,
    _walk,
    read_value,
)

PARTITION_KEY = "partition-id"  # the node config key Flower's simulation sets for each SuperNode
PARTITIONS_KEY = "num-partitions"
FACT_ERRORS = (Unread, ArithmeticError, TypeError, ValueError, RecursionError)


class ContextArgument:
    """Stands for the handler's Context in a loader call's arguments: the caller builds one per partition."""

    def __repr__(self) -> str:
        return "context"


CONTEXT = ContextArgument()


@dataclasses.dataclass(frozen=True)
class ModelFact:
    """The model the ClientApp trains: ``factory`` ("pkg.task:Net") and its keyword arguments, each a Value."""

    factory: Value
    args: dict[str, Value] = dataclasses.field(default_factory=dict)

    @property
    def read(self) -> bool:
        return self.factory.read and all(v.read for v in self.args.values())

    def unread_reason(self) -> str:
        bad = [f"{k}: {v.how}" for k, v in self.args.items() if not v.read]
        return self.factory.how if not self.factory.read else "; ".join(bad)


@dataclasses.dataclass(frozen=True)
class LoaderCall:
    """The call through which a client loads its data: ``function`` ("pkg.task:load_data"), where it is called
    (``source``) and its arguments as expressions of the call site, resolved per partition by :meth:`arguments`."""

    function: str
    source: str
    app: App = dataclasses.field(repr=False, compare=False)
    module: Module = dataclasses.field(repr=False, compare=False)
    call: ast.Call = dataclasses.field(repr=False, compare=False)
    context_params: tuple[int, ...] = ()  # positions that take the handler's Context (built by the caller)

    def arguments(self, partition: int, partitions: int, run_config: dict[str, Any]) -> tuple[list[Any], dict]:
        """The call's arguments for ``partition`` of ``partitions`` (a Context argument: :data:`CONTEXT`, for the
        caller to build); Unread where one is not fixed statically."""
        records = {"node config": {PARTITION_KEY: partition, PARTITIONS_KEY: partitions}, "run config": run_config}
        args = [CONTEXT if i in self.context_params else self._value(a, records) for i, a in
                enumerate(self.call.args)]  # fmt: skip
        keywords = {k.arg: self._value(k.value, records) for k in self.call.keywords if k.arg}
        return args, keywords

    def _value(self, expr: ast.expr, records: dict[str, dict]) -> Any:
        found = read_value(self.app, self.module, self.call, expr, records)
        if not found.read:
            raise Unread(f"argument `{ast.unparse(expr)}` of {self.function} ({self.source}): {found.how}")
        return found.value


def library_constant(module: Module, name: str) -> Any:
    """A constant a library defines (``IMAGENET_DEFAULT_MEAN`` imported from ``timm.data``): its value, read by
    importing the library (never the app); Unread where the name is not a library's."""
    origin = module.imports.get(name, "")
    owner, _, attr = origin.rpartition(".")
    if not owner or owner.split(".")[0] == _module_name(module.path).split(".")[0]:  # the app's own module
        raise Unread(f"`{name}` is not bound where the code could read it")
    try:
        return getattr(importlib.import_module(owner), attr)
    except (ImportError, AttributeError) as err:
        raise Unread(f"`{name}` ({origin}) could not be looked up: {err}") from None


def _resolved(app: App, module: Module, expr: ast.expr, records: dict[str, dict]) -> tuple[Any, str]:
    """``expr``'s value: as :meth:`App.resolve` reads it, else a library constant's (tuples element-wise)."""
    try:
        return app.resolve(module, expr, records)
    except Unread:
        if isinstance(expr, ast.Name):
            return library_constant(module, expr.id), f"{expr.id} ({module.imports.get(expr.id)})"
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            owner = module.imports.get(expr.value.id, "")
            try:
                return getattr(importlib.import_module(owner), expr.attr), f"{owner}.{expr.attr}"
            except (ImportError, AttributeError, ValueError):
                pass
        raise


# ---------------------------------------------------------------------------- the model


def model_expressions(app: App, reached: list[tuple[Module, ast.AST]]) -> list[tuple[Module, ast.expr]]:
    """What the training code loads the server's weights into: the receiver of each ``.load_state_dict(...)``."""
    found = []
    for module, node in _walk(reached):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load_state_dict":
            receiver = node.func.value  # ``model.heads.load_state_dict``: the model is ``model``
            while isinstance(receiver, ast.Attribute) and not (isinstance(receiver.value, ast.Name) and
                                                               receiver.value.id == "self"):  # fmt: skip
                receiver = receiver.value
            found.append((module, receiver))
    return found


def read_model(app: App, run_config: dict[str, Any]) -> ModelFact:
    """The model the ClientApp trains, followed from ``model.load_state_dict(...)`` to the call that builds it
    (through local names, parameters and ``self.net = net``); refused, with why, where that call is not a
    module-level class or function called with arguments the code fixes."""
    handlers = app.train_handlers()
    where = app.where
    if not handlers:
        return ModelFact(Value(None, where, "no @app.train() handler and no fit method found"))
    records = {"run config": run_config}
    reasons: list[str] = []
    built: dict[str, ModelFact] = {}
    for module, expr in model_expressions(app, app.reachable(handlers)):
        found = app.constructor(module, expr)
        if isinstance(found, list):
            reasons += [f"{app.line(module, expr)}: {r}" for r in found]
            continue
        owner, call = found
        fact = factory_of(app, owner, call, records)
        built.setdefault(ast.unparse(call), fact)
    readable = [f for f in built.values() if f.factory.read]
    if len(readable) == 1:
        return readable[0]
    if len(readable) > 1:
        names = ", ".join(f"{f.factory.value} ({f.factory.source})" for f in readable)
        return ModelFact(Value(None, where, f"the training code builds several models: {names}"))
    if built:
        return next(iter(built.values()))
    why = "; ".join(reasons) or "no `model.load_state_dict(...)` in the training code"
    return ModelFact(Value(None, where, why))


def factory_of(app: App, module: Module, call: ast.Call, records: dict[str, dict]) -> ModelFact:
    """``Net()`` / ``get_model(num_classes)`` / ``torchvision.models.resnet18(num_classes=10)`` as a factory
    reference and keyword arguments; unread where the callee is not a module-level name or an argument is not
    fixed statically."""
    source = app.line(module, call)
    name = _called_name(call)
    dotted = app.dotted(module, call.func)
    if isinstance(call.func, ast.Name) and (name in module.classes or name in module.functions):
        reference, params = f"{_module_name(module.path)}:{name}", parameters(module, name)
    elif dotted and "." in dotted and not dotted.startswith("self."):
        owner, _, attr = dotted.rpartition(".")
        local = next((m for m in app.modules.values() if _module_name(m.path) == owner), None)
        reference = f"{owner}:{attr}"
        params = parameters(local, attr) if local is not None else None
    else:
        return ModelFact(Value(None, source, f"the model is built by `{ast.unparse(call)}`, not a module-level "
                                             "class or function"))  # fmt: skip
    args: dict[str, Value] = {}
    if call.args and params is None:
        return ModelFact(Value(None, source, f"`{ast.unparse(call)}` passes positional arguments to a library "
                                             "function whose parameter names the audit does not read"))  # fmt: skip
    for i, arg in enumerate(call.args):
        if params is None or i >= len(params):
            return ModelFact(Value(None, source, f"`{ast.unparse(call)}` passes more arguments than {name} takes"))
        args[params[i]] = read_value(app, module, call, arg, records)
    for keyword in call.keywords:
        if keyword.arg is None:
            return ModelFact(Value(None, source, f"`{ast.unparse(call)}` passes **kwargs"))
        args[keyword.arg] = read_value(app, module, call, keyword.value, records)
    how = f"`{ast.unparse(call)}`, the model whose weights the training code loads"
    return ModelFact(Value(reference, source, how), args)


def parameters(module: Module, name: str) -> list[str] | None:
    """The parameter names (``self`` left out) of ``module``'s class ``name`` (its ``__init__``) or function."""
    if name in module.classes:
        init = next((f for f in module.classes[name].body if isinstance(f, ast.FunctionDef) and
                     f.name == "__init__"), None)  # fmt: skip
        return [] if init is None else [a.arg for a in init.args.args[1:]]
    function = next((f for f in module.tree.body if isinstance(f, ast.FunctionDef) and f.name == name), None)
    return None if function is None else [a.arg for a in function.args.args]


# ---------------------------------------------------------------------------- the normalisation


def read_normalisation(app: App, run_config: dict[str, Any]) -> tuple[Value, Value]:
    """(mean, std) of the app's ``Normalize(mean, std)`` or of a normalisation it writes out, ``(x - MEAN) / STD``
    (:func:`_written_normalisation`): one pair across the code (train and test transforms agree), else unread
    saying where they differ; "no Normalize" where the code has neither (mean 0, std 1: pixels as ``ToTensor``
    gives them, which the report states)."""
    records = {"run config": run_config}
    pairs: dict[tuple, str] = {}
    written_out: set[tuple] = set()
    unread: list[str] = []
    for module in app.modules.values():
        for node in ast.walk(module.tree):
            if isinstance(written := _written_normalisation(app, module, node, records), str):
                unread.append(f"{app.line(module, node)}: {written}")
                continue
            if written is not None:
                pairs.setdefault(written, app.line(module, node))
                written_out.add(written)
                continue
            if not (isinstance(node, ast.Call) and _called_name(node) == "Normalize"):
                continue
            where = app.line(module, node)
            if node.args and isinstance(node.args[0], ast.Starred):  # ``Normalize(*STATS)``: STATS = (mean, std)
                try:
                    stats = _resolved(app, module, node.args[0].value, records)[0]
                    pair = tuple(_floats(v) for v in stats[:2])
                except FACT_ERRORS as err:
                    unread.append(f"{where}: {err}")
                    continue
                pairs.setdefault(pair, where)
                continue
            mean = next((k.value for k in node.keywords if k.arg == "mean"), node.args[0] if node.args else None)
            std = next((k.value for k in node.keywords if k.arg == "std"), node.args[1] if len(node.args) > 1 else
                       None)  # fmt: skip
            if mean is None or std is None:
                unread.append(f"{where}: Normalize without mean and std")
                continue
            try:
                pair = tuple(_floats(_resolved(app, module, e, records)[0]) for e in (mean, std))
            except FACT_ERRORS as err:
                unread.append(f"{where}: {err}")
                continue
            pairs.setdefault(pair, where)
    if unread:
        reason = "; ".join(unread)
        return Value(None, unread[0].split(":")[0], reason), Value(None, unread[0].split(":")[0], reason)
    if len(pairs) > 1:
        listed = "; ".join(f"{p[0]} / {p[1]} ({w})" for p, w in pairs.items())
        return Value(None, app.where, f"several Normalize settings: {listed}"), Value(None, app.where, "as mean")
    if not pairs:
        how = "no Normalize(...) in the app's code: pixels as ToTensor gives them"
        return Value((0.0,), app.where, how), Value((1.0,), app.where, how)
    (mean, std), where = next(iter(pairs.items()))
    how = "(x - mean) / std, written out" if (mean, std) in written_out else "Normalize(mean, std)"
    return Value(mean, where, how), Value(std, where, how)


TENSOR_BUILDERS = {"tensor", "as_tensor", "Tensor", "array", "asarray"}  # torch.tensor(MEAN), np.array([...])
SHAPING = {"view", "reshape", "to", "float", "double", "unsqueeze", "type"}  # .view(1, 3, 1, 1) and the like


def _written_normalisation(app: App, module: Module, node: ast.AST, records: dict[str, dict]) -> tuple | str | None:
    """(mean, std) of a normalisation written out, ``(x - M) / S``, where M and S are constants of the code (a
    name or a literal tuple or list, possibly through ``torch.tensor(...)``, ``np.array(...)``, ``.view(...)``,
    or a local name bound to one); why not, where M and S are names of a mean and a std whose values are not read;
    None for any other expression (a bare number is not taken: ``(n - 1) / 2`` is arithmetic, not pixels)."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.left, ast.BinOp)
            and isinstance(node.left.op, ast.Sub)):  # fmt: skip
        return None
    operands = (node.left.right, node.right)
    values = [_constant_pixels(app, module, expr, records) for expr in operands]
    if None not in values:
        return tuple(values)
    named = [_bare(expr) for expr in operands]  # ``(x - mean) / std`` whose constants are not read: said, not guessed
    if all(isinstance(e, ast.Name) for e in named) and "mean" in named[0].id.lower() and "std" in named[1].id.lower():
        return f"(x - {named[0].id}) / {named[1].id}: its values are not read from the code"
    return None


def _bare(expr: ast.expr) -> ast.expr:
    """``expr`` without the tensor builders and shaping calls around it (``torch.tensor(MEAN).view(…)``: MEAN)."""
    while isinstance(expr, ast.Call):
        if isinstance(expr.func, ast.Attribute) and expr.func.attr in SHAPING:
            expr = expr.func.value
        elif _called_name(expr) in TENSOR_BUILDERS and expr.args:
            expr = expr.args[0]
        else:
            return expr
    return expr


def _constant_pixels(app: App, module: Module, expr: ast.expr, records: dict[str, dict],
                     follow: bool = True) -> tuple[float, ...] | None:  # fmt: skip
    """The per-channel constants ``expr`` stands for (see :func:`_written_normalisation`), else None. A local name
    the module binds to such an expression (``mean = torch.tensor(MEAN).view(1, 3, 1, 1)``, then
    ``(x - mean) / std``) is followed where every binding of it in the module gives the same constants."""
    expr = _bare(expr)
    if not isinstance(expr, ast.Name | ast.Tuple | ast.List | ast.Attribute):
        return None
    try:
        value = _resolved(app, module, expr, records)[0]
    except FACT_ERRORS:
        if not (follow and isinstance(expr, ast.Name)):
            return None
        bound = {_constant_pixels(app, module, a.value, records, follow=False) for a in ast.walk(module.tree)
                 if isinstance(a, ast.Assign) and [t.id for t in a.targets if isinstance(t, ast.Name)] == [expr.id]}
        return bound.pop() if len(bound) == 1 and None not in bound else None
    if not (isinstance(value, tuple | list) and value and all(isinstance(v, int | float) for v in value)):
        return None
    return _floats(value)


def _floats(value: Any) -> tuple[float, ...]:
    values = value if isinstance(value, tuple | list) else (value,)
    return tuple(float(v) for v in values)


# ---------------------------------------------------------------------------- the data


def read_loader(app: App) -> LoaderCall | Value:
    """The call through which the training code loads its partition: the call nearest the handler that passes
    the node config's ``partition-id`` (or an expression of it) or the handler's Context to a function of the
    app; an unread Value (why) where there is none or several disagree."""
    handlers = app.train_handlers()
    if not handlers:
        return Value(None, app.where, "no @app.train() handler and no fit method found")
    found: dict[str, LoaderCall] = {}
    for reached in _by_depth(app, handlers):
        for module, node in reached:
            for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
                loader = _loader_call(app, module, call)
                if loader is not None:
                    found.setdefault(loader.function, loader)
        if found:
            break
    if not found:
        return Value(None, app.where, "no call passes the node config's partition-id to a function of the app")
    preferred = [f for f in found.values() if "load" in f.function.lower()] or list(found.values())
    if len(preferred) > 1:
        listed = ", ".join(f"{f.function} ({f.source})" for f in preferred)
        return Value(None, app.where, f"several functions take the partition: {listed}")
    return preferred[0]


def _by_depth(app: App, handlers: list[tuple[Module, ast.FunctionDef]]) -> list[list[tuple[Module, ast.AST]]]:
    """The handlers, then the functions they call by name, and so on (a few levels)."""
    levels, seen = [list(handlers)], {id(f) for _, f in handlers}
    for _ in range(3):
        nxt = []
        for module, node in levels[-1]:
            for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
                name, _, _ = app.callee(module, call)
                for owner, function in app.function_named(name):
                    if id(function) not in seen:
                        seen.add(id(function))
                        nxt.append((owner, function))
        if not nxt:
            break
        levels.append(nxt)
    return levels


def _loader_call(app: App, module: Module, call: ast.Call) -> LoaderCall | None:
    name, _, _ = app.callee(module, call)
    owners = [(m, f) for m, f in app.function_named(name) if f in m.tree.body]  # module-level functions only
    if len(owners) != 1 or not isinstance(call.func, ast.Name):
        return None
    owner, function = owners[0]
    handler = app.enclosing_function(module, call)
    context_names = {a.arg for a in handler.args.args if a.arg in ("context", "ctx")} if handler else set()
    context_params = tuple(i for i, a in enumerate(call.args) if isinstance(a, ast.Name) and a.id in context_names)
    takes_partition = any(_mentions_partition(app, module, a) for a in [*call.args, *(k.value for k in
                          call.keywords)])  # fmt: skip
    if not (takes_partition or context_params):
        return None
    return LoaderCall(f"{_module_name(owner.path)}:{function.name}", app.line(module, call), app, module, call,
                      context_params)  # fmt: skip


def _mentions_partition(app: App, module: Module, expr: ast.expr, hops: int = 0) -> bool:
    """Whether ``expr`` is (or is computed from) ``context.node_config["partition-id"]``."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Constant) and node.value == PARTITION_KEY:
            return True
        if isinstance(node, ast.Name) and hops < 3:
            assigned = app.local_assignment(module, node)
            if assigned is not None and _mentions_partition(app, module, assigned, hops + 1):
                return True
    return False
