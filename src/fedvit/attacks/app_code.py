"""The client's recipe read from the app's own Python, as an eavesdropper holds it: the app bundle (FAB) every
SuperNode fetches over the Fleet API, or the app's folder (``fedvit audit --app DIR|FAB``).

The code is parsed (:mod:`ast`), never executed. From the functions a ``@app.train()`` handler reaches (calls and
names, across the app's modules) it reads:

- the optimiser constructor (``torch.optim.Adam(model.heads.parameters(), lr=lr)``): its class, lr, momentum,
  weight decay and betas, and the parameters handed to it;
- the random training transforms (``RandomResizedCrop``, ``RandomCrop``, flips and others, by name);
- the epoch loop around the optimiser's ``step()`` and the batch size (a ``DataLoader``'s ``batch_size`` or the
  step of a ``range`` over the data);
- the submodules frozen with ``requires_grad_(False)``.

Each value carries its source (``task.py:85``) and how it was resolved: a literal, a module constant, a
``context.run_config["key"]`` or ``msg.content["config"]["key"]`` looked up in the captured records, a parameter
followed to its callers. What cannot be read this way (an optimiser whose class is an argument, a value computed at
run time) is named as unread with its line, never guessed.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import io
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

OPTIMISERS = {  # torch.optim classes -> the name the recipe uses
    name: name.lower()
    for name in ("SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam", "RMSprop", "Rprop",
                 "LBFGS", "SparseAdam", "ASGD", "Adafactor", "Muon")
}  # fmt: skip
RANDOM_TRANSFORMS = ("RandomResizedCrop", "RandomCrop", "RandomHorizontalFlip", "RandomVerticalFlip", "ColorJitter",
                     "RandomRotation", "RandomAffine", "RandAugment", "TrivialAugmentWide", "AutoAugment",
                     "AugMix", "RandomErasing", "RandomGrayscale", "GaussianBlur", "RandomPerspective")  # fmt: skip
MAX_HOPS = 4  # parameters followed to their callers at most this deep


class AppCodeError(ValueError):
    """An app path that holds no Python to read (the message says what was found)."""


class Unread(Exception):
    """A value the code computes in a way that is not read statically (the message says how)."""


@dataclasses.dataclass(frozen=True)
class Value:
    """One recipe value read from the code: ``value`` (None: unread, ``how`` says why), where the code states it
    (``source``: ``task.py:85``) and how it was resolved (``how``)."""

    value: Any
    source: str
    how: str

    @property
    def read(self) -> bool:
        return self.value is not None

    def described(self) -> str:
        if self.value is None:
            return f"unread ({self.source}: {self.how})"
        number = isinstance(self.value, int | float) and not isinstance(self.value, bool)
        shown = f"{self.value:g}" if number else str(self.value)
        return f"{shown} ({self.source}" + (f", {self.how})" if self.how else ")")


@dataclasses.dataclass(frozen=True)
class Transform:
    """A random training transform found in the code: its class, its arguments as written, where it is."""

    name: str
    arguments: str
    source: str
    crop_scale: float | None = None  # RandomResizedCrop's smallest area share (torchvision's default 0.08)


@dataclasses.dataclass(frozen=True)
class CodeRecipe:
    """What the app's training code says, each value with its source (None: the code has no such value)."""

    app: str  # where the code was read (a folder, or a FAB and its hash)
    optimiser: Value | None = None
    lr: Value | None = None
    momentum: Value | None = None
    weight_decay: Value | None = None
    betas: Value | None = None
    epochs: Value | None = None
    batch_size: Value | None = None
    trained: Value | None = None  # the module whose parameters the optimiser gets ("" the whole model)
    frozen: tuple[Value, ...] = ()  # submodules frozen with requires_grad_(False)
    transforms: tuple[Transform, ...] = ()
    notes: tuple[str, ...] = ()

    def values(self) -> dict[str, Value]:
        """Every value the code states or names as unread, by recipe key."""
        keys = ("optimiser", "lr", "momentum", "weight_decay", "betas", "epochs", "batch_size", "trained")
        return {key.replace("_", " "): v for key in keys if (v := getattr(self, key)) is not None}


