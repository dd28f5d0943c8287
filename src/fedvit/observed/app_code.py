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
import tomllib
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


PYPROJECT = "pyproject.toml"  # the app's Flower config: [tool.flwr.app.components] names its ServerApp and ClientApp


def components(pyproject: str | None) -> dict[str, str]:
    """``[tool.flwr.app.components]`` of an app's pyproject.toml ({} where there is none or it does not parse)."""
    if not pyproject:
        return {}
    try:
        found = tomllib.loads(pyproject).get("tool", {}).get("flwr", {}).get("app", {}).get("components", {})
    except tomllib.TOMLDecodeError:
        return {}
    return {k: str(v) for k, v in found.items()} if isinstance(found, dict) else {}


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
    padding: int | None = None  # RandomCrop's padding, where it is one number of pixels


@dataclasses.dataclass(frozen=True)
class CentralDp:
    """Central DP as the app's server code sets it up: Flower's ``DifferentialPrivacy{Client,Server}Side{Fixed,
    Adaptive}Clipping`` wrapper around its strategy (the server adds Gaussian noise of std σ·C/N to the aggregate of
    N sampled clients' updates, each clipped to norm C: on the clients with ``fixedclipping_mod`` or
    ``adaptiveclipping_mod``, else on the server), and the clipping mods on the clients."""

    wrapper: str  # the wrapper's class name
    source: str  # where it is built (``server_app.py:31``)
    noise_multiplier: Value
    clipping_norm: Value  # the fixed norm, or the adaptive wrappers' initial one
    sampled_clients: Value
    client_mods: tuple[str, ...] = ()  # clipping mods in a ClientApp's mods (``fixedclipping_mod (client_app.py:40)``)

    @property
    def clipped_on_clients(self) -> bool:
        return "ClientSide" in self.wrapper

    @property
    def noise_std(self) -> float | None:
        """σ·C/N, the std of the noise on each entry of the aggregate (None: a value not read)."""
        values = (self.noise_multiplier.value, self.clipping_norm.value, self.sampled_clients.value)
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values) or not values[2]:
            return None
        return float(values[0]) * float(values[1]) / float(values[2])

    def described(self) -> str:
        where = "on the clients" + (f" ({', '.join(self.client_mods)})" if self.client_mods else "") if \
            self.clipped_on_clients else "on the server"
        std = self.noise_std
        return (f"central DP: {self.wrapper} ({self.source}): each update clipped to norm C {where}, the server adds "
                f"Gaussian noise of std σ·C/N to the aggregate (σ {self.noise_multiplier.described()}, C "
                f"{self.clipping_norm.described()}, N {self.sampled_clients.described()}"
                + (f": std {std:.3g} per entry" if std is not None else "") + "); the noise protects the aggregate "
                "and the models the server broadcasts, not the updates: each travels "
                + ("clipped, not noised" if self.clipped_on_clients else "as trained (the server clips it on "
                   "arrival), neither clipped nor noised"))  # fmt: skip


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
    loss: Value | None = None  # the training loss (LOSSES' names: "cross-entropy", "mse", …)
    central_dp: CentralDp | None = None  # Flower's server-side DP wrapper around the strategy, if the app has one
    kept_state: Value | None = None  # weights the client restores from its ``context.state`` (a head kept locally)
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
                sources = {n: bundle.read(n).decode("utf-8", "replace") for n in bundle.namelist()
                           if n.endswith(".py") or n == PYPROJECT}  # fmt: skip
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
        if (app / PYPROJECT).is_file():
            sources[PYPROJECT] = (app / PYPROJECT).read_text(errors="replace")
        where = f"the app folder {app}"
    else:
        raise AppCodeError(f"--app {app}: no such folder or FAB")
    if not set(sources) - {PYPROJECT}:
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
    classes: dict[str, ast.ClassDef]  # top-level classes by name (a Dataset reached by name brings its methods)


