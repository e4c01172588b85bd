"""Record classes: what `@dataclass(slots=True)` gives, without compiling code at import.

On Python 3.11 `@dataclass` writes each class's `__init__`, `__repr__`, `__eq__`,
`__hash__`, `__setattr__` and `__delattr__` as source and compiles them when the module
is imported: 0.5-1 ms a class on this VM, and `import dataclasses` pulls in `inspect`
(with ast, dis, tokenize) for another 7 ms. The 25 classes that `topoctl topo` loads cost
27 ms that way, a third of a whole run. `record` builds the same methods from closures
over the field names, so nothing is compiled, and `__init__` sets slots through their
member descriptors (what a frozen dataclass does with `object.__setattr__`).

What it supports is what topod's value classes use: fields from annotations, in order,
with defaults or `field(default_factory=..., init=..., repr=..., compare=...)`,
`__post_init__`, frozen or mutable, always slotted. Equality compares the fields of two
objects of the same class; a frozen record hashes its compared fields; a mutable one is
unhashable, as a dataclass with eq is. `replace` (records and dataclasses alike) and
`field_names` stand in for `dataclasses.replace` and `dataclasses.fields`.
"""

from __future__ import annotations

from operator import attrgetter

_MISSING = object()


class FrozenInstanceError(AttributeError):
    """Assigning to or deleting a field of a frozen record."""


class Field:
    __slots__ = ("default", "default_factory", "init", "repr", "compare")

    def __init__(self, default: object, default_factory: object, init: bool, repr: bool, compare: bool) -> None:
        self.default, self.default_factory = default, default_factory
        self.init, self.repr, self.compare = init, repr, compare

    @property
    def has_default(self) -> bool:
        return self.default is not _MISSING or self.default_factory is not _MISSING


def field(*, default: object = _MISSING, default_factory: object = _MISSING, init: bool = True,
          repr: bool = True, compare: bool = True) -> Field:  # noqa: A002 - dataclasses' names
    if default is not _MISSING and default_factory is not _MISSING:
        raise ValueError("cannot specify both default and default_factory")
    return Field(default, default_factory, init, repr, compare)


def record(cls: type | None = None, *, frozen: bool = True):
    """Class decorator: `@record` (frozen) or `@record(frozen=False)`."""
    if cls is None:
        return lambda klass: _build(klass, frozen)
    return _build(cls, frozen)


def field_names(record_or_class: object) -> tuple[str, ...]:
    klass = record_or_class if isinstance(record_or_class, type) else type(record_or_class)
    try:
        return klass.__record_fields__
    except AttributeError:
        raise TypeError(f"{klass.__name__} is not a record") from None


def replace(obj: object, /, **changes: object):
    """A new record like `obj` with `changes`; fields outside __init__ cannot be changed.
    A dataclass is handed to dataclasses.replace, so one `replace` serves both kinds."""
    klass = type(obj)
    if not hasattr(klass, "__record_init__"):
        import dataclasses  # only here: importing it costs what records exist to save

        return dataclasses.replace(obj, **changes)
    init_names = klass.__record_init__
    for name in changes:
        if name not in init_names:
            if name in field_names(klass):
                raise ValueError(f"field {name} is not set by __init__ and cannot be replaced")
            raise TypeError(f"{klass.__name__} has no field {name!r}")
    values = {name: changes[name] if name in changes else getattr(obj, name) for name in init_names}
    return klass(**values)


def _fields_of(cls: type) -> dict[str, Field]:
    specs: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        specs.update(getattr(base, "__record_specs__", {}))
    for name in cls.__dict__.get("__annotations__", {}):
        value = cls.__dict__.get(name, _MISSING)
        spec = value if isinstance(value, Field) else Field(value, _MISSING, True, True, True)
        if spec.default is not _MISSING and type(spec.default).__hash__ is None:  # list, dict, set
            raise ValueError(f"mutable default {type(spec.default).__name__} for field {name} is not "
                             f"allowed: use default_factory")  # one object would be shared by all
        specs[name] = spec
    return specs


def _build(cls: type, frozen: bool) -> type:
    specs = _fields_of(cls)
    names = tuple(specs)
    init_names = tuple(name for name, spec in specs.items() if spec.init)
    required_seen_default = False
    for name in init_names:
        if required_seen_default and not specs[name].has_default:
            raise TypeError(f"non-default argument {name!r} follows default argument")
        required_seen_default = required_seen_default or specs[name].has_default
    namespace = {key: value for key, value in cls.__dict__.items()
                 if key not in names and key not in ("__dict__", "__weakref__")}
    own = tuple(name for name in names if name not in getattr(cls, "__record_fields__", ()))
    namespace["__slots__"] = own
    klass = type(cls)(cls.__name__, cls.__bases__, namespace)
    klass.__qualname__ = cls.__qualname__
    setters = tuple(getattr(klass, name).__set__ for name in names)
    klass.__record_fields__ = names
    klass.__record_init__ = init_names
    klass.__record_specs__ = specs
    klass.__match_args__ = init_names
    klass.__init__ = _make_init(klass, specs, init_names, setters)
    klass.__repr__ = _make_repr(tuple(name for name in names if specs[name].repr))
    compared = tuple(name for name in names if specs[name].compare)
    values_of = _getter(compared)
    klass.__eq__ = _make_eq(values_of)
    klass.__hash__ = _make_hash(values_of) if frozen else None
    klass.__reduce__ = _make_reduce(_getter(names))
    if frozen:
        klass.__setattr__, klass.__delattr__ = _frozen_setattr, _frozen_delattr
    return klass