# ---------------------------------------------------------------------------- reading the sources


def app_sources(app: Path) -> tuple[dict[str, str], str]:
    """The app's Python files by their path within the app (``pkg/task.py``), and a description of where they came
    from: a folder (its ``*.py`` files, tests and virtual environments left out) or a FAB (a zip archive)."""
    app = Path(app)
    if app.is_file():
        data = app.read_bytes()
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as bundle:
                sources = {n: bundle.read(n).decode("utf-8", "replace") for n in bundle.namelist() if n.endswith(".py")}
        except zipfile.BadZipFile as err:
            raise AppCodeError(f"{app}: not a FAB (a zip archive) nor a folder") from err
        where = f"the app bundle {app.name} (sha256 {hashlib.sha256(data).hexdigest()[:12]})"
    elif app.is_dir():
        skip = {".venv", "venv", "tests", "test", "__pycache__", ".git", "build", "dist", "site-packages"}
        sources = {
            p.relative_to(app).as_posix(): p.read_text(errors="replace")
            for p in sorted(app.rglob("*.py"))
            if not skip & set(p.relative_to(app).parts[:-1])
        }
        where = f"the app folder {app}"
    else:
        raise AppCodeError(f"--app {app}: no such folder or FAB")
    if not sources:
        raise AppCodeError(f"{where} holds no Python files")
    return sources, where


@dataclasses.dataclass
class Module:
    path: str
    tree: ast.Module
    constants: dict[str, ast.expr]  # top-level NAME = expr
    functions: dict[str, ast.FunctionDef]
    imports: dict[str, str]  # local name -> dotted origin ("torch.optim.Adam", "cnnapp.task.train")
    parents: dict[ast.AST, ast.AST]