def parse_module(path: str, text: str) -> Module | None:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    constants, functions, imports, classes = {}, {}, {}, {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            constants[node.targets[0].id] = node.value
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Tuple)
              and isinstance(node.value, ast.Tuple) and len(node.targets[0].elts) == len(node.value.elts)):  # fmt: skip
            # ``MEAN, STD = (0.485, ...), (0.229, ...)``: element by element
            for target, value in zip(node.targets[0].elts, node.value.elts, strict=True):
                if isinstance(target, ast.Name):
                    constants[target.id] = value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            constants[node.target.id] = node.value
        elif isinstance(node, ast.FunctionDef):
            functions[node.name] = node
        elif isinstance(node, ast.ClassDef):  # methods by name (NumPyClient.fit and the helpers it calls)
            functions.update({f.name: f for f in node.body if isinstance(f, ast.FunctionDef)})
            classes[node.name] = node
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:  # `import torch.optim` binds `torch`; `import torch.optim as optim` the module
                local = alias.asname or alias.name.split(".")[0]
                imports[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    return Module(path, tree, constants, functions, imports, parents, classes)


class App:
    """The app's modules, parsed once; resolves expressions against one exchange's records."""

    def __init__(self, sources: dict[str, str], where: str) -> None:
        self.where = where
        python = {p: t for p, t in sources.items() if p != PYPROJECT}
        self.modules = {p: m for p, t in python.items() if (m := parse_module(p, t)) is not None}
        self.unparsed = sorted(set(python) - set(self.modules))
        self.components = components(sources.get(PYPROJECT))
        # the trees never change: what a call reaches and what a name was last bound to, per node, read once
        self._callees: dict[int, tuple[str, list[ast.expr], list[ast.keyword]]] = {}
        self._assignments: dict[int, ast.expr | None] = {}

    def component_modules(self, kind: str) -> list[Module]:
        """The modules of the app's ``serverapp`` or ``clientapp`` component as its pyproject.toml names it
        (``pkg.server_app:app``), else every module (no pyproject.toml, or a component it does not name)."""
        named = self.components.get(kind, "").partition(":")[0]
        found = [m for m in self.modules.values() if named and _module_name(m.path) == named]
        return found or list(self.modules.values())

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

    def callee(self, module: Module, call: ast.Call) -> tuple[str, list[ast.expr], list[ast.keyword]]:
        """The name of the function ``call`` reaches, as Python resolves it (``train_fn`` under ``from pkg.task
        import train as train_fn`` is ``train``; ``task.train``'s is ``train``; a ``functools.partial`` bound to a
        local name is its function; ``partial(train, …)`` itself is ``partial``), and the positional and keyword
        arguments it gets (a partial's first)."""
        if id(call) not in self._callees:
            self._callees[id(call)] = self._callee(module, call)
        name, args, keywords = self._callees[id(call)]
        return name, list(args), list(keywords)

    def _callee(self, module: Module, call: ast.Call) -> tuple[str, list[ast.expr], list[ast.keyword]]:
        func = call.func
        if isinstance(func, ast.Name):
            bound = self.local_assignment(module, func)
            if bound is None and func.id in module.constants:
                bound = module.constants[func.id]
            if isinstance(bound, ast.Call) and (partial := self.partial_of(module, bound)) is not None:
                name, args, keywords = partial
                return name, args + list(call.args), keywords + list(call.keywords)
            return _imported_name(module, func.id), list(call.args), list(call.keywords)
        return _called_name(call), list(call.args), list(call.keywords)

    def partial_of(self, module: Module, call: ast.Call) -> tuple[str, list[ast.expr], list[ast.keyword]] | None:
        """``functools.partial(f, *args, **kw)``: (f's name as :meth:`callee` resolves it, args, kw); else None."""
        if self.dotted(module, call.func).rpartition(".")[2] != "partial" or not call.args:
            return None
        target = call.args[0]
        if isinstance(target, ast.Name):
            name = _imported_name(module, target.id)
        elif isinstance(target, ast.Attribute):
            name = target.attr
        else:
            return None
        return name, list(call.args[1:]), list(call.keywords)

    def argument_sites(self, module: Module, function: ast.FunctionDef, index: int, param: str
                       ) -> list[tuple[Module, ast.expr, Module, ast.Call]]:  # fmt: skip
        """Where the app calls ``function`` (directly, under an alias, through a partial), the expression each call
        passes for its parameter ``param`` (position ``index``) or its default: (the module that holds the
        expression, the expression, the calling module, the call)."""
        sites = []
        offset = 1 if function.args.args and function.args.args[0].arg in ("self", "cls") else 0
        called = function.name
        if called == "__init__" and isinstance(owner := module.parents.get(function), ast.ClassDef):
            called = owner.name  # a constructor's arguments are given where the class is called
        for caller in self.modules.values():
            for call in ast.walk(caller.tree):
                if not isinstance(call, ast.Call):
                    continue
                name, args, keywords = self.callee(caller, call)  # a partial's own construction: "partial"
                if name != called:
                    continue
                arg = next((k.value for k in keywords if k.arg == param), None)
                if arg is None and 0 <= index - offset < len(args):
                    arg = args[index - offset]
                if arg is not None:
                    sites.append((caller, arg, caller, call))
                    continue
                defaults = function.args.defaults
                first_default = len(function.args.args) - len(defaults)
                if index >= first_default:
                    sites.append((module, defaults[index - first_default], caller, call))
        return sites

    def constructor(self, module: Module, expr: ast.expr, hops: int = 0) -> tuple[Module, ast.Call] | list[str]:
        """The call that builds the object ``expr`` names (an optimiser, a DataLoader), followed through local
        assignments, module constants and the arguments of the function's callers; else why not (a list of
        reasons)."""
        if isinstance(expr, ast.Call):
            return module, expr
        if isinstance(expr, ast.Name) and hops <= MAX_HOPS:
            if (assigned := self.local_assignment(module, expr)) is not None:
                return self.constructor(module, assigned, hops + 1)
            function = self.enclosing_function(module, expr)
            params = [a.arg for a in function.args.args] if function is not None else []
            if function is not None and expr.id in params:
                sites = self.argument_sites(module, function, params.index(expr.id), expr.id)
                found = [self.constructor(m, e, hops + 1) for m, e, _, _ in sites]
                built = [f for f in found if isinstance(f, tuple)]
                if built and len({ast.unparse(c) for _, c in built}) == 1:
                    return built[0]
                if len(built) > 1:
                    return [f"`{expr.id}` is built differently at the calls of {function.name}"]
                return [f"`{expr.id}` is a parameter of {function.name}, built nowhere the code could read"]
            if expr.id in module.constants:
                return self.constructor(module, module.constants[expr.id], hops + 1)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self":
            assigned = self.attribute_assignment(module, expr)
            if assigned is not None and hops <= MAX_HOPS:
                return self.constructor(*assigned, hops + 1)
        return [f"`{ast.unparse(expr)}` is not built where the code could read it"]

    def attribute_assignment(self, module: Module, attribute: ast.Attribute) -> tuple[Module, ast.expr] | None:
        """``self.x = …`` in the class that uses ``self.x`` (its first such assignment), with its module."""
        node: ast.AST = attribute
        while node in module.parents and not isinstance(node, ast.ClassDef):
            node = module.parents[node]
        if not isinstance(node, ast.ClassDef):
            return None
        for assign in ast.walk(node):
            if isinstance(assign, ast.Assign) and any(
                    isinstance(t, ast.Attribute) and t.attr == attribute.attr and isinstance(t.value, ast.Name)
                    and t.value.id == "self" for t in assign.targets):  # fmt: skip
                return module, assign.value
        return None

    def train_handlers(self) -> list[tuple[Module, ast.FunctionDef]]:
        """The functions decorated ``@<app>.train(...)`` (Flower's Message API), else the legacy API's: the
        ``client_fn`` handed to ``ClientApp(client_fn=…)`` (where the client's data and model are built) and the
        clients' ``fit``; with either, a LightningModule's ``training_step`` and ``configure_optimizers``, which
        Lightning calls on the app's behalf."""
        found = [(m, f) for m in self.modules.values() for f in ast.walk(m.tree) if isinstance(f, ast.FunctionDef)
                 and any(_decorator_name(d) == "train" for d in f.decorator_list)]  # fmt: skip
        if not found:
            factories = {ast.unparse(k.value) for m in self.modules.values() for call in ast.walk(m.tree)
                         if isinstance(call, ast.Call) and _called_name(call) == "ClientApp"
                         for k in call.keywords if k.arg == "client_fn"}  # fmt: skip
            found = [(m, f) for m in self.modules.values() for n, f in m.functions.items()
                     if n == "fit" or n in factories]  # fmt: skip
            if not any(f.name == "fit" for _, f in found):
                return []
        return found + self.lightning_hooks()

    def lightning_hooks(self) -> list[tuple[Module, ast.FunctionDef]]:
        """``training_step`` and ``configure_optimizers`` of the app's LightningModules."""
        return [(m, f) for m in self.modules.values() for c in ast.walk(m.tree) if isinstance(c, ast.ClassDef)
                and any(ast.unparse(b).rpartition(".")[2] == "LightningModule" for b in c.bases)
                for f in c.body if isinstance(f, ast.FunctionDef)
                and f.name in ("training_step", "configure_optimizers")]  # fmt: skip

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
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            names |= {_imported_name(module, n) for n in names}  # aliases: ``train_fn`` reaches ``train``
            for name in names:
                todo += self.function_named(name)
                todo += [(m, m.classes[name]) for m in self.modules.values() if name in m.classes]  # a Dataset
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
        sent = self.server_config(key, records) if record == "ConfigRecord" else None
        if key in values and values[key] not in ("", None):
            return values[key], f"{record} {key!r}" + (f", set by {sent[1]}" if sent is not None else "")
        if sent is not None:  # the capture lacks it, the server's code states it
            return sent[0], f"{record} {key!r} as {sent[1]} sets it"
        if default is not None:
            value, how = self.resolve(module, default, records, hops)
            return value, f"default of {record} {key!r}" + (f"; {how}" if how else "")
        raise Unread(f"{record} {key!r}, which the capture does not hold")

    def server_config(self, key: str, records: dict[str, dict]) -> tuple[Any, str] | None:
        """The value the server's code puts under ``key`` in the train messages' config, and where: a legacy
        strategy's ``on_fit_config_fn`` (a function returning a dict literal) or the Message API's
        ``strategy.start(train_config=ConfigRecord({...}))``; None where neither states it statically."""
        for module in self.component_modules("serverapp"):
            for call in ast.walk(module.tree):
                if not isinstance(call, ast.Call):
                    continue
                for keyword in call.keywords:
                    dicts: list[tuple[Module, ast.Dict, str]] = []
                    if keyword.arg == "on_fit_config_fn" and isinstance(keyword.value, ast.Name):
                        name = keyword.value.id  # the function of that name in this module, else the app's
                        owners = [(module, module.functions[name])] if name in module.functions else (
                            self.function_named(name))  # fmt: skip
                        for owner, function in owners:
                            dicts += [(owner, r.value, function.name) for r in ast.walk(function)
                                      if isinstance(r, ast.Return) and isinstance(r.value, ast.Dict)]  # fmt: skip
                    elif keyword.arg == "train_config" and isinstance(keyword.value, ast.Call) and keyword.value.args \
                            and isinstance(keyword.value.args[0], ast.Dict):  # fmt: skip
                        dicts.append((module, keyword.value.args[0], "train_config"))
                    for owner, literal, name in dicts:
                        for k, v in zip(literal.keys, literal.values, strict=True):
                            if isinstance(k, ast.Constant) and k.value == key:
                                try:
                                    value, _ = self.resolve(owner, v, {"run config": records.get("run config", {})})
                                except (Unread, ArithmeticError, TypeError, ValueError, RecursionError):
                                    continue
                                return value, f"{name} ({self.line(owner, k)})"
        return None

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
        if id(name) not in self._assignments:
            self._assignments[id(name)] = self._local_assignment(module, name)
        return self._assignments[id(name)]

    def _local_assignment(self, module: Module, name: ast.Name) -> ast.expr | None:
        function = self.enclosing_function(module, name)
        if function is None:
            return None
        found, value = None, None
        for node in ast.walk(function):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and node.lineno < getattr(name, "lineno", 10**9)):  # fmt: skip
                continue
            target, assigned = node.targets[0], node.value
            if isinstance(target, ast.Tuple) and isinstance(assigned, ast.Tuple) and len(target.elts) == len(
                    assigned.elts):  # ``lr, epochs = config["lr"], config["local_epochs"]``: element by element
                pairs = zip(target.elts, assigned.elts, strict=True)
                assigned = next((v for t, v in pairs if isinstance(t, ast.Name) and t.id == name.id), None)
                target = name if assigned is not None else target
            if isinstance(target, ast.Name) and target.id == name.id and (found is None or node.lineno > found.lineno):
                found, value = node, assigned
        return value

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
        for holder, arg, caller, call in self.argument_sites(module, function, index, param):
            value, how = self.resolve(holder, arg, records, hops + 1)
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


