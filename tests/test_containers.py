"""PyTorch-shaped containers (issue 10, point 11): list and dict behaviour, renumbering,
naming, and the errors a user hits when a key or an index is wrong."""

from __future__ import annotations

import gc
from typing import Any

import pytest

import plait
from plait import ModuleDict, ModuleList, Parameter, ParameterDict, ParameterList, Sequential

from .pipelines import Echo


class Upper(plait.Module):
    def forward(self, text: str) -> str:
        return text.upper()


class Exclaim(plait.Module):
    def forward(self, text: str) -> str:
        return text + "!"


class Suffix(plait.Module):
    """A plain step that remembers which one it is."""

    def __init__(self, tag: str) -> None:
        super().__init__()
        self.tag = tag

    def forward(self, text: str) -> str:
        return f"{text}{self.tag}"


def child_names(container: plait.Module) -> list[str]:
    return [name for name, _ in container.named_children()]


def prompts(container: plait.Module) -> dict[str, Any]:
    return container.state_dict()


def param(value: str) -> Parameter:
    return Parameter(value, description="an example")


# -- Sequential -------------------------------------------------------------------------
def test_sequential_of_plain_modules_runs_on_a_direct_call() -> None:
    seq = Sequential(Upper(), Exclaim())
    assert seq("x") == "X!"
    assert Sequential(Exclaim(), Upper())("hi") == "HI!"


def test_empty_sequential_returns_its_single_input_unchanged() -> None:
    payload = {"k": [1, 2]}
    assert Sequential()(payload) is payload
    assert Sequential()("text") == "text"


def test_empty_sequential_rejects_several_arguments_clearly() -> None:
    with pytest.raises(TypeError, match=r"got 2 positional arguments.*pass exactly one input"):
        Sequential()("a", "b")
    with pytest.raises(TypeError, match=r"keyword argument\(s\) 'flag'"):
        Sequential()("a", flag=True)
    with pytest.raises(TypeError, match="got 0 positional arguments"):
        Sequential()()


def test_sequential_append_extend_insert_pop() -> None:
    a, b, c, d = Suffix("a"), Suffix("b"), Suffix("c"), Suffix("d")
    seq = Sequential(a)
    assert seq.append(b) is seq
    assert seq.extend([c]) is seq
    seq.insert(0, d)
    assert list(seq) == [d, a, b, c] and len(seq) == 4
    assert child_names(seq) == ["0", "1", "2", "3"]
    assert seq("") == "dabc"
    assert seq.pop() is c
    assert seq.pop(0) is d
    assert list(seq) == [a, b] and child_names(seq) == ["0", "1"]
    assert seq("") == "ab"


def test_sequential_indexing_negative_and_out_of_range() -> None:
    a, b, c = Suffix("a"), Suffix("b"), Suffix("c")
    seq = Sequential(a, b, c)
    assert seq[0] is a and seq[-1] is c and seq[-3] is a
    with pytest.raises(IndexError, match=r"index 3 is out of range .* length 3 .*-3 to 2"):
        seq[3]
    with pytest.raises(IndexError, match=r"index -4 is out of range"):
        seq[-4]
    with pytest.raises(IndexError, match="the Sequential is empty"):
        Sequential()[0]
    with pytest.raises(IndexError, match="pop from an empty Sequential"):
        Sequential().pop()
    with pytest.raises(TypeError, match="indices must be integers or slices, not str"):
        seq["0"]  # type: ignore[call-overload]


def test_sequential_slice_is_a_sequential_renumbered_from_zero() -> None:
    a, b, c = Suffix("a"), Suffix("b"), Suffix("c")
    seq = Sequential(a, b, c)
    tail = seq[1:3]
    assert type(tail) is Sequential
    assert list(tail) == [b, c] and child_names(tail) == ["0", "1"]
    assert tail("") == "bc"
    assert list(seq[::-1]) == [c, b, a]
    assert len(seq[5:]) == 0
    # the slice shares the modules but does not take them over
    assert child_names(seq) == ["0", "1", "2"]
    assert b._name == "1" and b._parent_module() is seq


