"""BFCL's AST checker as a scorer: `--scorer bfcl`, the default for `--dataset bfcl:<category>`.

`bfcl_eval`'s own checker (`bfcl_eval/eval_checker/ast_eval/ast_checker.py`) cannot be used
as a library: importing it imports every model vendor's SDK (anthropic, cohere, mistralai,
...). This is its check for one Python call, rule for rule, on the lane's call (its
canonical `{"name", "arguments"}`), against the entry's functions and ground truth:

- the function's name is the one the ground truth calls (`.` in it read as `_`, as BFCL
  reads an OpenAI-style model's call);
- every `required` parameter is given, and no parameter the function or the ground truth
  does not know;
- each value has the parameter's type (BFCL's Python types: `integer` an int and not a bool,
  `float` a float, an int accepted as Python converts it, `tuple` a list, `any` a string; the
  items of an `array` or `tuple` too), or the type of the ground truth's values (a variable's
  name given as a string);
- each value is among the acceptable ones: strings (also inside lists and dicts) compared
  after BFCL's `standardize_string` (lowercased; spaces and `,./-_*^` removed; `'` as `"`),
  dicts key by key, lists whole and in order, anything else by Python's `==`;
- a parameter the model left out must be one the ground truth allows to leave out (`""`).

One difference the canonical form makes: it writes a whole number as an integer (`5.0` is `5`),
as JSON does not tell them apart. So a number is read as the function declares it: where it
declares a `float` (a parameter, an array's or tuple's items, a dict's property) a whole number
is that float, and a whole number given for an `integer` is that integer. BFCL, reading Python
source, also refuses `[1, 3]` where a list of floats is wanted; here that is `[1.0, 3.0]`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from lanefold.evaluate._bfcl import called
from lanefold.evaluate._item import Item
from lanefold.evaluate._scorer import Score, register_scorer
from lanefold.primitives import ConfigError, ToolCall, Verifier

__all__ = ("BfclAst", "check_call")

# BFCL's PYTHON_TYPE_MAPPING: the Python type each of its parameter types is checked against.
_PYTHON = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}
_NESTED = ("array", "tuple")
_PUNCTUATION = re.compile(r"[ \,\.\/\-\_\*\^]")


def check_call(
    functions: Sequence[Mapping[str, Any]], call: ToolCall, ground_truth: Sequence[Any]
) -> str | None:
    """None when `call` is right by BFCL's AST check for one call, else why it is not."""
    if len(ground_truth) != 1 or not isinstance(ground_truth[0], Mapping) or len(ground_truth[0]) != 1:
        return "the ground truth is not one call"
    ((name, possible),) = ground_truth[0].items()
    description = next((f for f in functions if f.get("name") == name), functions[0] if functions else None)
    if description is None:
        return f"no function {name!r} in the entry"
    if called(str(description["name"])) != call.name:
        return f"called {call.name!r}, not {called(str(description['name']))!r}"
    parameters = description.get("parameters", {})
    details: Mapping[str, Any] = parameters.get("properties", {})
    arguments = {key: _declared(value, details.get(key)) for key, value in call.arguments.items()}
    for param in parameters.get("required", []):
        if param not in arguments:
            return f"missing required parameter {param!r}"
    for param, given in arguments.items():
        if param not in details or param not in possible:
            return f"unexpected parameter {param!r}"
        why = _check_value(param, given, details[param], possible[param])
        if why is not None:
            return why
    for param, values in possible.items():
        if param not in arguments and "" not in values:
            return f"parameter {param!r} left out, and the answer needs it"
    return None


def _declared(value: Any, detail: Any) -> Any:
    """`value` with each whole number where `detail` (a BFCL schema) declares a float made one."""
    if not isinstance(detail, Mapping):
        return value
    kind = detail.get("type")
    if kind == "float" and type(value) is int:
        return float(value)
    if kind in _NESTED and isinstance(value, list):
        return [_declared(v, detail.get("items")) for v in value]
    properties = detail.get("properties")
    if kind == "dict" and isinstance(value, dict) and isinstance(properties, Mapping):
        return {key: _declared(v, properties.get(key)) for key, v in value.items()}
    return value


