"""`torpor.schemas.frozen`: the faster `__init__` builds what the generated one builds."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import sys
import types

import pytest

import torpor.processors.fold.authority
import torpor.processors.fold.effects
import torpor.processors.fold.facts
import torpor.processors.fold.state
import torpor.processors.models.provider
import torpor.processors.models.stage
import torpor.processors.step
import torpor.schemas.codec
import torpor.schemas.framing
import torpor.schemas.records
import torpor.streams.log
import torpor.streams.task
from torpor.schemas.frozen import fast_inits, original_init
from torpor.schemas.records import HistoryEntry, TextBlock, UserEntry

MODULES = (torpor.schemas.records, torpor.processors.fold.state, torpor.processors.fold.effects,
           torpor.processors.fold.facts,
           torpor.processors.fold.authority, torpor.processors.step, torpor.streams.log,
           torpor.processors.models.provider, torpor.processors.models.stage,
           torpor.schemas.codec, torpor.schemas.framing,
           torpor.streams.task)
REPLACED = tuple(
    value for module in MODULES for value in vars(module).values()
    if isinstance(value, type) and value.__module__ == module.__name__ and dataclasses.is_dataclass(value)
    and value.__dataclass_params__.frozen  # type: ignore[attr-defined]
    and "__slots__" in value.__dict__  # LogTopic has none (a generic alias sets `__orig_class__`)
)


def test_every_frozen_record_of_the_hot_modules_has_the_fast_init() -> None:
    assert REPLACED
    for cls in REPLACED:
        assert cls.__init__ is not original_init(cls), cls


@pytest.mark.parametrize("cls", REPLACED, ids=lambda cls: cls.__name__)
def test_the_fast_init_has_the_generated_signature_and_stores_the_same_fields(cls: type) -> None:
    assert inspect.signature(cls.__dict__["__init__"]) == inspect.signature(original_init(cls))
    names = [f.name for f in dataclasses.fields(cls)]
    if hasattr(cls, "__post_init__"):  # it validates: the defaults (every such class has them)
        values = [f.default for f in dataclasses.fields(cls)]
        assert dataclasses.MISSING not in values
    else:
        values = [object() for _ in names]
    fast = cls(**dict(zip(names, values, strict=True)))
    if not cls.__dataclass_params__.init:  # type: ignore[attr-defined]
        # An __init__ written for the compiled build (fold.effects): its stores would meet the
        # frozen __setattr__ here, which is why it was replaced; the fast one stores the fields.
        generated: object = object.__new__(cls)
        with pytest.raises(dataclasses.FrozenInstanceError):
            original_init(cls)(generated, *values)
        for name, value in zip(names, values, strict=True):
            assert getattr(fast, name) is value
        return
    generated = object.__new__(cls)
    original_init(cls)(generated, *values)
    for name, value in zip(names, values, strict=True):
        assert getattr(fast, name) is value is getattr(generated, name)


def test_defaults_keyword_only_and_post_init_behave_as_generated() -> None:
    calls: list[str] = []
    module = types.ModuleType("frozen_probe")
    sys.modules[module.__name__] = module
    try:
        @dataclasses.dataclass(frozen=True, slots=True)
        class Probe:
            a: int
            b: str = "b"
            c: tuple[int, ...] = dataclasses.field(default=(), kw_only=True)

            def __post_init__(self) -> None:
                calls.append(f"{self.a}{self.b}{self.c}")
                if self.a < 0:
                    raise ValueError("negative")

        @dataclasses.dataclass(frozen=True, slots=True)
        class WithFactory:
            items: list[int] = dataclasses.field(default_factory=list)

        @dataclasses.dataclass(frozen=True)
        class Unslotted:
            a: int

        for cls in (Probe, WithFactory, Unslotted):
            cls.__module__ = module.__name__
            setattr(module, cls.__name__, cls)
        assert fast_inits(module.__name__) == (Probe,)
        assert inspect.signature(Probe.__init__) == inspect.signature(original_init(Probe))
        assert Probe(1) == Probe(1, "b", c=())
        assert Probe(2, c=(3,)).c == (3,)
        assert calls == ["1b()", "1b()", "2b(3,)"]
        with pytest.raises(ValueError, match="negative"):
            Probe(-1)
        with pytest.raises(TypeError):
            Probe(1, "b", (3,))  # type: ignore[call-arg]  # c is keyword-only
        with pytest.raises(TypeError):
            Probe()  # type: ignore[call-arg]
        with pytest.raises(dataclasses.FrozenInstanceError):
            Probe(1).a = 2  # type: ignore[misc]
        assert WithFactory().items == []
    finally:
        del sys.modules[module.__name__]


def _probe_module(*classes: type) -> types.ModuleType:
    module = types.ModuleType("frozen_probe_written")
    for cls in classes:
        cls.__module__ = module.__name__
        setattr(module, cls.__name__, cls)
    sys.modules[module.__name__] = module
    return module


def test_an_init_written_for_the_compiled_build_is_replaced_and_a_wrong_one_refused() -> None:
    # What fold.effects does: its own __init__ of plain stores (native stores when compiled),
    # which, run as Python, would meet the frozen __setattr__.
    @dataclasses.dataclass(frozen=True, slots=True, init=False)
    class Written:
        a: int
        b: str = "b"

        def __init__(self, a: int, b: str = "b") -> None:
            self.a = a  # type: ignore[misc]
            self.b = b  # type: ignore[misc]

    @dataclasses.dataclass(frozen=True, slots=True, init=False)
    class OtherParameters:
        a: int

        def __init__(self, a: int, extra: int = 0) -> None:
            self.a = a + extra  # type: ignore[misc]

    @dataclasses.dataclass(frozen=True, slots=True, init=False)
    class OtherDefault:
        a: int = 1

        def __init__(self, a: int = 2) -> None:
            self.a = a  # type: ignore[misc]

    try:
        module = _probe_module(Written)
        with pytest.raises(dataclasses.FrozenInstanceError):
            Written(1)  # the body as written, before fast_inits
        assert fast_inits(module.__name__) == (Written,)
        assert Written(1) == Written(1, "b") and Written(1, b="c").b == "c"
        assert inspect.signature(Written.__init__) == inspect.signature(original_init(Written))
        with pytest.raises(dataclasses.FrozenInstanceError):
            Written(1).a = 2  # type: ignore[misc]
        for wrong in (OtherParameters, OtherDefault):
            module = _probe_module(wrong)
            with pytest.raises(TypeError, match=wrong.__name__):
                fast_inits(module.__name__)
    finally:
        sys.modules.pop("frozen_probe_written", None)


def test_records_built_by_the_fast_init_replace_compare_hash_and_pickle_as_before() -> None:
    entry = HistoryEntry(seq=0, created_at=1, input_id="m", body=UserEntry((TextBlock("hi"),), False))
    later = dataclasses.replace(entry, seq=1)
    assert later.seq == 1 and later.body is entry.body
    assert entry == HistoryEntry(0, 1, "m", UserEntry((TextBlock("hi"),), False))
    assert hash(entry) == hash(HistoryEntry(0, 1, "m", UserEntry((TextBlock("hi"),), False)))
    assert pickle.loads(pickle.dumps(entry)) == entry
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.seq = 5  # type: ignore[misc]