def read_value(app: App, module: Module, node: ast.AST, expr: ast.expr | None, records: dict[str, dict],
               default: Any = None, whose: str = "torch's") -> Value:  # fmt: skip
    """``expr`` (an argument at ``node``) resolved against ``records``: its value with its source, or unread with
    why; ``default`` (``whose`` default) where the code gives no ``expr``."""
    where = app.line(module, node)
    if expr is None:
        return Value(default, where, f"{whose} default" if default is not None else "not given")
    try:
        found, how = app.resolve(module, expr, records)
    except Unread as err:
        return Value(None, where, str(err))
    except (ArithmeticError, TypeError, ValueError, RecursionError) as err:  # code that would fail, or loop
        return Value(None, where, f"`{ast.unparse(expr)}` is not read statically ({type(err).__name__})")
    return Value(found, where, how)


def read_code(app: App, records: dict[str, dict]) -> CodeRecipe:
    """The recipe the app's training code states, resolved against one exchange's records (``records``: "run
    config" and "ConfigRecord" values)."""
    notes = [f"not parsed (syntax error): {', '.join(app.unparsed)}"] if app.unparsed else []
    handlers = app.train_handlers()
    if not handlers:
        notes.append("no @app.train() handler and no fit method found: nothing was read")
        return CodeRecipe(app.where, notes=tuple(notes), central_dp=central_dp(app, records))
    reached = app.reachable(handlers)

    def value(module: Module, node: ast.AST, expr: ast.expr | None, default: Any = None) -> Value:
        return read_value(app, module, node, expr, records, default)

    fields: dict[str, Any] = {}
    steps = [(m, n) for m, n in _walk(reached) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "step" and not n.args and isinstance(n.func.value, ast.Name | ast.Attribute)
             and not _scheduler(n.func.value)]  # fmt: skip
    built = []  # (module, the step() call or returned optimiser, its constructor or why it is not read)
    for module, call in steps:
        built.append((module, call, app.constructor(module, call.func.value)))
    for module, hook in app.lightning_hooks():  # Lightning steps the optimiser configure_optimizers returns
        if hook.name == "configure_optimizers":
            for node in ast.walk(hook):
                if isinstance(node, ast.Return) and node.value is not None:
                    built.append((module, node, app.constructor(module, _first_returned(node.value))))
    optimisers = [found for _, _, found in built if isinstance(found, tuple)
                  and app.dotted(found[0], found[1].func).rpartition(".")[2] in OPTIMISERS]  # fmt: skip
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
        module, call, found = built[0]
        if isinstance(found, tuple):
            where, why = found[1], f"`{ast.unparse(found[1])}` builds the optimiser in a way not read statically " \
                "(e.g. its class is an argument)"
            module = found[0]
        else:
            where, why = call, "; ".join(found)
        fields["optimiser"] = Value(None, app.line(module, where), why)
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
    trainers = [(m, n) for m, n in _walk(reached) if isinstance(n, ast.Call) and _called_name(n) == "Trainer"
                and any(k.arg == "max_epochs" for k in n.keywords)]  # fmt: skip
    if "epochs" not in fields and trainers:  # Lightning's Trainer(max_epochs=…) runs the epoch loop
        module, call = trainers[0]
        fields["epochs"] = value(module, call, next(k.value for k in call.keywords if k.arg == "max_epochs"))
    loaders = [(m, n) for m, n in _walk(reached) if isinstance(n, ast.Call) and _called_name(n) == "DataLoader"]
    training = [(m, n) for m, n in loaders if _training_loader(m, n)]
    if "batch_size" not in fields and loaders:
        sizes = {}
        for module, call in training or loaders:
            expr = _argument(call, "batch_size", 1)
            found = value(module, call, expr, 1)
            sizes.setdefault(found.value, found)
        fields["batch_size"] = next(iter(sizes.values())) if len(sizes) == 1 else Value(
            None, next(iter(sizes.values())).source, f"several DataLoader batch sizes: {list(sizes)}")  # fmt: skip
    frozen = tuple(Value(_module_path(call.func.value), app.line(module, call), "`requires_grad_(False)`")
                   for module, call in _walk(reached) if isinstance(call, ast.Call) and _called_name(call) ==
                   "requires_grad_" and call.args and isinstance(call.args[0], ast.Constant)
                   and call.args[0].value is False)  # fmt: skip
    fields["loss"] = training_loss(app, reached)
    fields["kept_state"] = kept_state(app, reached)
    fields["central_dp"] = central_dp(app, records)
    return CodeRecipe(app.where, frozen=frozen, transforms=tuple(random_transforms(app, reached)), notes=tuple(notes),
                      **fields)  # fmt: skip