def _check_value(param: str, value: Any, detail: Mapping[str, Any], possible: list[Any]) -> str | None:
    kind = str(detail.get("type"))
    expected = _PYTHON.get(kind)
    if expected is None:
        return f"parameter {param!r} has a type BFCL's Python check does not know ({kind!r})"
    nested = None
    if kind in _NESTED:
        nested = _PYTHON.get(str(detail.get("items", {}).get("type")))
    if kind == "float" and type(value) is int:
        value = float(value)  # Python converts an int where a float is wanted
    typed = _type_check(value, possible, expected, nested)
    if typed is None:
        return f"parameter {param!r}: expected {kind}, got {_json_type(value)}"
    variable = typed
    if not variable:
        if expected is dict:
            return _dict_check(param, value, possible)
        if expected is list and nested is dict:
            return _list_dict_check(param, value, possible)
        if expected is str:
            return _one_of(param, value, [_standard(p) for p in possible if type(p) is str], _standard(value))
        if expected is list:
            return _one_of(
                param,
                value,
                [_standard_list(p) for p in possible if isinstance(p, list | str)],
                _standard_list(value),
            )
    return None if value in possible else f"parameter {param!r}: {json.dumps(value)} is not an answer"


def _answer_type(possible: list[Any]) -> type | None:
    return next((type(p) for p in possible if p != ""), None)


def _type_check(value: Any, possible: list[Any], expected: type, nested: type | None) -> bool | None:
    """BFCL's `type_checker`: None when `value` has neither the parameter's type nor the
    answers' (a variable's), else whether it is read as a variable."""
    answer_type = _answer_type(possible)
    variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if nested is None:
            return variable
        items = value if isinstance(value, list) else []  # a nested type is a list's items
        for option in possible:  # an option that is no list (`""`) passes, as in BFCL's
            if type(option) is not list or all(
                _type_check(v, option, nested, None) is not None for v in items
            ):
                return variable
        return None
    if answer_type is not None and type(value) is answer_type:
        return True
    return None


def _standard(text: Any) -> Any:
    """BFCL's `standardize_string` on a string; anything else as it is."""
    return _PUNCTUATION.sub("", text).lower().replace("'", '"') if type(text) is str else text


def _standard_list(values: list[Any] | str) -> list[Any]:
    """BFCL's `list_checker` standardising: each string item; an option `""` is `[]`."""
    return [_standard(v) for v in values]


def _one_of(param: str, value: Any, possible: list[Any], mine: Any) -> str | None:
    return None if mine in possible else f"parameter {param!r}: {json.dumps(value)} is not an answer"


def _dict_check(param: str, value: Mapping[str, Any], possible: list[Any]) -> str | None:
    """BFCL's `dict_checker`: right when some acceptable dict takes each key's value (strings
    standardised) and every key it needs."""
    why = f"parameter {param!r}: {json.dumps(value)} is not an answer"
    for option in possible:
        if option == "" or not isinstance(option, Mapping):
            continue
        keys_known = all(
            key in option and _standard(given) in [_standard(p) for p in option[key]]
            for key, given in value.items()
        )
        if keys_known and all(key in value or "" in values for key, values in option.items()):
            return None
    return why


def _list_dict_check(param: str, value: list[Any], possible: list[Any]) -> str | None:
    """BFCL's `list_dict_checker`: each dict in order against some acceptable list's."""
    for option in possible:
        if isinstance(option, list) and len(option) == len(value):
            if all(
                isinstance(d, Mapping) and _dict_check(param, d, [o]) is None
                for d, o in zip(value, option, strict=True)
            ):
                return None
    return f"parameter {param!r}: {json.dumps(value)} is not an answer"


def _json_type(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array", dict: "dict"}.get(
        type(value), type(value).__name__
    )


@register_scorer("bfcl")
class BfclAst:
    """BFCL's AST check of the winning call against the entry's ground truth (see the module's
    docstring); an answer that is no call is wrong."""

    name = "bfcl"
    needs_text = False

    def check(self, items: Sequence[Item]) -> None:
        for item in items:
            if not isinstance(item.meta.get("functions"), list) or not isinstance(
                item.meta.get("ground_truth"), list
            ):
                raise ConfigError(
                    f"{item.source or f'item {item.index}'}: no BFCL functions and ground truth "
                    "for the bfcl scorer (--dataset bfcl:<category> has them)"
                )

    async def score(self, item: Item, answer: str | None, text: str | None) -> Score:
        call = ToolCall.from_answer(answer)
        if call is None:
            return Score(0.0)
        why = check_call(item.meta["functions"], call, item.meta["ground_truth"])
        return Score(1.0 if why is None else 0.0)

    def verifier(self, items: Sequence[Item]) -> Verifier | None:
        return None
