"""The user's code, named by the config: ``model.factory: "mypkg.model:build"``.

A factory section (``model``, ``data``, ``loss``, ``optim``, ``validation``) holds ftfleet's own keys
(``factory``, ``init_from``, ``num_workers``...) and the keys of its factories. Each
factory is a built-in name or an importable ``module:callable`` called as::

    model.factory(cfg)               -> torch.nn.Module
    data.factory(cfg)                -> a map-style dataset, or an IterableDataset
    validation.factory(cfg)          -> the same, a held-out set
    validation.metrics(cfg)          -> metrics(model, batch) -> {name: scalar tensor}
    loss.factory(cfg)                -> loss(model, batch) -> scalar tensor
    optim.factory(cfg, model)        -> torch.optim.Optimizer
    optim.scheduler(cfg, optimizer)  -> torch.optim.lr_scheduler.LRScheduler

and, when it has a parameter named ``job``, also ``job=<the whole JobConfig>``.

``cfg`` is what the factory declares it takes. A first parameter annotated with a
dataclass declares the factory's keys: they are type-checked and an unknown one gets
a did-you-mean, exactly like ftfleet's own. Without such an annotation the factory
receives a dict of every key of the section that is not ftfleet's, unchecked; a key
within a typo of one of ftfleet's is refused there, because it is far likelier a typo
than a key of the factory.

All of this happens when the config loads: a factory that does not import, is not
callable, or cannot take its arguments is one line naming the key, before any process
group exists. What a factory returns is checked when the trainer calls it.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import typing
from collections.abc import Callable
from typing import Any

from ftfleet.errors import ConfigError
from ftfleet.trainer import schemas


@dataclasses.dataclass(frozen=True)
class Builtin:
    target: str
    schema: type
    takes_job: bool = False


BUILTINS: dict[str, dict[str, Builtin]] = {
    "model.factory": {
        "gpt": Builtin("ftfleet.trainer.model:build", schemas.GPTConfig),
        "hf_causal_lm": Builtin("ftfleet.trainer.hf:causal_lm", schemas.HFCausalLMConfig),
    },
    "data.factory": {
        "synthetic": Builtin("ftfleet.trainer.data.synthetic:build", schemas.SyntheticConfig, True),
        "token_shards": Builtin("ftfleet.trainer.data.shards:build", schemas.TokenShardsConfig, True),
    },
    "validation.factory": {
        "synthetic": Builtin("ftfleet.trainer.data.synthetic:held_out", schemas.SyntheticConfig, True),
        "token_shards": Builtin("ftfleet.trainer.data.shards:build", schemas.TokenShardsConfig, True),
    },
    "validation.metrics": {"loss": Builtin("ftfleet.trainer.validation:loss_metrics", schemas.NoKeys, True)},
    "loss.factory": {"next_token": Builtin("ftfleet.trainer.losses:next_token", schemas.NextTokenConfig)},
    "optim.factory": {"adamw": Builtin("ftfleet.trainer.optim:adamw", schemas.AdamWConfig)},
    "optim.scheduler": {
        "warmup_cosine": Builtin("ftfleet.trainer.optim:warmup_cosine", schemas.WarmupCosineConfig, True),
        "constant": Builtin("ftfleet.trainer.optim:constant", schemas.NoKeys),
    },
}

#: The arguments after ``cfg`` that each factory is called with.
CALLED_WITH: dict[str, tuple[str, ...]] = {
    "model.factory": (),
    "data.factory": (),
    "validation.factory": (),
    "validation.metrics": (),
    "loss.factory": (),
    "optim.factory": ("model",),
    "optim.scheduler": ("optimizer",),
}


class Factory:
    """One resolved factory: what to call, and what it receives."""

    def __init__(self, key: str, spec: str, target: str, schema: type | None, takes_job: bool, fn: Callable | None):
        self.key = key
        self.spec = spec
        self.target = target
        self.schema = schema
        self.takes_job = takes_job
        self._fn = fn
        #: What the factory receives as ``cfg``: an instance of ``schema``, or a dict.
        self.args: Any = None

    def load(self) -> Callable:
        if self._fn is None:
            self._fn = import_callable(self.key, self.target)
        return self._fn

    def __call__(self, *extra: Any, job: Any = None) -> Any:
        kwargs = {"job": job} if self.takes_job else {}
        return self.load()(self.args, *extra, **kwargs)

    def hash_view(self) -> Any:
        if self.schema is None:
            return self.args
        return {
            f.name: _plain(getattr(self.args, f.name))
            for f in dataclasses.fields(self.schema)
            if f.metadata.get("hash", True)
        }

    def __repr__(self) -> str:
        return f"Factory({self.key}={self.spec!r})"


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value


def resolve(key: str, spec: str) -> Factory:
    """The factory a config value names: a built-in, or an importable callable."""
    builtins = BUILTINS[key]
    if spec in builtins:
        b = builtins[spec]
        return Factory(key, spec, b.target, b.schema, b.takes_job, None)
    if ":" not in spec:
        near = difflib.get_close_matches(spec, list(builtins), n=1)
        hint = f"did you mean {near[0]}? " if near else ""
        raise ConfigError(
            f"{key}={spec!r}: {hint}use a built-in ({', '.join(builtins)}) or module:callable (e.g. mypkg.model:build)"
        )
    fn = import_callable(key, spec)
    schema, takes_job = _introspect(key, spec, fn)
    return Factory(key, spec, spec, schema, takes_job, fn)


def import_callable(key: str, spec: str) -> Callable:
    """``module:attr`` (attr may be dotted) imported and checked to be callable."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{key}={spec!r}: write module:callable, e.g. mypkg.model:build")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - the user's module may raise anything on import
        detail = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(
            f"{key}={spec}: cannot import {module_name} ({type(exc).__name__}: {detail}); "
            "install its package or put it on PYTHONPATH"
        ) from None
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            owner = ".".join([module_name, *attr.split(".")[:i]])
            names = [n for n in dir(obj) if not n.startswith("_")]
            near = difflib.get_close_matches(part, names, n=1)
            hint = f": did you mean {near[0]}?" if near else ""
            raise ConfigError(f"{key}={spec}: {owner} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{key}={spec} is a {type(obj).__name__}, not a callable: name a function or a class")
    return obj


