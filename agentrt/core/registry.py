"""Named registries: algorithms, rewards, tasks and environments are chosen by name in config."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Generic, Iterator, TypeVar

from agentrt.core.errors import ConfigError

T = TypeVar("T")

#: Every registry by its kind ("reward", "task family", ...), the newest of a kind: code in a layer
#: below a registry's reads it here (agentrt.controller.versions hashes the task families that
#: agentrt.decomposer.sdk defines, a layer up).
REGISTRIES: dict[str, Registry[Any]] = {}


class Registry(Generic[T]):
    """A name -> object map where a duplicate name raises and an unknown name lists valid ones.

    Example:
        >>> ADVANTAGES = Registry("advantage estimator")
        >>> @ADVANTAGES.register("grpo")
        ... def grpo(...): ...

    An entry may also be a ``"package.module:attr"`` string (:meth:`add_lazy`), loaded on the
    first :meth:`get`: its name is known (and a config naming it checked) without importing the
    module, e.g. torch for the built-in algorithms.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        REGISTRIES[kind] = self

    def register(self, name: str) -> Callable[[T], T]:
        def wrap(obj: T) -> T:
            self.add(name, obj)
            return obj

        return wrap

    def add(self, name: str, obj: T) -> None:
        if name in self._items:
            raise KeyError(f"{self.kind} {name!r} is already registered")
        self._items[name] = obj

    def add_lazy(self, name: str, spec: str) -> None:
        """Registers ``name`` as the object at ``spec`` ('package.module:attr'), imported when
        first asked for."""
        self.add(name, _Lazy(spec))  # type: ignore[arg-type]

    def get(self, name: str) -> T:
        """The entry ``name``; a ``'package.module:attr'`` name not registered is imported
        (and kept under that name), so user code needs no registration."""
        if name not in self._items and ":" in name:
            self._items[name] = _Lazy(name)  # type: ignore[assignment]
        try:
            obj = self._items[name]
        except KeyError:
            raise KeyError(
                f"unknown {self.kind} {name!r}; valid: {', '.join(sorted(self._items))}"
            ) from None
        if isinstance(obj, _Lazy):
            try:
                obj = self._items[name] = import_callable(obj.spec, f"{self.kind} {name!r}")
            except ConfigError:
                if ":" in name and name == obj.spec:  # a user's path: forget it, say why
                    del self._items[name]
                raise
        return obj

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))


class _Lazy:
    """A registry entry not imported yet."""

    def __init__(self, spec: str) -> None:
        self.spec = spec


def import_callable(spec: str, what: str) -> Callable[..., Any]:
    """The callable a ``'package.module:function'`` spec names (user code given in a config).

    Raises:
        ConfigError: "<what>: ..." when the module cannot be imported or has no such function.
    """
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{what}: cannot import module {module_name!r} ({exc})") from None
    except Exception as exc:  # the user's module raised while it ran
        first = str(exc).strip().splitlines()[:1]
        raise ConfigError(f"{what}: module {module_name!r} failed while importing: "
                          f"{type(exc).__name__}{': ' + first[0] if first else ''}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{what}: {module_name!r} has no function {attr!r}")
    return fn