def parse_module(path: str, text: str) -> Module | None:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    constants, functions, imports = {}, {}, {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            constants[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            constants[node.target.id] = node.value
        elif isinstance(node, ast.FunctionDef):
            functions[node.name] = node
        elif isinstance(node, ast.ClassDef):  # methods by name (NumPyClient.fit and the helpers it calls)
            functions.update({f.name: f for f in node.body if isinstance(f, ast.FunctionDef)})
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:  # `import torch.optim` binds `torch`; `import torch.optim as optim` the module
                local = alias.asname or alias.name.split(".")[0]
                imports[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    return Module(path, tree, constants, functions, imports, parents)


class App:
    """The app's modules, parsed once; resolves expressions against one exchange's records."""

    def __init__(self, sources: dict[str, str], where: str) -> None:
        self.where = where
        self.modules = {p: m for p, t in sources.items() if (m := parse_module(p, t)) is not None}
        self.unparsed = sorted(set(sources) - set(self.modules))

    # -- where things are
    def line(self, module: Module, node: ast.AST) -> str:
        return f"{Path(module.path).name}:{getattr(node, 'lineno', '?')}"

    def enclosing_function(self, module: Module, node: ast.AST) -> ast.FunctionDef | None:
        while node in module.parents:
            node = module.parents[node]
            if isinstance(node, ast.FunctionDef):
                return node
        return None

    def dotted(self, module: Module, expr: ast.expr) -> str:
        """``torch.optim.Adam`` for ``optim.Adam`` under ``from torch import optim`` (imports followed once)."""
        parts = []
        while isinstance(expr, ast.Attribute):
            parts.append(expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name):
            return ""
        head = module.imports.get(expr.id, expr.id)
        return ".".join([head, *reversed(parts)])

    def function_named(self, name: str) -> list[tuple[Module, ast.FunctionDef]]:
        return [(m, m.functions[name]) for m in self.modules.values() if name in m.functions]

    def train_handlers(self) -> list[tuple[Module, ast.FunctionDef]]:
        """The functions decorated ``@<app>.train(...)`` (Flower's Message API), else the clients' ``fit``."""
        found = [(m, f) for m in self.modules.values() for f in ast.walk(m.tree) if isinstance(f, ast.FunctionDef)
                 and any(_decorator_name(d) == "train" for d in f.decorator_list)]  # fmt: skip
        return found or [(m, f) for m in self.modules.values() for n, f in m.functions.items() if n == "fit"]

    def reachable(self, handlers: list[tuple[Module, ast.FunctionDef]]) -> list[tuple[Module, ast.AST]]:
        """The training ``handlers`` and every function and module constant they reach by name (calls,
        references)."""
        todo: list[tuple[Module, ast.AST]] = list(handlers)
        seen: dict[int, tuple[Module, ast.AST]] = {}
        while todo:
            module, node = todo.pop()
            if id(node) in seen:
                continue
            seen[id(node)] = (module, node)
            for name in {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
                    n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}:  # fmt: skip
                todo += self.function_named(name)
                for other in self.modules.values():
                    if name in other.constants and (other is module or name in module.imports):
                        todo.append((other, other.constants[name]))
        return list(seen.values())

    # -- values
    def resolve(self, module: Module, expr: ast.expr, records: dict[str, dict], hops: int = 0) -> tuple[Any, str]:
        """(the value of ``expr``, how it was found); :class:`Unread` where the code does not fix it statically."""
        if isinstance(expr, ast.Constant) and isinstance(expr.value, int | float | str | bool):
            return expr.value, ""
        if isinstance(expr, ast.Tuple | ast.List):
            items = [self.resolve(module, e, records, hops) for e in expr.elts]
            return tuple(v for v, _ in items), "; ".join(h for _, h in items if h)
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
            value, how = self.resolve(module, expr.operand, records, hops)
            return -value, how
        if isinstance(expr, ast.BinOp) and type(expr.op) in _ARITHMETIC:
            left, how_left = self.resolve(module, expr.left, records, hops)
            right, how_right = self.resolve(module, expr.right, records, hops)
            hows = "; ".join(h for h in (how_left, how_right) if h)
            return _ARITHMETIC[type(expr.op)](left, right), f"`{ast.unparse(expr)}`" + (f" with {hows}" if hows else "")
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in _CASTS and expr.args:
            value, how = self.resolve(module, expr.args[0], records, hops)
            try:
                return _CASTS[expr.func.id](value), how
            except (TypeError, ValueError) as err:
                raise Unread(f"{expr.func.id}({value!r}) fails") from err
        if (found := self.record_value(module, expr, records, hops)) is not None:
            return found
        if isinstance(expr, ast.Name):
            return self.resolve_name(module, expr, records, hops)
        raise Unread(f"`{ast.unparse(expr)}` is computed at run time")

    def record_value(self, module: Module, expr: ast.expr, records: dict[str, dict], hops: int
                     ) -> tuple[Any, str] | None:  # fmt: skip
        """``context.run_config["lr"]``, ``config["lr"]`` with ``config = msg.content["config"]``, their
        ``.get(key, default)``: the captured record's value (None: ``expr`` is no record lookup)."""
        key, default = None, None
        if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant):
            base, key = expr.value, expr.slice.value
        elif (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "get"
              and expr.args and isinstance(expr.args[0], ast.Constant)):  # fmt: skip
            base, key = expr.func.value, expr.args[0].value
            default = expr.args[1] if len(expr.args) > 1 else None
        if key is None:
            return None
        record = self.record_of(module, base, hops)
        if record is None:
            return None
        values = records.get(record, {})
        if key in values and values[key] not in ("", None):
            return values[key], f"{record} {key!r}"
        if default is not None:
            value, how = self.resolve(module, default, records, hops)
            return value, f"default of {record} {key!r}" + (f"; {how}" if how else "")
        raise Unread(f"{record} {key!r}, which the capture does not hold")

    def record_of(self, module: Module, base: ast.expr, hops: int) -> str | None:
        """Which record ``base`` is: "run config", "node config", "ConfigRecord" (a train message's config), or
        None; names followed to their assignment in the same function."""
        if isinstance(base, ast.Attribute) and base.attr in ("run_config", "node_config"):
            return base.attr.replace("_", " ")
        if isinstance(base, ast.Subscript) and isinstance(base.slice, ast.Constant) and base.slice.value == "config":
            return "ConfigRecord"
        if isinstance(base, ast.Attribute) and base.attr == "config":  # legacy FitIns.config
            return "ConfigRecord"
        if isinstance(base, ast.Name):
            if base.id == "config" and self._is_parameter(module, base):  # NumPyClient.fit(self, parameters, config)
                return "ConfigRecord"
            assigned = self.local_assignment(module, base)
            if assigned is not None and hops <= MAX_HOPS:
                return self.record_of(module, assigned, hops + 1)
        return None

    def _is_parameter(self, module: Module, name: ast.Name) -> bool:
        function = self.enclosing_function(module, name)
        return function is not None and name.id in [a.arg for a in function.args.args]

    def local_assignment(self, module: Module, name: ast.Name) -> ast.expr | None:
        """The last ``name = …`` in the enclosing function before ``name`` is used (None: none)."""
        function = self.enclosing_function(module, name)
        if function is None:
            return None
        found = None
        for node in ast.walk(function):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id == name.id and node.lineno < getattr(name, "lineno", 10**9)):  # fmt: skip
                if found is None or node.lineno > found.lineno:
                    found = node
        return None if found is None else found.value

    def resolve_name(self, module: Module, name: ast.Name, records: dict[str, dict], hops: int) -> tuple[Any, str]:
        if (assigned := self.local_assignment(module, name)) is not None:
            return self.resolve(module, assigned, records, hops)
        function = self.enclosing_function(module, name)
        if function is not None and name.id in (params := [a.arg for a in function.args.args]):
            return self.from_callers(module, function, params.index(name.id), name.id, records, hops)
        if name.id in module.constants:
            value, how = self.resolve(module, module.constants[name.id], records, hops)
            return value, how or f"{name.id} = {ast.unparse(module.constants[name.id])}"
        origin = module.imports.get(name.id)
        if origin:
            source_module, _, attr = origin.rpartition(".")
            for other in self.modules.values():
                if _module_name(other.path) == source_module and attr in other.constants:
                    value, how = self.resolve(other, other.constants[attr], records, hops)
                    return value, how or f"{attr} = {ast.unparse(other.constants[attr])} ({Path(other.path).name})"
        raise Unread(f"`{name.id}` is not bound where the code could read it")

    def from_callers(self, module: Module, function: ast.FunctionDef, index: int, param: str,
                     records: dict[str, dict], hops: int) -> tuple[Any, str]:  # fmt: skip
        """A parameter's value at the calls of its function in the app (every call must agree)."""
        if hops >= MAX_HOPS:
            raise Unread(f"`{param}` passes through more than {MAX_HOPS} calls")
        found: dict[Any, str] = {}
        for caller in self.modules.values():
            for call in ast.walk(caller.tree):
                if not (isinstance(call, ast.Call) and _called_name(call) == function.name):
                    continue
                offset = 1 if function.args.args and function.args.args[0].arg == "self" else 0
                arg = next((k.value for k in call.keywords if k.arg == param), None)
                if arg is None and index - offset < len(call.args) and index - offset >= 0:
                    arg = call.args[index - offset]
                if arg is None:
                    defaults = function.args.defaults
                    first_default = len(function.args.args) - len(defaults)
                    if index < first_default:
                        continue
                    arg, caller_module = defaults[index - first_default], module
                else:
                    caller_module = caller
                value, how = self.resolve(caller_module, arg, records, hops + 1)
                found.setdefault(value, f"{param} ← {self.line(caller, call)}" + (f" {how}" if how else ""))
        if not found:
            raise Unread(f"`{param}` is a parameter of {function.name}, called nowhere in the app")
        if len(found) > 1:
            raise Unread(f"`{param}` takes several values at the calls of {function.name}: {sorted(map(str, found))}")
        return next(iter(found.items()))


_ARITHMETIC = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
               ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Pow: lambda a, b: a**b}  # fmt: skip