def _introspect(key: str, spec: str, fn: Callable) -> tuple[type | None, bool]:
    """(the dataclass annotating the first parameter or None, whether it takes ``job``).
    Also checks that the factory can be called the way the trainer will call it."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: trust them
        return None, False
    takes_job = "job" in sig.parameters
    extra = CALLED_WITH.get(key, ())
    try:
        sig.bind(None, *extra, **({"job": None} if takes_job else {}))
    except TypeError:
        wanted = ", ".join(["cfg", *extra])
        raise ConfigError(
            f"{key}={spec} has the signature {sig}; the trainer calls it as ({wanted}[, job=...])"
        ) from None
    first = next(iter(sig.parameters.values()))
    try:
        hints = typing.get_type_hints(fn.__init__ if isinstance(fn, type) else fn)
    except Exception:  # noqa: BLE001 - unresolvable annotations: treat as unannotated
        hints = {}
    tp = hints.get(first.name)
    schema = tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None
    return schema, takes_job


def bind_section(section: Any, name: str, extras: dict[str, Any]) -> dict[str, Factory]:
    """Resolve the factories of ``section`` and hand each its keys from ``extras`` (the
    section's keys that are not ftfleet's). Raises ConfigError naming the key."""
    prefix = f"{name}."
    own = [f.name for f in dataclasses.fields(section) if f.init and f.metadata.get("config_key", True)]
    factories = {k: resolve(f"{prefix}{k}", getattr(section, k)) for k in section.FACTORY_KEYS}
    declared: dict[str, str] = {}
    for f in factories.values():
        if f.schema is not None:
            for field in dataclasses.fields(f.schema):
                declared.setdefault(field.name, f.key)
    untyped = [f for f in factories.values() if f.schema is None]
    for key in extras:
        key = str(key)
        if key in declared:
            continue
        if untyped:
            near = difflib.get_close_matches(key, own, n=1, cutoff=0.8)
            if near:
                raise ConfigError(
                    f"unknown config key {prefix}{key}: did you mean {prefix}{near[0]}? (if it is a key of "
                    f"{untyped[0].spec}, declare it in a dataclass annotating the factory's first parameter)"
                )
            continue
        near = difflib.get_close_matches(key, own + list(declared), n=1)
        hint = f"did you mean {prefix}{near[0]}?" if near else f"valid keys: {', '.join(own + list(declared))}"
        raise ConfigError(f"unknown config key {prefix}{key}: {hint}")
    from ftfleet.trainer.config import build  # the one typed builder (config imports this module)

    for f in factories.values():
        if f.schema is None:
            f.args = dict(extras)
            continue
        names = {field.name for field in dataclasses.fields(f.schema)}
        mine = {k: v for k, v in extras.items() if k in names}
        try:
            f.args = build(f.schema, mine, prefix=prefix)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - a user dataclass's own validation
            detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"{name} ({f.spec}): {detail}") from None
    return factories


def lookup(args: Any, key: str, default: Any = None) -> Any:
    """A key of a factory's arguments, whether they are a dataclass or a dict."""
    if isinstance(args, dict):
        return args.get(key, default)
    return getattr(args, key, default)