def test_sequential_from_a_mapping_keeps_names_through_slicing_and_removal() -> None:
    seq = Sequential({"shout": Upper(), "mark": Exclaim(), "tag": Suffix("?")})
    assert child_names(seq) == ["shout", "mark", "tag"]
    assert seq("x") == "X!?"
    assert seq.shout is seq[0]  # type: ignore[attr-defined]
    tail = seq[1:]
    assert child_names(tail) == ["mark", "tag"]
    del seq[0]
    assert child_names(seq) == ["mark", "tag"]
    seq.append(Suffix("."))
    seq.insert(0, Suffix(">"))
    assert child_names(seq) == ["0", "mark", "tag", "3"]
    assert seq("x") == "x>!?."


def test_sequential_mapping_keys_are_checked() -> None:
    with pytest.raises(
        ValueError, match=r"'forward' would shadow Sequential.forward.*'forward_step'"
    ):
        Sequential({"forward": Upper()})
    with pytest.raises(ValueError, match=r"'append' would shadow Sequential\.append"):
        Sequential({"append": Upper()})
    with pytest.raises(ValueError, match=r"'a.b' is not a valid Python identifier.*'a_b'"):
        Sequential({"a.b": Upper()})
    with pytest.raises(ValueError, match=r"numeric keys are positions"):
        Sequential({"5": Upper()})
    assert child_names(Sequential({"0": Upper(), "named": Exclaim()})) == ["0", "named"]
    with pytest.raises(TypeError, match="must be Sequential's only argument"):
        Sequential(Upper(), {"b": Exclaim()})  # type: ignore[call-overload]


def test_sequential_rejects_non_modules_with_a_hint() -> None:
    with pytest.raises(TypeError, match=r"step #1 expects a Module, got str"):
        Sequential(Upper(), "nope")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="wrap a plain function in a Module subclass"):
        Sequential(str.upper)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="got a single Upper; use append"):
        Sequential().extend(Upper())  # type: ignore[arg-type]


def test_sequential_delete_set_contains_and_iteration() -> None:
    a, b, c, d = Suffix("a"), Suffix("b"), Suffix("c"), Suffix("d")
    seq = Sequential(a, b, c, d)
    del seq[1]
    assert list(seq) == [a, c, d] and child_names(seq) == ["0", "1", "2"]
    del seq[-2:]
    assert list(seq) == [a] and not hasattr(seq, "1") and not hasattr(seq, "2")
    seq[0] = b
    assert list(seq) == [b]
    seq[-1] = c
    assert list(seq) == [c]
    assert c in seq and a not in seq and Suffix("c") not in seq
    assert [m for m in seq] == [c]
    with pytest.raises(IndexError, match="out of range"):
        seq[1] = a


def test_sequential_concatenation() -> None:
    first = Sequential(Suffix("a"), Suffix("b"))
    second = Sequential(Suffix("c"))
    both = first + second
    assert type(both) is Sequential and child_names(both) == ["0", "1", "2"]
    assert both("") == "abc"
    assert len(first) == 2 and len(second) == 1  # operands unchanged
    named = Sequential({"shout": Upper()}) + Sequential({"mark": Exclaim()})
    assert child_names(named) == ["shout", "mark"] and named("x") == "X!"
    with pytest.raises(ValueError, match="two steps named 'shout'"):
        Sequential({"shout": Upper()}) + Sequential({"shout": Upper()})
    first += Sequential(Suffix("z"))
    first += [Suffix("y")]
    assert first("") == "abzy" and child_names(first) == ["0", "1", "2", "3"]
    with pytest.raises(TypeError):
        first + ModuleList([Upper()])  # type: ignore[operator]


def test_sequential_concatenation_adopts_steps_of_a_discarded_operand() -> None:
    last = Echo("last")
    seq = Sequential(Echo("a")) + Sequential(Echo("b"), last)
    gc.collect()  # both operands are gone; their steps live on in seq
    assert list(seq.state_dict()) == ["0.system_prompt", "1.system_prompt", "2.system_prompt"]
    del seq[0]
    assert last._name == "1" and last._parent_module() is seq
    assert last.system_prompt is not None
    assert last.system_prompt.qualified_name == "1.system_prompt"
    assert list(seq.state_dict()) == ["0.system_prompt", "1.system_prompt"]