LOSSES = {  # torch's loss functions and modules -> the loss the recipe names
    **dict.fromkeys(("cross_entropy", "CrossEntropyLoss"), "cross-entropy"),
    **dict.fromkeys(("nll_loss", "NLLLoss"), "nll"),
    **dict.fromkeys(("mse_loss", "MSELoss"), "mse"),
    **dict.fromkeys(("l1_loss", "L1Loss", "smooth_l1_loss", "SmoothL1Loss", "huber_loss", "HuberLoss"), "l1"),
    **dict.fromkeys(("binary_cross_entropy", "binary_cross_entropy_with_logits", "BCELoss", "BCEWithLogitsLoss"),
                    "binary cross-entropy"),
}
CLASSIFIER_LOSSES = ("cross-entropy", "nll")  # a loss over class labels: what the audit's simulations train with


def training_loss(app: App, reached: list[tuple[Module, ast.AST]]) -> Value | None:
    """The loss the training code computes (its first, by name: ``F.cross_entropy``, ``nn.MSELoss()``, …); None
    where the code names no torch loss."""
    found: dict[str, Value] = {}
    for module, node in _walk(reached):
        if isinstance(node, ast.Call) and (name := LOSSES.get(_called_name(node))) is not None:
            found.setdefault(name, Value(name, app.line(module, node), f"`{ast.unparse(node.func)}`"))
    if len(found) > 1 and not set(found) <= set(CLASSIFIER_LOSSES):
        first = next(iter(found.values()))
        return Value(None, first.source, "several losses in the training code: " + ", ".join(
            f"{v.value} ({v.source})" for v in found.values()))  # fmt: skip
    return next(iter(found.values()), None)


