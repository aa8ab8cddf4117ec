"""Command-line flags made from settings fields: one definition of each setting.

``add(parser, "--max-queue", GatewaySettings, "max_queue", type=int)`` adds a flag whose help
is the field's description, its default and the ``NIGHTJAR_*`` variable it reads (so
``--help`` always states both), and whose value, when the flag is given, is handed to the
settings record as a keyword argument (``given``): the record reads the environment for
everything else, once, typed and validated by pydantic (``shared.settings``). A flag that
was not given leaves nothing in the namespace (argparse's SUPPRESS), so the field's default
and the environment are never copied or parsed here.
"""

from __future__ import annotations

import argparse
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from nightjar.options import UsageError
from shared.settings import env_name

# a flag's dest -> its name, for error messages (``build``)
_FLAG_NAMES: dict[str, str] = {}


def shown(value: Any) -> str:
    """A default as the help shows it."""
    if value is None or value == () or value == [] or value == {}:
        return "none"
    if value == "":
        return "empty"
    if value is True:
        return "on"
    if value is False:
        return "off"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def field_default(cls: type[BaseSettings], field: str) -> Any:
    info = cls.model_fields[field]
    if info.default is not PydanticUndefined:
        return info.default
    factory: Any = info.default_factory
    return factory() if factory is not None else None


def add(
    parser: argparse.ArgumentParser,
    flag: str,
    cls: type[BaseSettings],
    field: str,
    *,
    default: Any = PydanticUndefined,
    help: str | None = None,
    **kwargs: Any,
) -> None:
    """A flag for ``cls.field``, its dest the field's name (``given`` matches them), its help
    the field's description unless ``help`` says more for the command line. ``default`` is
    what the help shows where the field's default is made at run time (``--worker-id``)."""
    if cls.model_fields.get(field) is None:
        raise KeyError(f"{cls.__name__} has no field {field!r}")
    info = cls.model_fields[field]
    text = (help or info.description or "").replace("%", "%%")
    value = field_default(cls, field) if default is PydanticUndefined else default
    _FLAG_NAMES[field] = flag
    if kwargs.get("action") in (None, "append") and "metavar" not in kwargs:
        kwargs["metavar"] = flag.lstrip("-").upper().replace("-", "_")
    parser.add_argument(
        flag,
        dest=field,
        default=argparse.SUPPRESS,
        help=f"{text} (default: {shown(value).replace('%', '%%')}; env {env_name(cls, field)})",
        **kwargs,
    )


def given(args: argparse.Namespace, cls: type[BaseSettings]) -> dict[str, Any]:
    """The flags given on the command line that are fields of ``cls``."""
    return {k: v for k, v in vars(args).items() if k in cls.model_fields}


S = TypeVar("S", bound=BaseSettings)


def with_defaults(cls: type[S], **defaults: Any) -> type[S]:
    """``cls`` with other field defaults: what a command changes (``nightjar gateway`` talks
    to a real Redis by default, the embedded services of ``up`` to memory://). The
    environment still wins over them, and flags over both."""
    import copy

    from pydantic import create_model

    fields: dict[str, Any] = {}
    for name, value in defaults.items():
        info = copy.copy(cls.model_fields[name])
        info.default, info.default_factory = value, None
        fields[name] = (info.annotation, info)
    made: type[S] = create_model(cls.__name__, __base__=cls, **fields)
    return made


def build(cls: type[BaseSettings], **values: Any) -> Any:
    """``cls(**values)``, the environment read once; a bad value is one ``UsageError``
    line naming its flag and variable."""
    try:
        return cls(**values)
    except ValidationError as exc:
        raise UsageError(one_line(exc, cls)) from None


def one_line(exc: ValidationError, cls: type[BaseSettings]) -> str:
    parts = []
    for err in exc.errors():
        loc = str(err["loc"][0]) if err["loc"] else ""
        field = next((f for f, i in cls.model_fields.items() if loc in (f, i.validation_alias)), None)
        if field is None:
            parts.append(str(err["msg"]))
            continue
        flag = _FLAG_NAMES.get(field, "")
        where = f"{flag} / {env_name(cls, field)}" if flag else env_name(cls, field)
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)
