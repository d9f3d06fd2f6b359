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
    names and parameters with an error that lists the valid ones.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def decorator(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._factories:
                raise RegistryError(f"{self.kind} {name!r} is already registered")
            self._factories[name] = factory
            return factory

        return decorator

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
        kwargs = {**(params or {}), **extra}
        signature = inspect.signature(factory)
        accepts_any = any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()
        )
        if not accepts_any:
            valid = [
                p.name
                for p in signature.parameters.values()
                if p.kind
                in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            ]
            unknown = sorted(set(kwargs) - set(valid))
            if unknown:
                raise RegistryError(
                    f"{self.kind} {name!r} has no parameter(s) {', '.join(unknown)}; "
                    f"valid: {', '.join(valid) or '(none)'}"
                )
        try:
            return factory(**kwargs)
        except (TypeError, ValueError) as exc:
            raise RegistryError(f"cannot build {self.kind} {name!r}: {exc}") from exc