CENTRAL_DP = {  # Flower's server-side DP wrappers -> their positional parameters after the strategy
    "DifferentialPrivacyClientSideFixedClipping": ("noise_multiplier", "clipping_norm", "num_sampled_clients"),
    "DifferentialPrivacyServerSideFixedClipping": ("noise_multiplier", "clipping_norm", "num_sampled_clients"),
    "DifferentialPrivacyClientSideAdaptiveClipping": ("noise_multiplier", "num_sampled_clients",
                                                      "initial_clipping_norm"),
    "DifferentialPrivacyServerSideAdaptiveClipping": ("noise_multiplier", "num_sampled_clients",
                                                      "initial_clipping_norm"),
}  # fmt: skip
CLIPPING_MODS = ("fixedclipping_mod", "adaptiveclipping_mod")


def central_dp(app: App, records: dict[str, dict]) -> CentralDp | None:
    """The server-side DP wrapper the app builds anywhere in its code (its first), its σ, C and N resolved against
    the run config, and the clipping mods its ClientApps list; None where it builds none. Only the ServerApp
    component pyproject.toml names is read, where it names one (an app folder may hold several server apps)."""
    for module in app.component_modules("serverapp"):
        for call in ast.walk(module.tree):
            if not (isinstance(call, ast.Call) and (name := _called_name(call)) in CENTRAL_DP):
                continue
            given = dict(zip(CENTRAL_DP[name], call.args[1:], strict=False)) | {k.arg: k.value for k in call.keywords}
            norm_key, norm_default = ("clipping_norm", None) if "clipping_norm" in CENTRAL_DP[name] else (
                "initial_clipping_norm", 0.1)  # fmt: skip
            noise, norm, sampled = (read_value(app, module, call, given.get(key), records, default, "Flower's")
                                    for key, default in (("noise_multiplier", None), (norm_key, norm_default),
                                                         ("num_sampled_clients", None)))  # fmt: skip
            mods = tuple(f"{m} ({app.line(other, node)})" for other in app.component_modules("clientapp")
                         for node in ast.walk(other.tree) if isinstance(node, ast.Call)
                         and _called_name(node) == "ClientApp" for k in node.keywords if k.arg == "mods"
                         for m in CLIPPING_MODS if m in ast.unparse(k.value))  # fmt: skip
            return CentralDp(name, app.line(module, call), noise, norm, sampled, mods)
    return None


