"""topod.record against what it stands in for: a dataclass with the same fields behaves the
same (equality, hashing, repr, replace, freezing, copies), and each misuse gets the error
a dataclass gives."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topod.model import Cpu, NumaNode, Topology
from topod.record import FrozenInstanceError, field, field_names, record, replace


@record
class Point:
    x: int
    y: int
    label: str = "p"
    tags: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class DataPoint:
    x: int
    y: int
    label: str = "p"
    tags: tuple[str, ...] = ()


@record
class Point2:  # same fields as Point, another class
    x: int
    y: int
    label: str = "p"
    tags: tuple[str, ...] = ()


values = st.tuples(st.integers(), st.integers(), st.text(max_size=5), st.tuples(st.text(max_size=3)))


@settings(max_examples=300, deadline=None)
@given(values, values)
def test_equality_hash_and_repr_match_a_frozen_dataclass(a, b):
    ra, rb, da, db = Point(*a), Point(*b), DataPoint(*a), DataPoint(*b)
    assert (ra == rb) == (da == db)
    assert (ra != rb) == (da != db)
    assert hash(ra) == hash(da) and hash(rb) == hash(db)  # both hash the fields' tuple
    assert repr(ra).replace("Point", "DataPoint", 1) == repr(da)


@settings(max_examples=200, deadline=None)
@given(values)
def test_keyword_positional_and_default_construction_agree(a):
    x, y, label, tags = a
    assert Point(x, y, label, tags) == Point(x=x, y=y, label=label, tags=tags) == Point(x, y, tags=tags, label=label)
    assert Point(x, y) == Point(x, y, "p", ())


def test_another_class_with_the_same_fields_is_not_equal():
    assert Point(1, 2) != Point2(1, 2)
    assert Point(1, 2) != (1, 2, "p", ())


def test_frozen_fields_cannot_be_assigned_or_deleted_and_there_is_no_dict():
    point = Point(1, 2)
    with pytest.raises(FrozenInstanceError):
        point.x = 5
    with pytest.raises(FrozenInstanceError):
        del point.y
    with pytest.raises(AttributeError):
        point.__dict__
    assert point.x == 1 and point.y == 2
    assert issubclass(FrozenInstanceError, AttributeError)


def test_replace_makes_a_new_record_and_leaves_the_old_one():
    point = Point(1, 2, tags=("a",))
    moved = replace(point, y=7)
    assert moved == Point(1, 7, "p", ("a",)) and point == Point(1, 2, "p", ("a",))
    with pytest.raises(TypeError, match="no field 'z'"):
        replace(point, z=1)
    assert replace(DataPoint(1, 2), x=3) == DataPoint(3, 2)  # a dataclass goes to dataclasses.replace
    with pytest.raises(TypeError, match="dataclass instances"):
        replace((1, 2), x=3)
    with pytest.raises(TypeError, match="not a record"):
        field_names(DataPoint)


def test_each_bad_construction_gets_the_error_a_dataclass_gives():
    with pytest.raises(TypeError, match="missing required argument: 'y'"):
        Point(1)
    with pytest.raises(TypeError, match="missing required argument: 'x'"):
        Point(y=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        Point(1, 2, z=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        Point(x=1, z=2, label="a", tags=())  # as many names as fields, one of them wrong
    with pytest.raises(TypeError, match="missing required argument: 'y'"):
        Point(1, label="a")
    with pytest.raises(TypeError, match="multiple values for argument 'x'"):
        Point(1, 2, x=3)
    with pytest.raises(TypeError, match="takes 5 positional arguments but 6 were given"):
        Point(1, 2, "a", (), "extra")
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
        @record
        class Bad:
            a: int = 0
            b: int
    with pytest.raises(ValueError, match="both default and default_factory"):
        field(default=1, default_factory=list)
    with pytest.raises(ValueError, match="mutable default list for field items"):
        @record
        class Shared:
            items: list = []


def test_factories_give_each_record_its_own_value_and_post_init_runs_after_fields():
    @record(frozen=False)
    class Table:
        name: str
        rows: list = field(default_factory=list)
        index: dict = field(init=False, default_factory=dict, repr=False, compare=False)
        size: int = field(init=False, default=0)

        def __post_init__(self):
            self.index = {row: n for n, row in enumerate(self.rows)}
            self.size = len(self.rows)

    first, second = Table("a"), Table("b")
    first.rows.append(1)
    assert second.rows == [] and first.rows is not second.rows
    table = Table("t", ["x", "y"])
    assert table.index == {"x": 0, "y": 1} and table.size == 2
    assert "index" not in repr(table) and "rows=['x', 'y']" in repr(table)
    other = Table("t", ["x", "y"])
    other.index = {}
    assert table == other  # index does not take part in equality
    with pytest.raises(TypeError, match="unexpected keyword argument 'size'"):
        Table("t", size=3)
    with pytest.raises(ValueError, match="not set by __init__"):
        replace(table, size=4)
    assert replace(table, name="u").size == 2  # __post_init__ ran for the new one
    assert field_names(Table) == ("name", "rows", "index", "size")


def test_a_mutable_record_can_change_but_is_unhashable_and_still_slotted():
    @record(frozen=False)
    class Counter:
        hits: int = 0

    counter = Counter()
    counter.hits += 1
    assert counter == Counter(1)
    with pytest.raises(TypeError, match="unhashable"):
        hash(counter)
    with pytest.raises(AttributeError):
        counter.misses = 1  # no such slot


def test_copies_and_pickles_keep_every_field_without_running_init_again():
    @record
    class Stamped:
        value: int
        seen: tuple = field(init=False, default=())

        def __post_init__(self):
            object.__setattr__(self, "seen", (self.value,))  # would run twice if copies re-ran it

    original = Stamped(3)
    for clone in (copy.copy(original), copy.deepcopy(original)):
        assert clone == original and clone.seen == (3,)
    point = Point(1, 2, "q", ("t",))
    assert pickle.loads(pickle.dumps(point)) == point
    topology_part = Cpu(id=3, online=True, core=1, package=0, numa_node=0, siblings=(3, 4), llc=0)
    assert pickle.loads(pickle.dumps(topology_part)) == topology_part


def test_model_classes_are_records_with_the_dataclass_behaviour_their_users_rely_on():
    node = NumaNode(id=0, cpus=(0, 1), distances={0: 10}, memory_bytes=None)
    assert node.hugepages == {} and node.hugepages is not NumaNode(1, (), {}, None).hugepages
    with pytest.raises(TypeError, match="unhashable"):
        hash(node)  # a dict field makes it unhashable, as it did as a dataclass
    cpu = Cpu(id=3, online=True, core=1, package=0, numa_node=0, siblings=(3, 4), llc=0)
    assert {cpu: 1}[Cpu(3, True, 1, 0, 0, (3, 4), 0)] == 1
    assert replace(cpu, isolated=True).isolated and not cpu.isolated
    assert field_names(Topology)[:3] == ("root", "numa_nodes", "cpus")
    assert Topology.__match_args__[-1] == "hostname"


def test_a_record_extends_a_record_with_its_fields_after_the_base_ones():
    @record
    class Labelled(Point):
        weight: float = 1.0

    heavy = Labelled(1, 2, weight=3.5)
    assert field_names(heavy) == ("x", "y", "label", "tags", "weight")
    assert (heavy.x, heavy.label, heavy.weight) == (1, "p", 3.5)
    assert heavy != Point(1, 2) and replace(heavy, x=9) == Labelled(9, 2, weight=3.5)
    with pytest.raises(FrozenInstanceError):
        heavy.weight = 0.0
