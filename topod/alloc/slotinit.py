"""A checked hand-written __init__ for frozen slotted dataclasses (slot_init,
slot_setters). Its own module: a way of building values, shared by the engine's
decision values (topod.alloc.request), the search's results and the cores' choices,
which otherwise have nothing to do with one another."""

from __future__ import annotations

from dataclasses import MISSING


def slot_setters(cls: type) -> tuple:
    """The member descriptors' setters of a frozen slotted dataclass's fields, in order."""
    return tuple(getattr(cls, name).__set__ for name in cls.__dataclass_fields__)


def slot_init(cls: type, init):  # noqa: ANN001, ANN201 - a function, returned as given
    """Install `init` as the __init__ of the frozen slotted dataclass `cls`: a hand-written
    one setting each slot through its member descriptor (slot_setters), where the generated
    one goes through object.__setattr__ by name, about twice as slow (a decision builds a
    Decision, a Performance and a Placement per GPU; the search several SearchResults).
    Checked here: its parameters are the fields, in order, with the fields' defaults, and
    the class has no __post_init__ (which the generated __init__ would call)."""
    code = init.__code__
    names = code.co_varnames[1:code.co_argcount]
    fields = cls.__dataclass_fields__
    defaults = tuple(f.default for f in fields.values() if f.default is not MISSING)
    if names != tuple(fields) or (init.__defaults__ or ()) != defaults or any(
            f.default_factory is not MISSING for f in fields.values()):
        raise TypeError(f"{init.__name__} does not take {cls.__name__}'s fields {tuple(fields)} with their defaults")
    if hasattr(cls, "__post_init__"):  # the generated __init__ calls it; a hand-written one would skip it
        raise TypeError(f"{cls.__name__} has a __post_init__: keep its generated __init__")
    init.__name__, init.__qualname__ = "__init__", f"{cls.__qualname__}.__init__"
    cls.__init__ = init
    return init