def kept_state(app: App, reached: list[tuple[Module, ast.AST]]) -> Value | None:
    """Weights the training code loads from the client's own ``context.state`` (advanced-pytorch keeps its head
    there between rounds): from its second round such a client does not start from the weights it received. None:
    the code loads nothing from its state."""
    for module, node in _walk(reached):
        if isinstance(node, ast.Call) and _called_name(node) == "load_state_dict" and any(
                _reads_state(a) or _state_bound(app, module, a) for a in node.args):  # fmt: skip
            return Value(ast.unparse(node.func.value), app.line(module, node),
                         f"`{ast.unparse(node)}`: weights restored from the client's context.state")  # fmt: skip
    return None


def _state_bound(app: App, module: Module, expr: ast.expr) -> bool:
    """Whether ``expr`` names a local value read from a ``context.state`` record."""
    name = expr.func.value if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) else expr
    while isinstance(name, ast.Attribute | ast.Subscript):
        name = name.value
    if not isinstance(name, ast.Name):
        return False
    assigned = app.local_assignment(module, name)
    return assigned is not None and _reads_state(assigned)


def _reads_state(expr: ast.expr) -> bool:
    """Whether ``expr`` reads an attribute named ``state`` (``context.state[…]``; ``net.state_dict()`` does not)."""
    return any(isinstance(n, ast.Attribute) and n.attr == "state" for n in ast.walk(expr))