def test_sequential_state_dict_follows_removal() -> None:
    seq = Sequential(Echo("a"), Echo("b"), Echo("c"))
    assert prompts(seq) == {
        "0.system_prompt": "a",
        "1.system_prompt": "b",
        "2.system_prompt": "c",
    }
    removed = seq.pop(1)
    assert prompts(seq) == {"0.system_prompt": "a", "1.system_prompt": "c"}
    assert [name for name, _ in seq.named_modules()] == ["", "0", "1"]
    assert removed._name is None and removed._parent_module() is None


# -- ModuleList --------------------------------------------------------------------------
def test_module_list_pop_insert_extend_append() -> None:
    a, b, c, d = Upper(), Exclaim(), Upper(), Exclaim()
    ml = ModuleList([a])
    assert ml.append(b) is ml
    assert ml.extend([c]) is ml
    ml.insert(1, d)
    assert list(ml) == [a, d, b, c]
    assert ml.pop() is c  # default: the last one
    assert ml.pop(0) is a
    assert list(ml) == [d, b] and child_names(ml) == ["0", "1"]
    ml.insert(-1, a)  # like list.insert: before the last entry
    ml.insert(100, c)  # past the end appends
    assert list(ml) == [d, a, b, c]
    ml += [Upper()]
    assert len(ml) == 5
    with pytest.raises(IndexError, match="pop from an empty ModuleList"):
        ModuleList().pop()
    with pytest.raises(IndexError, match=r"ModuleList index 7 is out of range"):
        ml.pop(7)


def test_module_list_indexing_slicing_and_membership() -> None:
    a, b, c = Upper(), Exclaim(), Upper()
    ml = ModuleList([a, b, c])
    assert ml[-1] is c and ml[-3] is a
    part = ml[1:]
    assert type(part) is ModuleList and list(part) == [b, c] and child_names(part) == ["0", "1"]
    assert a in ml and Upper() not in ml
    ml[-1] = a
    assert list(ml) == [a, b, a]
    ml[0:2] = [c]
    assert list(ml) == [c, a] and child_names(ml) == ["0", "1"]
    del ml[0:1]
    assert list(ml) == [a]
    with pytest.raises(IndexError, match=r"index -2 is out of range for a ModuleList of length 1"):
        ml[-2] = b
    combined = ModuleList([a]) + ModuleList([b])
    assert type(combined) is ModuleList and list(combined) == [a, b]


def test_module_list_rejects_bad_input_clearly() -> None:
    with pytest.raises(TypeError, match=r"ModuleList\(\) element #1 expects a Module, got int"):
        ModuleList([Upper(), 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"pass its \.values\(\)"):
        ModuleList({"a": Upper()})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="use append"):
        ModuleList().extend(Upper())  # type: ignore[arg-type]
    ml = ModuleList([Upper()])
    with pytest.raises(TypeError, match=r"ModuleList\[0\] = ... expects a Module"):
        ml[0] = "x"  # type: ignore[call-overload]
    assert len(ml) == 1
    with pytest.raises(NotImplementedError, match="iterate over it"):
        ml("x")


