"""Name -> factory registries with decorator registration and clear errors."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from longroute.errors import did_you_mean

T = TypeVar("T")


class RegistryError(ValueError):
    """An unknown name, a duplicate registration or bad parameters."""


class Registry(Generic[T]):
    """Holds factories of one kind (routers, queue policies, ...) by name.

    ``@registry.register("name")`` registers a class or function; ``build``
    creates an instance from a name and keyword parameters, rejecting unknown
    names and parameters with an error that lists the valid ones. ``describe``
    says what a name is in one line (``simulate --list``): the ``description``
    given at registration, else the first paragraph of the factory's docstring.
    """

    def __init__(self, kind: str, code_params: tuple[str, ...] = ()) -> None:
        self.kind = kind
        # parameters longroute passes itself (a router's rng, a workload's seed): never
        # listed as valid config parameters, and refused when a config sets them
        self.code_params = frozenset(code_params)
        self._factories: dict[str, Callable[..., T]] = {}
        self._descriptions: dict[str, str] = {}

    def register(
        self, name: str, *, description: str | None = None
    ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def decorator(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._factories:
                raise RegistryError(f"{self.kind} {name!r} is already registered")
            self._factories[name] = factory
            if description is not None:
                self._descriptions[name] = description
            return factory

        return decorator

    def describe(self, name: str) -> str:
        """One line on what ``name`` is; "" when it has neither description nor docstring."""
        factory = self.get(name)
        if name in self._descriptions:
            return self._descriptions[name]
        doc = inspect.cleandoc(factory.__doc__ or "")  # its own: not a base class's
        return doc.split("\n\n")[0].replace("\n", " ").replace("``", "").strip()

    def names(self) -> list[str]:
        return sorted(self._factories)

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str) -> Callable[..., T]:
        try:
            return self._factories[name]
        except KeyError:
            raise RegistryError(
                f"unknown {self.kind} {name!r}{did_you_mean(name, self._factories)}; "
                f"valid: {', '.join(self.names()) or '(none registered)'}"
            ) from None

    def build(self, name: str, params: Mapping[str, Any] | None = None, /, **extra: Any) -> T:
        """Instantiate ``name`` with ``params`` (from config) and ``extra`` (from code)."""
        factory = self.get(name)
        config = dict(params or {})
        kwargs = {**config, **extra}
        signature = inspect.signature(factory)
        named = [
            p
            for p in signature.parameters.values()
            if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        ]
        valid = [p.name for p in named if p.name not in self.code_params]
        internal = sorted(set(config) & self.code_params)
        if internal:
            raise RegistryError(
                f"{self.kind} {name!r}: {', '.join(internal)} is set by longroute, not in "
                f"params; valid: {', '.join(valid) or '(none)'}"
            )
        accepts_any = any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()
        )
        if not accepts_any:
            unknown = sorted(set(kwargs) - {p.name for p in named})
            if unknown:
                raise RegistryError(
                    f"{self.kind} {name!r} has no parameter(s) {', '.join(unknown)}; "
                    f"valid: {', '.join(valid) or '(none)'}"
                )
        missing = [
            p.name for p in named if p.default is inspect.Parameter.empty and p.name not in kwargs
        ]
        if missing:
            raise RegistryError(
                f"{self.kind} {name!r} needs parameter(s) {', '.join(missing)}: "
                "give them in its params"
            )
        try:
            return factory(**kwargs)
        except (TypeError, ValueError) as exc:
            raise RegistryError(f"cannot build {self.kind} {name!r}: {exc}") from exc