def not_a_classifier(loss: Value) -> str:
    """What applies to a model the code trains with ``loss`` (not over class labels), in one line."""
    return (f"the app's training code computes a {loss.value} loss ({loss.source}), not a cross-entropy over class "
            "labels: not a classifier. Label counts do not apply to it; membership and images would need the "
            "audit to simulate that loss, which it does not: nothing of this app is measured")


def _scheduler(expr: ast.expr) -> bool:
    """A learning-rate scheduler's or a scaler's ``step()`` (``scheduler.step()``), not the optimiser's."""
    name = expr.attr if isinstance(expr, ast.Attribute) else expr.id if isinstance(expr, ast.Name) else ""
    return any(word in name.lower() for word in ("sched", "scaler", "lr_"))


def _first_returned(expr: ast.expr) -> ast.expr:
    """``return optimizer`` / ``return [optimizer], [scheduler]`` / ``return {"optimizer": optimizer, …}``."""
    while isinstance(expr, ast.Tuple | ast.List) and expr.elts:
        expr = expr.elts[0]
    if isinstance(expr, ast.Dict):
        return next((v for k, v in zip(expr.keys, expr.values, strict=True)
                     if isinstance(k, ast.Constant) and k.value == "optimizer"), expr)  # fmt: skip
    return expr