def test_module_list_renumbers_names_paths_and_state_after_removal() -> None:
    a, b, c = Echo("a"), Echo("b"), Echo("c")

    class Holder(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.steps = ModuleList([a, b, c])

        def forward(self, x: str) -> Any:
            return x

    holder = Holder()
    del holder.steps[0]
    assert list(holder.state_dict()) == ["steps.0.system_prompt", "steps.1.system_prompt"]
    assert holder.state_dict()["steps.0.system_prompt"] == "b"
    assert [n for n, _ in holder.named_modules()] == ["", "steps", "steps.0", "steps.1"]
    assert (b._name, c._name) == ("0", "1")
    assert b.system_prompt is not None
    assert b.system_prompt.qualified_name == "steps.0.system_prompt"
    # the removed child keeps no stale registration
    assert a._name is None and a._parent_module() is None
    assert not hasattr(holder.steps, "2")
    assert all(m is not a for m in holder.modules())
    # reordering keeps the keys 0..n-1 and the names in step
    holder.steps.insert(0, c)
    assert [n for n, _ in holder.steps.named_children()] == ["0", "1", "2"]
    assert c._name == "0"  # the first key that holds it
    assert list(holder.steps.state_dict()) == ["0.system_prompt", "1.system_prompt"]
    holder.steps.load_state_dict({"0.system_prompt": "C"})
    assert c.system_prompt is not None and c.system_prompt.value == "C"


def test_a_module_first_registered_elsewhere_keeps_its_name() -> None:
    shared = Echo("s")

    class Owner(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.main = shared

        def forward(self, x: str) -> Any:
            return x

    owner = Owner()
    ml = ModuleList([Upper(), shared])
    del ml[0]
    assert shared._name == "main" and shared._parent_module() is owner
    ml.pop()
    assert shared._name == "main" and shared._parent_module() is owner


# -- ModuleDict --------------------------------------------------------------------------
def test_module_dict_pop_clear_and_mapping_views() -> None:
    up, mark = Upper(), Exclaim()
    md = ModuleDict({"up": up, "mark": mark})
    assert list(md.keys()) == ["up", "mark"]
    assert list(md.values()) == [up, mark]
    assert list(md.items()) == [("up", up), ("mark", mark)]
    assert md.up is up  # type: ignore[attr-defined]
    assert md.pop("up") is up
    assert up._name is None and not hasattr(md, "up") and list(md) == ["mark"]
    assert md.pop("gone", None) is None
    assert md.get("mark") is mark and md.get("nope") is None
    md.clear()
    assert len(md) == 0 and list(md.named_children()) == [] and mark._name is None


def test_module_dict_missing_keys_raise_key_error_naming_the_keys() -> None:
    md = ModuleDict({"summarizer": Upper(), "analyzer": Exclaim()})
    with pytest.raises(KeyError, match=r"'missing' is not a key .*'summarizer', 'analyzer'"):
        del md["missing"]
    with pytest.raises(KeyError, match=r"'sumarizer' .* did you mean 'summarizer'"):
        md["sumarizer"]
    with pytest.raises(KeyError, match="'gone' is not a key"):
        md.pop("gone")
    with pytest.raises(KeyError, match="it is empty"):
        ModuleDict().pop("x")
    assert len(md) == 2


def test_module_dict_update_from_mapping_pairs_or_another_dict() -> None:
    a, b, c = Upper(), Exclaim(), Upper()
    md = ModuleDict()
    md.update({"a": a})
    md.update([("b", b)])
    md.update(("k", m) for m in [c])
    assert list(md.items()) == [("a", a), ("b", b), ("k", c)]
    other = ModuleDict(md)
    assert list(other.keys()) == ["a", "b", "k"] and other["a"] is a
    assert a._parent_module() is md  # the first registration keeps it
    assert list(ModuleDict([("x", a), ("y", b)])) == ["x", "y"]


def test_module_dict_update_rejects_anything_else_and_changes_nothing() -> None:
    md = ModuleDict({"a": Upper()})
    with pytest.raises(TypeError, match=r"takes a mapping or an iterable of \(key, Module\) pairs"):
        md.update(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got str"):
        md.update("ab")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"element #1 is str 'c', not a \(key, Module\) pair"):
        md.update([("b", Upper()), "c"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"element #0 has 3 items, not 2"):
        md.update([("b", Upper(), 1)])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"value for key 'c' expects a Module, got int"):
        md.update({"b": Upper(), "c": 3})  # type: ignore[arg-type]
    assert list(md) == ["a"]  # a failed update adds nothing


def test_module_dict_keys_must_not_shadow_methods_or_internals() -> None:
    md = ModuleDict()
    for key in ["forward", "train", "keys", "update", "training"]:
        with pytest.raises(ValueError, match=f"'{key}' would shadow ModuleDict.{key}"):
            md[key] = Upper()
    with pytest.raises(ValueError, match=r"'_children' starts with '_'.*'children'"):
        md["_children"] = Upper()
    with pytest.raises(ValueError, match=r"'1st' is not a valid Python identifier.*'k_1st'"):
        md["1st"] = Upper()
    with pytest.raises(ValueError, match=r"'a\.b' is not a valid Python identifier"):
        ModuleDict({"a.b": Upper()})
    with pytest.raises(TypeError, match="keys must be str, got int"):
        md[3] = Upper()  # type: ignore[index]
    assert len(md) == 0 and callable(md.forward) and md.training is False


def test_module_dict_overwrite_releases_the_old_child() -> None:
    old, new = Upper(), Exclaim()
    md = ModuleDict({"step": old})
    md["step"] = new
    assert md["step"] is new and old._name is None and new._name == "step"
    assert [n for n, _ in md.named_modules()] == ["", "step"]
    with pytest.raises(NotImplementedError, match="index it"):
        md("x")


# -- ParameterList ------------------------------------------------------------------------
def test_parameter_list_shape_and_renumbering() -> None:
    p0, p1, p2, p3 = param("zero"), param("one"), param("two"), param("three")
    pl = ParameterList([p0, p1])
    assert pl.append(p2) is pl
    pl.insert(0, p3)
    assert list(pl) == [p3, p0, p1, p2]
    assert pl.pop() is p2 and pl.pop(0) is p3
    assert p2.owner is None and p2._name is None
    assert pl.state_dict() == {"0": "zero", "1": "one"}
    assert (p0._name, p1._name) == ("0", "1")
    pl.extend([p2])
    pl += [p3]
    part = pl[1:3]
    assert type(part) is ParameterList and list(part) == [p1, p2]
    assert p1.owner is pl  # a slice does not take parameters over
    assert pl[-1] is p3 and p0 in pl and param("zero") not in pl
    pl[-1] = p2
    assert list(pl) == [p0, p1, p2, p2]
    del pl[1:3]
    assert list(pl) == [p0, p2] and list(pl.state_dict()) == ["0", "1"]
    assert p2._name == "1" and p1.owner is None
    pl[0:1] = [p1, p3]
    assert list(pl) == [p1, p3, p2]
    with pytest.raises(IndexError, match=r"ParameterList index 3 is out of range .*-3 to 2"):
        pl[3]
    with pytest.raises(IndexError, match="pop from an empty ParameterList"):
        ParameterList().pop()


def test_parameter_list_errors_name_the_fix() -> None:
    with pytest.raises(TypeError, match=r"element #0 expects a Parameter, got str .*Parameter\("):
        ParameterList(["plain text"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="use append"):
        ParameterList().extend(param("x"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="indices must be integers or slices"):
        ParameterList([param("x")])["0"]  # type: ignore[call-overload]


def test_parameter_list_in_a_module_keeps_paths_consistent() -> None:
    class FewShot(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.examples = ParameterList([param("e0"), param("e1"), param("e2")])

        def forward(self, x: str) -> Any:
            return x

    module = FewShot()
    del module.examples[0]
    assert module.state_dict() == {"examples.0": "e1", "examples.1": "e2"}
    assert module.examples[1].qualified_name == "examples.1"
    module.load_state_dict({"examples.1": "E2"})
    assert module.examples[1].value == "E2"


# -- ParameterDict ------------------------------------------------------------------------
def test_parameter_dict_update_pop_clear_and_missing_keys() -> None:
    tone, length, style = param("calm"), param("short"), param("plain")
    pd = ParameterDict({"tone": tone})
    pd.update([("length", length)])
    pd.update({"style": style})
    assert list(pd.keys()) == ["tone", "length", "style"]
    assert list(pd.values()) == [tone, length, style]
    assert dict(pd.items())["length"] is length
    assert pd.pop("length") is length and length.owner is None and "length" not in pd
    assert pd.pop("length", "fallback") == "fallback"
    with pytest.raises(KeyError, match=r"'lenght' is not a key .*'tone', 'style'"):
        pd.pop("lenght")
    with pytest.raises(KeyError, match="'missing' is not a key"):
        del pd["missing"]
    with pytest.raises(KeyError, match="did you mean 'style'"):
        pd["styel"]
    assert pd.state_dict() == {"tone": "calm", "style": "plain"}
    pd.clear()
    assert len(pd) == 0 and tone.owner is None and pd.state_dict() == {}


def test_parameter_dict_keys_and_values_are_checked() -> None:
    pd = ParameterDict()
    with pytest.raises(ValueError, match=r"'items' would shadow ParameterDict\.items"):
        pd["items"] = param("x")
    with pytest.raises(ValueError, match="'_parameters' starts with '_'"):
        pd["_parameters"] = param("x")
    with pytest.raises(ValueError, match="'my key' is not a valid Python identifier"):
        ParameterDict([("my key", param("x"))])
    with pytest.raises(TypeError, match=r"value for key 'tone' expects a Parameter, got str"):
        pd.update({"tone": "calm"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"iterable of \(key, Parameter\) pairs, got int"):
        pd.update(3)  # type: ignore[arg-type]
    assert len(pd) == 0
