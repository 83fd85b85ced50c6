"""The user's Trainer bindings checked against the parameters its constructors accept, before TF.

Gin checks a binding's name at parse time only against the bound class's own ``__init__``, and
accepts any name when that takes ``**kwargs``, as a Trainer subclass forwarding to its parent
usually does. A typo such as ``MyTrainer.embeding_dim = 8`` then passes every check, starts the
whole cluster, and fails on the chief as ``TypeError: Trainer.__init__() got an unexpected keyword
argument`` with a long traceback. Walking the ``__init__`` chain the ``**kwargs`` is forwarded
along (the MRO, up to the first ``__init__`` without ``**kwargs``) names every parameter the class
accepts, so such a binding is one sentence before any task starts.

The walk assumes that an ``__init__`` taking ``**kwargs`` passes them on to its parent (what
``super().__init__(**kwargs)`` does); one that keeps them for itself cannot be checked this way.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Iterator

import gin

from tfdist_trainer.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class InitParameters:
    """The keyword parameters one class's own ``__init__`` declares, and whether it forwards more."""

    owner: type
    names: tuple[str, ...]
    forwards_kwargs: bool


def init_chain(cls: type) -> list[InitParameters] | None:
    """Each ``__init__`` that ``cls(...)`` runs through ``**kwargs``, from cls's own to the last.

    None when a constructor cannot be introspected (a builtin or C extension): nothing is checked
    then, rather than refusing a binding that may be valid.
    """
    chain: list[InitParameters] = []
    seen = set()
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if klass is object:  # object() takes nothing: what reaches it was never accepted
            break
        # gin wraps a configurable class's __init__, its inherited one too: unwrap to find repeats.
        if init is None or inspect.unwrap(init) in seen:
            continue
        seen.add(inspect.unwrap(init))
        parameters = _own_parameters(klass, init)
        if parameters is None:
            return None
        chain.append(parameters)
        if not parameters.forwards_kwargs:
            break
    return chain


def _own_parameters(klass: type, init) -> InitParameters | None:
    """The names `init` takes by keyword (not `self`, not positional-only), or None if opaque."""
    try:
        signature = inspect.signature(init)
    except (TypeError, ValueError):
        return None
    parameters = list(signature.parameters.values())[1:]  # `self`
    names = tuple(
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    )
    forwards = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    return InitParameters(klass, names, forwards)


def accepted_parameters(cls: type) -> tuple[str, ...] | None:
    """Every keyword `cls(...)` accepts along its ``**kwargs`` chain; None if it cannot be known."""
    chain = init_chain(cls)
    return None if chain is None else _names(chain)


def _names(chain: list[InitParameters]) -> tuple[str, ...]:
    """The chain's parameter names, each once, in the order the constructors declare them."""
    names: list[str] = []
    for link in chain:
        names += [name for name in link.names if name not in names]
    return tuple(names)


def check_trainer_bindings(trainer_cls: type) -> None:
    """Raises ConfigError, one sentence, for a gin binding that no ``__init__`` of the Trainer takes.

    Checks the bindings of `trainer_cls` and of each gin-configurable class it derives from
    (``Trainer.*`` included), each against its own chain; gin has already refused unknown
    configurables and names that a ``__init__`` without ``**kwargs`` lacks.
    """
    for klass in trainer_cls.__mro__:
        name = _configurable_name(klass)
        chain = init_chain(klass) if name else None
        if not chain:
            continue
        accepted = _names(chain)
        for scope, parameter in _bindings(klass):
            if parameter not in accepted:
                raise ConfigError(_unknown_parameter(scope, name, parameter, klass, chain))


def _unknown_parameter(
    scope: str, name: str, parameter: str, klass: type, chain: list[InitParameters]
) -> str:
    """The sentence: the binding, the class, a close match, and what the chain accepts."""
    binding = f"{scope}/{name}" if scope else name
    close = difflib.get_close_matches(parameter, _names(chain), n=1)
    hint = f" (did you mean {binding}.{close[0]}?)" if close else ""
    return (
        f"gin binding {binding}.{parameter} names no parameter of {klass.__qualname__}{hint}; "
        f"it accepts {_accepted_text(chain)}."
    )


def _accepted_text(chain: list[InitParameters]) -> str:
    """'a, b, and through **kwargs Trainer's c, d': each class's own names, in the order called."""
    own, forwarded = chain[0], [link for link in chain[1:] if link.names]
    text = ", ".join(own.names) or "no parameter of its own"
    if forwarded:
        parts = [f"{link.owner.__qualname__}'s {', '.join(link.names)}" for link in forwarded]
        text += f", and through **kwargs {' and '.join(parts)}"
    return text


def _configurable_name(klass: type) -> str | None:
    """The name gin knows `klass` by (``MyTrainer``), or None when it is not gin-configurable."""
    configurable = gin.config._INVERSE_REGISTRY.get(klass)  # gin has no public lookup
    return configurable.name if configurable is not None else None


def _bindings(klass: type) -> Iterator[tuple[str, str]]:
    """(scope, parameter) of every parsed binding of `klass`, in every scope.

    gin's public ``get_bindings`` sees the active scope only; the parsed configuration is its
    private ``_CONFIG``: ``{(scope, selector): {parameter: value}}``.
    """
    selector = gin.config._INVERSE_REGISTRY[klass].selector
    for (scope, bound_selector), parameters in list(gin.config._CONFIG.items()):
        if bound_selector == selector:
            for parameter in parameters:
                yield scope, parameter
