"""The run-config key schema: :class:`Key` (one key: type, default, allowed values) and
:class:`ConfigError`. The keys themselves are declared in :mod:`fedclust.config` (common keys)
and next to each method (``KEYS``); this module imports none of them."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fedclust.errors import BadInputError

Scalar = bool | int | float | str


class ConfigError(BadInputError, ValueError):
    """A run-config value is invalid; the message says which, why, and how to fix it."""

    data_free = True


class UnknownArgumentError(ConfigError, TypeError):
    """An unknown keyword argument to a fedclust function or class: a ``TypeError`` as Python's
    own, and a :class:`ConfigError` (the launchers print it as bad input); the message names the
    close matches."""


class MissingExtraError(ConfigError, ImportError):
    """A method needs a package of an optional extra that is not installed here; the message
    is the ``pip install`` line to type."""


def refuse_unknown(owner: str, unknown: Sequence[str], allowed: Sequence[str],
                   notes: dict[str, str] | None = None) -> None:
    """Raise :class:`UnknownArgumentError` for the keyword arguments ``unknown`` of ``owner``
    (e.g. ``"ExactFCM.start()"``), each with its closest match in ``allowed`` or a note
    (``notes``: why a known name of another API is not one here)."""
    if not unknown:
        return
    import difflib

    notes = notes or {}
    hints = []
    for name in sorted(unknown):
        close = difflib.get_close_matches(name, list(allowed), n=1)
        hints.append(f"{name!r}" + (f" ({notes[name]})" if name in notes else
                                    f" (did you mean {close[0]!r}?)" if close else ""))
    raise UnknownArgumentError(f"{owner} got unknown keyword argument(s) {', '.join(hints)}. "
                               f"Allowed: {', '.join(allowed)}")


@dataclass(frozen=True)
class Key:
    """One run-config key.

    Parameters
    ----------
    name : str
        Dotted key as used in ``--run-config`` (``"fcm.m"``).
    type : type
        One of ``bool, int, float, str``; values are cast to it.
    default : scalar
        Default written to ``pyproject.toml``.
    help : str
        One-line description (README and error messages).
    low, high : float, optional
        Inclusive bounds unless ``low_open``/``high_open``.
    choices : sequence of str, optional
        Allowed values for string keys.
    check : callable, optional
        Extra check ``value -> str | None`` returning an error text.
    allowed_text : str, optional
        What the allowed values are, in words, when the type and bounds do not say it (a
        key that takes ``"auto"`` or a number).
    """

    name: str
    type: type
    default: Scalar
    help: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: Sequence[str] | None = None
    check: Callable[[Any], str | None] | None = field(default=None, compare=False)
    allowed_text: str | None = None

    def allowed(self) -> str:
        """Human-readable description of the allowed values."""
        if self.allowed_text is not None:
            return self.allowed_text
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.low is None and self.high is None:
            return f"a {self.type.__name__}"
        lo = "-inf" if self.low is None else repr(self.low)
        hi = "inf" if self.high is None else repr(self.high)
        left = "(" if self.low_open or self.low is None else "["
        right = ")" if self.high_open or self.high is None else "]"
        return f"a {self.type.__name__} in {left}{lo}, {hi}{right}"

    def parse(self, raw: Any) -> Scalar:
        """Cast and range-check ``raw``; raise :class:`ConfigError` on failure."""
        value = _cast(self, raw)
        problem = None
        if self.choices is not None and value not in self.choices:
            problem = "not an allowed value"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):
                problem = "not a finite number"
            elif self.low is not None and (
                    value < self.low or (self.low_open and value == self.low)):
                problem = "below the allowed range"
            elif self.high is not None and (
                value > self.high or (self.high_open and value == self.high)
            ):
                problem = "above the allowed range"
        if problem is None and self.check is not None:
            problem = self.check(value)
        if problem is not None:
            raise ConfigError(_message(self, raw, problem))
        return value


def _message(key: Key, raw: Any, problem: str) -> str:
    return (
        f"run config '{key.name}' = {raw!r} is invalid ({problem}). "
        f"Allowed: {key.allowed()} — {key.help}. "
        f"Fix: pass e.g. --run-config '{key.name}={_toml(key.default)}' "
        f"or the Hydra override {_hydra_override(key)}."
    )


def _hydra_override(key: Key) -> str:
    """The ``fedclust-sweep`` form of ``key``: run-config keys live under ``app.``; the method
    is chosen with its config group."""
    if key.name == "method":
        return f"method={key.default}"
    value = key.default if isinstance(key.default, str) else _toml(key.default)
    return f"app.{key.name}={value}" if value != "" else f"app.{key.name}=''"


def _toml(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def _cast(key: Key, raw: Any) -> Scalar:
    try:
        if key.type is bool:
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.lower() in ("true", "false", "1", "0"):
                return raw.lower() in ("true", "1")
            if isinstance(raw, int) and raw in (0, 1):
                return bool(raw)
            raise ValueError
        if key.type is int:
            if isinstance(raw, bool):
                raise ValueError
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError
            return int(raw)
        if key.type is float:
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)
        if raw is None or not isinstance(raw, (str, int, float)):   # lists, tables, null
            raise ValueError
        return str(raw)
    except (TypeError, ValueError):
        raise ConfigError(_message(key, raw, f"not a {key.type.__name__}")) from None


# ----------------------------------------------------------------------------------------------


def require(cond: bool, key: str, value: Any, allowed: str, fix: str) -> None:
    """Raise a :class:`ConfigError` for a cross-key rule when ``cond`` is false."""
    if not cond:
        raise ConfigError(f"run config '{key}' = {value!r} is invalid. Allowed: {allowed}. "
                          f"Fix: {fix}.")


# ----------------------------------------------------------------------------------------------
# Settings dataclasses as the one declaration of their keys

#: the ``dataclasses.field`` metadata entry of a field that declares a run-config key
#: (:func:`param`) or holds a key declared elsewhere (:func:`ref`)
PARAM = "fedclust.param"
REF = "fedclust.ref"


@dataclass(frozen=True)
class Param:
    """How a Settings field declares its run-config key (:func:`param`)."""

    default: Scalar
    help: str
    name: str | None = None
    type: type | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: Sequence[str] | None = None
    check: Callable[[Any], str | None] | None = field(default=None, compare=False)
    allowed_text: str | None = None
    convert: Callable[[Any], Any] | None = field(default=None, compare=False)
    render: Callable[[Any], Scalar] | None = field(default=None, compare=False)


def param(default: Scalar, help: str, *, name: str | None = None, type: type | None = None,
          low: float | None = None, high: float | None = None, low_open: bool = False,
          high_open: bool = False, choices: Sequence[str] | None = None,
          check: Callable[[Any], str | None] | None = None, allowed_text: str | None = None,
          convert: Callable[[Any], Any] | None = None,
          render: Callable[[Any], Scalar] | None = None) -> Any:
    """A Settings field that declares its run-config key: the one place of its default, type,
    bounds and help (the :class:`Key` is generated, :func:`settings`).

    Parameters
    ----------
    default : scalar
        The key's default (``pyproject.toml``, ``conf/``, the Strategy's signature).
    help : str
        One line for ``docs/run-config.md``, error messages and the docstrings.
    name : str, optional
        The key's name after the class's prefix when it is not the field's name with ``-``
        for ``_`` (``"lambda"`` for the field ``lam``).
    type : type, optional
        The key's type when it is not the default's.
    low, high, low_open, high_open, choices, check, allowed_text
        As :class:`Key`.
    convert : callable, optional
        Validated key value → field value (``"100,64,32"`` → ``(100, 64, 32)``).
    render : callable, optional
        Field value → key value, the inverse of ``convert``.
    """
    spec = Param(default, help, name, type, low, high, low_open, high_open, choices, check,
                 allowed_text, convert, render)
    return field(default=convert(default) if convert else default, metadata={PARAM: spec})


@dataclass(frozen=True)
class Ref:
    """A Settings field that holds a key declared by another Settings class (:func:`ref`)."""

    key: Key
    doc: str = ""
    convert: Callable[[Any], Any] | None = field(default=None, compare=False)


def ref(key: Key, doc: str = "", convert: Callable[[Any], Any] | None = None) -> Any:
    """A Settings field that holds ``key`` (declared elsewhere: a common key, or a key another
    Settings class of the method declares), with ``key``'s default; ``doc`` says what the
    field does here (default: the key's help)."""
    default = convert(key.default) if convert else key.default
    return field(default=default, metadata={REF: Ref(key, doc, convert)})


class KeyName:
    """A class attribute that reads as the run-config key of one of the class's fields
    (``clusters_key = KeyName("n_clusters")`` → ``"fcm.n-clusters"``)."""

    def __init__(self, field: str) -> None:
        self.field = field

    def __get__(self, obj: object, owner: Any) -> Any:
        if "__dataclass_fields__" not in owner.__dict__:   # while @dataclass makes the class
            return self
        return owner.key_of(self.field)


class KeyedSettings:
    """Base of the frozen Settings dataclasses whose fields declare (:func:`param`) or hold
    (:func:`ref`) run-config keys. Build them with :func:`settings`.

    Every bound field is checked against its key when the object is made (``Cls(n=1)`` is
    refused as ``--run-config 'x.n=1'`` is), and takes the key's type (``m=2`` → ``2.0``).
    """

    #: the prefix of the keys the fields declare (``"fcm."``)
    key_prefix: ClassVar[str] = ""
    #: whether a new object's fields are checked against their keys (False: a view of keys
    #: another class declares and checks, which tests and probes may push past the ranges)
    checked: ClassVar[bool] = True

    @classmethod
    def bound(cls) -> list[tuple[str, Key, Param | Ref]]:
        """``(field name, key, how)`` of every field bound to a key, in field order."""
        cached = cls.__dict__.get("_bound")
        if cached is None:
            import dataclasses

            cached = []
            for f in dataclasses.fields(cls):   # type: ignore[arg-type]
                if PARAM in f.metadata:
                    spec = f.metadata[PARAM]
                    cached.append((f.name, _key_of(cls.key_prefix, f.name, spec), spec))
                elif REF in f.metadata:
                    cached.append((f.name, f.metadata[REF].key, f.metadata[REF]))
            cls._bound = cached
        return cached

    @classmethod
    def keys(cls) -> list[Key]:
        """The keys this class declares (not those it refers to), in field order."""
        return [key for _, key, how in cls.bound() if isinstance(how, Param)]

    @classmethod
    def key_of(cls, name: str) -> str:
        """The run-config key of field ``name``."""
        return next(key.name for f, key, _ in cls.bound() if f == name)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Any:
        """The settings of a validated run config (every bound key present)."""
        return cls(**{name: cfg[key.name] for name, key, _ in cls.bound()})

    def to_config(self, names: Sequence[str] | None = None) -> dict[str, Scalar]:
        """The fields ``names`` (default: every bound one) as run-config keys and values."""
        out = {}
        for name, key, how in self.bound():
            if names is None or name in names:
                value = getattr(self, name)
                render = how.render if isinstance(how, Param) else None
                out[key.name] = render(value) if render else value
        return out

    def __post_init__(self) -> None:
        for name, key, how in self.bound():
            value = getattr(self, name)
            if self.checked:
                render = how.render if isinstance(how, Param) else None
                value = key.parse(render(value) if render else value)
            if how.convert is not None:
                value = how.convert(value)
            object.__setattr__(self, name, value)

    @classmethod
    def parameters(cls, names: Sequence[str] | None = None) -> list[tuple[str, Key, str]]:
        """``(field name, key, type text)`` of the fields ``names`` (default: the declared
        ones), for a signature or a docstring."""
        import dataclasses

        types = {f.name: f.type for f in dataclasses.fields(cls)}   # type: ignore[arg-type]
        return [(name, key, str(types[name])) for name, key, how in cls.bound()
                if (isinstance(how, Param) if names is None else name in names)]


def _key_of(prefix: str, name: str, spec: Param) -> Key:
    default = spec.default
    return Key(prefix + (spec.name or name.replace("_", "-")), spec.type or type(default),
               default, spec.help, spec.low, spec.high, spec.low_open, spec.high_open,
               spec.choices, spec.check, spec.allowed_text)


def settings(prefix: str = "", document: bool = True) -> Callable[[type], type]:
    """Class decorator: a frozen dataclass of :class:`KeyedSettings` whose fields declare the
    keys ``<prefix><field name>``; with ``document``, its docstring gains an ``Attributes``
    section written from the fields (type, default, help and key)."""
    import dataclasses

    def wrap(cls: type) -> type:
        cls.key_prefix = prefix
        cls = dataclasses.dataclass(frozen=True)(cls)
        if not document:
            return cls
        names = [name for name, _, _ in cls.bound()]
        cls.__doc__ = ((cls.__doc__ or "").rstrip() + "\n\n    Attributes\n    ----------\n"
                       + "\n".join(describe(cls, names)) + "\n")
        return cls
    return wrap


def describe(cls: Any, names: Sequence[str], args: Mapping[str, str] | None = None,
             indent: str = "    ") -> list[str]:
    """numpydoc lines of the fields ``names`` of a :class:`KeyedSettings` class (``args``: the
    name to show for a field, when not its own)."""
    import dataclasses

    types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    lines = []
    for name, key, how in cls.bound():
        if name not in names:
            continue
        kind = types[name]
        shown = (args or {}).get(name, name)
        lines.append(f"{indent}{shown} : {kind}, default {_toml(key.default)}")
        text = how.doc or key.help if isinstance(how, Ref) else key.help
        import textwrap

        lines += textwrap.wrap(f"{_sentence(text)} (``{key.name}``; {key.allowed()}).", 96,
                               initial_indent=indent + "    ", subsequent_indent=indent + "    ",
                               break_long_words=False, break_on_hyphens=False)
    return lines


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] if text else text