_CASTS = {"float": float, "int": int, "str": str}


def _module_name(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _decorator_name(decorator: ast.expr) -> str:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return target.attr if isinstance(target, ast.Attribute) else ""


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _walk(nodes: list[tuple[Module, ast.AST]]) -> Iterator[tuple[Module, ast.AST]]:
    done: set[int] = set()
    for module, root in nodes:
        for node in ast.walk(root):
            if id(node) not in done:
                done.add(id(node))
                yield module, node


# ---------------------------------------------------------------------------- the recipe


def read_code(app: App, records: dict[str, dict]) -> CodeRecipe:
    """The recipe the app's training code states, resolved against one exchange's records (``records``: "run
    config" and "ConfigRecord" values)."""
    notes = [f"not parsed (syntax error): {', '.join(app.unparsed)}"] if app.unparsed else []
    handlers = app.train_handlers()
    if not handlers:
        notes.append("no @app.train() handler and no fit method found: nothing was read")
        return CodeRecipe(app.where, notes=tuple(notes))
    reached = app.reachable(handlers)

    def value(module: Module, node: ast.AST, expr: ast.expr | None, default: Any = None, what: str = "") -> Value:
        where = app.line(module, node)
        if expr is None:
            return Value(default, where, f"{what}torch's default" if default is not None else "")
        try:
            found, how = app.resolve(module, expr, records)
        except Unread as err:
            return Value(None, where, str(err))
        except (ArithmeticError, TypeError, ValueError, RecursionError) as err:  # code that would fail, or loop
            return Value(None, where, f"`{ast.unparse(expr)}` is not read statically ({type(err).__name__})")
        return Value(found, where, how)

    fields: dict[str, Any] = {}
    steps = [(m, n) for m, n in _walk(reached) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "step" and not n.args and isinstance(n.func.value, ast.Name)]  # fmt: skip
    built = []
    for module, call in steps:
        assigned = app.local_assignment(module, call.func.value)
        if assigned is None and call.func.value.id in module.constants:
            assigned = module.constants[call.func.value.id]
        built.append((module, call, assigned))
    optimisers = [(m, a) for m, _, a in built if isinstance(a, ast.Call)
                  and app.dotted(m, a.func).rpartition(".")[2] in OPTIMISERS]  # fmt: skip
    if optimisers:
        module, call = optimisers[0]
        name = OPTIMISERS[app.dotted(module, call.func).rpartition(".")[2]]
        if len({OPTIMISERS[app.dotted(m, c.func).rpartition(".")[2]] for m, c in optimisers}) > 1:
            notes.append("several optimisers are stepped in the training code: "
                         + ", ".join(f"{ast.unparse(c.func)} ({app.line(m, c)})" for m, c in optimisers))
            fields["optimiser"] = Value(None, app.line(module, call), "several optimisers are stepped")
        else:
            fields["optimiser"] = Value(name, app.line(module, call), f"`{ast.unparse(call.func)}(…)`")
        kw = {k.arg: k.value for k in call.keywords if k.arg}
        positional = dict(zip(("params", "lr", "momentum"), call.args, strict=False)) if name == "sgd" else dict(
            zip(("params", "lr", "betas"), call.args, strict=False))  # fmt: skip
        kw = positional | kw
        defaults = {"sgd": {"lr": 0.001, "momentum": 0.0, "weight_decay": 0.0},
                    "adam": {"lr": 0.001, "betas": (0.9, 0.999), "weight_decay": 0.0},
                    "adamw": {"lr": 0.001, "betas": (0.9, 0.999), "weight_decay": 0.01}}.get(name, {})  # fmt: skip
        for key in ("lr", "momentum", "weight_decay", "betas"):
            if key in kw or key in defaults:
                fields[key] = value(module, call, kw.get(key), defaults.get(key))
        fields["trained"] = trained_part(app, module, kw.get("params"))
    elif built:
        module, call, assigned = built[0]
        shown = ast.unparse(assigned) if assigned is not None else call.func.value.id
        fields["optimiser"] = Value(None, app.line(module, assigned or call),
                                    f"`{shown}` builds the optimiser in a way not read statically (e.g. its class "
                                    "is an argument)")  # fmt: skip
    else:
        notes.append("no optimiser.step() in the code the training handler reaches")
    # the loops around the optimiser's step: the batch loop, and the epoch loop around it
    if steps:
        module, call = steps[0]
        loops = []
        node: ast.AST = call
        while node in module.parents:
            node = module.parents[node]
            if isinstance(node, ast.For):
                loops.append(node)
        batch_loop = loops[0] if loops else None
        epoch_loop = next((loop for loop in loops[1:] if _range_args(loop.iter)), None)
        if epoch_loop is not None:
            args = _range_args(epoch_loop.iter)
            fields["epochs"] = value(module, epoch_loop, args[0] if len(args) == 1 else None)
            if len(args) != 1:
                fields["epochs"] = Value(None, app.line(module, epoch_loop), f"`{ast.unparse(epoch_loop.iter)}`")
        if batch_loop is not None and len(_range_args(batch_loop.iter)) == 3:
            fields["batch_size"] = value(module, batch_loop, _range_args(batch_loop.iter)[2])
    loaders = [(m, n) for m, n in _walk(reached) if isinstance(n, ast.Call) and _called_name(n) == "DataLoader"]
    if "batch_size" not in fields and loaders:
        sizes = {}
        for module, call in loaders:
            kw = {k.arg: k.value for k in call.keywords}
            expr = kw.get("batch_size", call.args[1] if len(call.args) > 1 else None)
            found = value(module, call, expr, 1)
            sizes.setdefault(found.value, found)
        fields["batch_size"] = next(iter(sizes.values())) if len(sizes) == 1 else Value(
            None, next(iter(sizes.values())).source, f"several DataLoader batch sizes: {list(sizes)}")  # fmt: skip
    frozen = tuple(Value(_module_path(call.func.value), app.line(module, call), "`requires_grad_(False)`")
                   for module, call in _walk(reached) if isinstance(call, ast.Call) and _called_name(call) ==
                   "requires_grad_" and call.args and isinstance(call.args[0], ast.Constant)
                   and call.args[0].value is False)  # fmt: skip
    return CodeRecipe(app.where, frozen=frozen, transforms=tuple(random_transforms(app, reached)), notes=tuple(notes),
                      **fields)  # fmt: skip


def _range_args(expr: ast.expr) -> list[ast.expr]:
    return list(expr.args) if isinstance(expr, ast.Call) and _called_name(expr) == "range" else []


def _module_path(expr: ast.expr) -> str:
    """``model.heads`` → "heads"; ``model`` → "" (the whole model)."""
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    return ".".join(reversed(parts))


def trained_part(app: App, module: Module, params: ast.expr | None) -> Value | None:
    """The module whose parameters the optimiser is handed: ``model.heads.parameters()`` → "heads", the whole
    model → "" (None: not a ``….parameters()`` call)."""
    if params is None:
        return None
    if isinstance(params, ast.Call) and _called_name(params) == "parameters" and isinstance(
            params.func, ast.Attribute):  # fmt: skip
        part = _module_path(params.func.value)
        return Value(part or "the whole model", app.line(module, params), f"`{ast.unparse(params)}`")
    return Value(None, app.line(module, params), f"the optimiser gets `{ast.unparse(params)}`")


def random_transforms(app: App, reached: list[tuple[Module, ast.AST]]) -> list[Transform]:
    """The random transforms the training code reaches, each once."""
    found: dict[str, Transform] = {}
    for module, node in _walk(reached):
        if not (isinstance(node, ast.Call) and _called_name(node) in RANDOM_TRANSFORMS):
            continue
        name = _called_name(node)
        scale = None
        if name == "RandomResizedCrop":
            kw = {k.arg: k.value for k in node.keywords}
            expr = kw.get("scale", node.args[1] if len(node.args) > 1 else None)
            try:
                scale = 0.08 if expr is None else float(app.resolve(module, expr, {})[0][0])
            except (Unread, TypeError, IndexError):
                scale = None
        arguments = ", ".join([ast.unparse(a) for a in node.args] + [ast.unparse(k) for k in node.keywords])
        found.setdefault(name + arguments, Transform(name, arguments, app.line(module, node), scale))
    return list(found.values())


def load_app(app: Path) -> App:
    """The app at ``app`` (a folder or a FAB), parsed (the audit's reader keeps one per path)."""
    return App(*app_sources(app))