def _getter(names: tuple[str, ...]):
    """obj -> tuple of those fields (attrgetter returns a bare value for one name)."""
    if len(names) == 1:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    if not names:
        return lambda obj: ()
    return attrgetter(*names)


def _make_init(klass: type, specs: dict[str, Field], init_names: tuple[str, ...], setters: tuple):
    by_name = dict(zip(specs, setters))
    init_pairs = tuple((by_name[name], name) for name in init_names)
    # Fields outside __init__ start from their default or factory, as in dataclasses.
    later = tuple((by_name[name], spec) for name, spec in specs.items() if not spec.init and spec.has_default)
    post_init = getattr(klass, "__post_init__", None)
    count = len(init_names)
    bind, argument_error = _binder(klass.__qualname__, {name: specs[name] for name in init_names})

    def __init__(self, *args, **kwargs):
        # The common call names every field: nothing to bind. A wrong name in it shows as
        # a missing field below.
        given = bind(args, kwargs) if args or len(kwargs) != count else kwargs
        try:
            for setter, name in init_pairs:
                setter(self, given[name])
        except KeyError:
            raise argument_error(args, kwargs) from None
        for setter, spec in later:
            setter(self, spec.default if spec.default is not _MISSING else spec.default_factory())
        if post_init is not None:
            post_init(self)

    __init__.__qualname__ = f"{klass.__qualname__}.__init__"
    return __init__


def _binder(title: str, specs: dict[str, Field]):
    """bind(args, kwargs) -> every __init__ field by name, from the arguments, defaults and
    factories; argument_error(args, kwargs) -> the TypeError a dataclass raises for that
    call (None for a good call)."""
    names = tuple(specs)
    known = frozenset(names)
    defaults = {name: spec.default for name, spec in specs.items() if spec.default is not _MISSING}
    factories = tuple((name, spec.default_factory) for name, spec in specs.items()
                      if spec.default_factory is not _MISSING)
    optional = frozenset(name for name, spec in specs.items() if spec.has_default)

    def argument_error(args: tuple, kwargs: dict) -> TypeError | None:
        if len(args) > len(names):
            return TypeError(f"{title}.__init__() takes {len(names) + 1} positional arguments but "
                             f"{len(args) + 1} were given")
        for name in names[:len(args)]:
            if name in kwargs:
                return TypeError(f"{title}.__init__() got multiple values for argument {name!r}")
        for name in kwargs:
            if name not in known:
                return TypeError(f"{title}.__init__() got an unexpected keyword argument {name!r}")
        for name in names[len(args):]:
            if name not in kwargs and name not in optional:
                return TypeError(f"{title}.__init__() missing required argument: {name!r}")
        return None

    def bind(args: tuple, kwargs: dict) -> dict:
        # Merge first, check only when the count is off: a wrong name that stands in for a
        # missing one keeps the count and is caught by __init__'s lookup instead.
        given = {**defaults, **kwargs}
        if args:
            if len(args) > len(names) or any(name in kwargs for name in names[:len(args)]):
                raise argument_error(args, kwargs)
            given.update(zip(names, args))
        for name, factory in factories:
            if name not in given:
                given[name] = factory()
        if len(given) != len(names):
            raise argument_error(args, kwargs)
        return given

    return bind, argument_error


def _make_repr(shown: tuple[str, ...]):
    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in shown)
        return f"{type(self).__qualname__}({inner})"

    return __repr__


def _make_eq(values_of):
    def __eq__(self, other: object):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return values_of(self) == values_of(other)

    return __eq__


def _make_hash(values_of):
    def __hash__(self) -> int:
        return hash(values_of(self))

    return __hash__


def _make_reduce(values_of):
    def __reduce__(self):
        return _restore, (type(self), values_of(self))

    return __reduce__


def _restore(klass: type, values: tuple) -> object:
    """Unpickle or copy: every field as it was, __init__ not run again."""
    obj = klass.__new__(klass)
    for name, value in zip(klass.__record_fields__, values):
        getattr(klass, name).__set__(obj, value)
    return obj


def _frozen_setattr(self, name: str, value: object) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")
