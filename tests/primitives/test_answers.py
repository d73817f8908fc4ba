"""Answer extraction and normalisation: examples, spec validation and properties."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from lanefold.primitives import ExtractSpec, extract_answer, normalize_answer

ANSWER_LINE = r"Answer:\s*(.+)"


# --- ExtractSpec -----------------------------------------------------------------------------


def test_method_defaults_to_last_number_without_regex() -> None:
    assert ExtractSpec().resolved_method == "last_number"


def test_method_defaults_to_regex_when_regex_given() -> None:
    spec = ExtractSpec(regex=ANSWER_LINE)
    assert spec.method is None
    assert spec.resolved_method == "regex"


@pytest.mark.parametrize("method", ["regex", "last_number", "boxed", "json_field"])
def test_explicit_method_is_kept(method: str) -> None:
    extra = {"regex": ANSWER_LINE} if method == "regex" else {}
    extra |= {"field": "answer"} if method == "json_field" else {}
    assert ExtractSpec.model_validate({"method": method, **extra}).resolved_method == method


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"method": "regex"}, "regex"),
        ({"regex": "("}, "regex"),
        ({"regex": "Answer: \\d+"}, "regex"),  # no group
        ({"regex": "(?:no capture)"}, "regex"),
        ({"method": "boxed", "regex": "(x)"}, "regex"),
        ({"method": "json_field"}, "field"),
        ({"method": "json_field", "field": "a..b"}, "field"),
        ({"field": "answer"}, "field"),  # field without json_field
        ({"method": "majority"}, "method"),
        ({"regex": 5}, "regex"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_specs_name_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        ExtractSpec.model_validate(data)
    locs = [error["loc"] for error in info.value.errors()]
    assert (field,) in locs
    assert field in str(info.value)


def test_spec_is_frozen() -> None:
    spec = ExtractSpec(regex=ANSWER_LINE)
    with pytest.raises(ValidationError):
        spec.regex = "(x)"  # type: ignore[misc]


# --- extract_answer --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Answer: 42", "42"),
        ("Answer: 5\nwait, that is wrong.\nAnswer: 7", "7"),  # the last match wins
        ("The format is 'Answer: <n>'. 6 * 7 = 42.\nAnswer: 42  ", "42"),
        ("no marker here, 12", None),
        ("Answer:   \n", None),  # empty capture is an abstention
        ("", None),
    ],
)
def test_regex_takes_first_group_of_last_match(text: str, expected: str | None) -> None:
    assert extract_answer(text, ExtractSpec(regex=ANSWER_LINE)) == expected


def test_regex_first_group_even_with_more_groups() -> None:
    spec = ExtractSpec(regex=r"(\w+)=(\d+)")
    assert extract_answer("a=1 b=2", spec) == "b"


def test_regex_skips_matches_whose_first_group_did_not_take_part() -> None:
    spec = ExtractSpec(regex=r"Answer: (\d+)|(none)")
    assert extract_answer("Answer: 3 then none", spec) == "3"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The result is 42.", "42"),
        ("It drops to -3", "-3"),
        ("x = -3.25 degrees", "-3.25"),
        ("about 1,000 apples", "1,000"),
        ("1,000,000 and then 3.5", "3.5"),
        ("pages 5-3", "3"),  # a hyphen between numbers is not a sign
        ("f(2)-1", "1"),
        ("first 3, then 4, finally 5", "5"),
        ("1,2,3", "3"),
        ("costs $7.50.", "7.50"),
        ("temperature \u22124 C", "-4"),
        ("just .5 left", ".5"),
        ("no digits at all", None),
    ],
)
def test_last_number(text: str, expected: str | None) -> None:
    assert extract_answer(text, ExtractSpec()) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{42}", "42"),
        (r"\boxed{1} no, \boxed{2}", "2"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{ {a}{b{c}} } done", "{a}{b{c}}"),
        (r"\boxed {7}", "7"),
        (r"\boxed{3} then truncated \boxed{\frac{1}{", "3"),  # last one never closed
        (r"\boxed{}", None),
        ("no box", None),
    ],
)
def test_boxed(text: str, expected: str | None) -> None:
    assert extract_answer(text, ExtractSpec(method="boxed")) == expected


@pytest.mark.parametrize(
    ("text", "field", "expected"),
    [
        ('{"answer": 42}', "answer", "42"),
        ('reasoning... {"answer": "Paris"} done', "answer", "Paris"),
        ('{"answer": 1} revised: {"answer": 2}', "answer", "2"),
        ('{"result": {"answer": 3.50}}', "result.answer", "3.50"),  # no float rounding
        ('{"result": {"answers": [4, 5]}}', "result.answers.1", "5"),
        ('{"ok": true}', "ok", "true"),
        ('{"v": [1, {"b": 2}]}', "v", '[1,{"b":2}]'),
        ('{"answer": null}', "answer", None),
        ('{"answer": 1} {"other": 2}', "answer", None),  # only the last object counts
        ('{"result": {"answer": 3}}', "answer", None),  # nested objects are not top level
        ("{not json} at all {", "answer", None),
        ("no json", "answer", None),
        ('{"answer": 1}', "answer.deeper", None),
    ],
)
def test_json_field(text: str, field: str, expected: str | None) -> None:
    assert extract_answer(text, ExtractSpec(method="json_field", field=field)) == expected


def test_json_field_after_stray_brace() -> None:
    text = 'set {x | x > 0} so {"answer": "yes"}'
    assert extract_answer(text, ExtractSpec(method="json_field", field="answer")) == "yes"


# --- normalize_answer ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1,000", "1000"),
        ("1000", "1000"),
        ("3.0", "3"),
        ("+5", "5"),
        ("-0", "0"),
        ("-0.00", "0"),
        ("0.50", "0.5"),
        ("1,000.50", "1000.5"),
        (".5", "0.5"),
        ("\u22127", "-7"),
        ("100", "100"),  # trailing zeros of an integer stay
        (r"\boxed{42}", "42"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        ("  Hello \n  World.  ", "hello world"),
        ("Paris!", "paris"),
        ("yes?!", "yes"),
        ('"Paris"', "paris"),
        ("'A'", "a"),
        ("$5$", "5"),
        ("$1,000", "1000"),
        ('"$1,000."', "1000"),
        ("Straße", "strasse"),
        ("1,00", "1,00"),  # not a thousands grouping: left as text
        ("3.5.", "3.5"),
        ("...", ""),
        ("", ""),
    ],
)
def test_normalize_examples(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


@pytest.mark.parametrize(
    ("left", "right"),
    [("1,000", "1000"), ("3.0", "3"), ("+5", "5"), ("-0", "0"), ("0.50", "0.5"), ("A", "a")],
)
def test_equal_answers_normalise_alike(left: str, right: str) -> None:
    assert normalize_answer(left) == normalize_answer(right)


@pytest.mark.parametrize(("left", "right"), [("3", "30"), ("0.5", "5"), ("-5", "5"), ("a b", "ab")])
def test_different_answers_stay_apart(left: str, right: str) -> None:
    assert normalize_answer(left) != normalize_answer(right)


answer_text = st.one_of(
    st.text(max_size=30),
    st.text(alphabet=" \t\n.,;:!?\"'`$\\{}boxed-+0123456789,", max_size=30),
    st.decimals(allow_nan=False, allow_infinity=False, places=3).map(str),
)


@given(answer_text)
def test_normalize_is_idempotent(raw: str) -> None:
    once = normalize_answer(raw)
    assert normalize_answer(once) == once


@given(st.decimals(min_value=-(10**12), max_value=10**12, places=4))
def test_number_forms_normalise_to_the_same_decimal(value: Decimal) -> None:
    plain = format(value, "f")
    grouped = f"{value:,f}"
    padded = f"{value:.6f}"
    normalised = {normalize_answer(plain), normalize_answer(grouped), normalize_answer(padded)}
    assert len(normalised) == 1
    assert Decimal(normalised.pop()) == value


# --- round trips: an answer embedded the way a lane writes it comes back out -------------------


@given(st.decimals(min_value=-(10**9), max_value=10**9, places=3))
def test_last_number_round_trip(value: Decimal) -> None:
    text = f"First I try 12, then -4. So the total is {value:,f}."
    found = extract_answer(text, ExtractSpec())
    assert found is not None
    assert Decimal(normalize_answer(found)) == value


single_line = st.text(
    alphabet=st.characters(exclude_categories=["Cs", "Zl", "Zp", "Cc"]), min_size=1, max_size=20
).filter(lambda text: text.strip() != "")


@given(single_line)
def test_regex_round_trip(answer: str) -> None:
    text = f"Reasoning...\nAnswer: 0\nOn reflection:\nAnswer: {answer}"
    assert extract_answer(text, ExtractSpec(regex=r"Answer:[ \t]*([^\n]+)")) == answer.strip()


balanced = st.recursive(
    st.text(alphabet="ab12+^\\ ", max_size=5),
    lambda inner: st.builds(lambda a, b: a + "{" + b + "}", inner, inner),
    max_leaves=8,
).filter(lambda text: text.strip() != "")


@given(balanced)
def test_boxed_round_trip(content: str) -> None:
    text = rf"Try \boxed{{0}}. Final: \boxed{{{content}}} and done."
    assert extract_answer(text, ExtractSpec(method="boxed")) == content.strip()


json_scalar = st.one_of(
    st.integers(), st.text(max_size=10).filter(lambda text: text.strip() == text and text != "")
)


@given(json_scalar, st.sampled_from(["answer", "result.answer", "a.b.c"]))
def test_json_field_round_trip(value: int | str, path: str) -> None:
    obj: object = value
    for key in reversed(path.split(".")):
        obj = {key: obj, "noise": "{not: json}"}
    text = f'Draft {{"answer": -1}}. Final: {json.dumps(obj)} -- end.'
    spec = ExtractSpec(method="json_field", field=path)
    assert extract_answer(text, spec) == str(value)
