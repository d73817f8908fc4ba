"""How a simulated lane spells a JSON answer: the same value, written another way.

Real lanes that agree on a call rarely agree on its bytes: keys come in another order, `2`
comes as `2.0`, spaces differ. `respell` does that from a lane's seed, so a test can show the
canonical form (`lanefold.primitives.canonical_json`) making such lanes vote as one.
"""

from __future__ import annotations

import json
import random
from decimal import Decimal
from typing import Any

__all__ = ("respell",)


def respell(text: str, rng: random.Random) -> str:
    """`text` written another way when it is JSON (the same value), else as it is."""
    try:
        value = json.loads(text, parse_float=Decimal)
    except ValueError:
        return text
    space = rng.choice(("", " ", "  "))
    return _spelled(value, rng, space)


def _spelled(value: Any, rng: random.Random, space: str) -> str:
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        items = [f"{json.dumps(k)}:{space}{_spelled(value[k], rng, space)}" for k in keys]
        return "{" + f",{space}".join(items) + "}"
    if isinstance(value, list):
        return "[" + f",{space}".join(_spelled(v, rng, space) for v in value) + "]"
    if isinstance(value, int | Decimal) and not isinstance(value, bool):
        return _number(Decimal(value), rng)
    return json.dumps(value, ensure_ascii=False)


def _number(number: Decimal, rng: random.Random) -> str:
    plain = format(number.normalize(), "f") if not number.is_zero() else "0"
    forms = [plain, plain + ("" if "." in plain else ".0"), f"{plain}{'0' if '.' in plain else '.00'}"]
    if number == number.to_integral_value() and not number.is_zero():
        forms.append(f"{plain}0e-1")  # 20e-1 is 2
    return rng.choice(forms)