def _training_loader(module: Module, call: ast.Call) -> bool:
    """A DataLoader the client trains on: shuffled, or bound to a name that says "train"."""
    shuffled = any(k.arg == "shuffle" and isinstance(k.value, ast.Constant) and k.value.value is True
                   for k in call.keywords)  # fmt: skip
    parent = module.parents.get(call)
    named = isinstance(parent, ast.Assign) and any("train" in ast.unparse(t).lower() for t in parent.targets)
    return shuffled or named


def _argument(call: ast.Call, name: str, position: int) -> ast.expr | None:
    """The expression ``call`` passes for its parameter ``name``, by keyword or at ``position`` (None: neither)."""
    keyword = next((k.value for k in call.keywords if k.arg == name), None)
    return keyword if keyword is not None else call.args[position] if len(call.args) > position else None


def _imported_name(module: Module, name: str) -> str:
    """``name`` as its import binds it, without the module path (``train`` for ``train_fn`` under ``from pkg.task
    import train as train_fn``); ``name`` itself where nothing imports it."""
    return module.imports.get(name, name).rpartition(".")[2]


def _range_args(expr: ast.expr) -> list[ast.expr]:
    return list(expr.args) if isinstance(expr, ast.Call) and _called_name(expr) == "range" else []


def _module_path(expr: ast.expr) -> str:
    """``model.heads`` → "heads"; ``model`` → "" (the whole model)."""
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    return ".".join(reversed(parts))


def _root_name(expr: ast.expr) -> str:
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else ""


def _in_module_class(module: Module, node: ast.AST) -> bool:
    """Whether ``node`` lies in a class that is a torch or Lightning module (its ``self`` is the model)."""
    while node in module.parents:
        node = module.parents[node]
        if isinstance(node, ast.ClassDef):
            return any("Module" in ast.unparse(b) for b in node.bases)
    return False


def trained_part(app: App, module: Module, params: ast.expr | None) -> Value | None:
    """The module whose parameters the optimiser is handed: ``model.heads.parameters()`` → "heads", the whole
    model → "" (None: not a ``….parameters()`` call)."""
    if params is None:
        return None
    if isinstance(params, ast.Call) and _called_name(params) == "parameters" and isinstance(
            params.func, ast.Attribute):  # fmt: skip
        owner = params.func.value
        part = _module_path(owner)
        if _root_name(owner) == "self" and not _in_module_class(module, params):  # a client's ``self.model``
            part = part.partition(".")[2]
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
            expr = _argument(node, "scale", 1)
            try:
                scale = 0.08 if expr is None else float(app.resolve(module, expr, {})[0][0])
            except (Unread, TypeError, IndexError):
                scale = None
        padding = None
        if name == "RandomCrop":
            expr = _argument(node, "padding", 1)
            try:
                value = None if expr is None else app.resolve(module, expr, {})[0]
                padding = value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
            except Unread:
                padding = None
        arguments = ", ".join([ast.unparse(a) for a in node.args] + [ast.unparse(k) for k in node.keywords])
        found.setdefault(name + arguments, Transform(name, arguments, app.line(module, node), scale, padding))
    return list(found.values())


def load_app(app: Path) -> App:
    """The app at ``app`` (a folder or a FAB), parsed (the audit's reader keeps one per path)."""
    return App(*app_sources(app))
