"""A tokenizer.json number as `tokenizers` reads it.

`tokenizers` parses tokenizer.json with serde_json built without its
`float_roundtrip` feature. That parser does not round a decimal to the
nearest double: it gathers the digits into a u64 significand (digits past
u64's range are dropped), rounds that to a double, then multiplies or
divides by the double 10^|exponent| (a second rounding). For 17-digit
numbers (what Python, ryu and `tokenizers` itself write for most doubles)
the result is one unit in the last place off the true value about one time
in six. A Unigram model's scores are such numbers, and the Viterbi search
compares sums of them: with the correctly rounded scores a rare near-tie
goes the other way (seen: "865551" as 6 55 5 1 where `tokenizers` gives
6 5 55 1). So the converter reads a Unigram score the way `tokenizers` does,
from the number's text:

  load_json(text)        json.loads keeping each float's source text
  as_tokenizers_reads(x) the double `tokenizers` holds for the JSON number x
                         (a float from load_json: its text; any other float:
                         its repr, which is what json.dumps writes; an int:
                         its digits)
"""
from __future__ import annotations

import json
import re

_NUMBER = re.compile(r"(-?)([0-9]+)(?:\.([0-9]+))?(?:[eE]([+-]?[0-9]+))?")
_U64_MAX = (1 << 64) - 1
_POW10 = [float(f"1e{i}") for i in range(309)]   # serde_json's POW10 table


class JsonFloat(float):
    """A float that remembers the JSON text it was parsed from."""
    text: str

    def __new__(cls, text: str) -> "JsonFloat":
        self = super().__new__(cls, text)
        self.text = text
        return self


def load_json(text: str):
    """json.loads, each float a JsonFloat (ValueError as json.loads)."""
    return json.loads(text, parse_float=JsonFloat)


def serde_f64(text: str) -> float:
    """serde_json's f64 for a JSON number's text (without float_roundtrip):
    the significand's digits while they fit a u64 (the integer part's
    further digits each raise the exponent, the fraction's are dropped),
    then significand as f64, times or divided by 10^|exponent| (exponents
    past 308 divided down by 1e308 first). ValueError if text is no JSON
    number or its value overflows (serde_json refuses it too)."""
    m = _NUMBER.fullmatch(text)
    if not m:
        raise ValueError(f"not a JSON number: {text!r}")
    sign, whole, frac, exp = m.groups()
    sig, e, long = 0, 0, False
    for ch in whole:
        if long or sig * 10 + int(ch) > _U64_MAX:
            long = True                  # parse_long_integer: each digit raises e
            e += 1
        else:
            sig = sig * 10 + int(ch)
    for ch in frac or "":
        if sig * 10 + int(ch) > _U64_MAX:
            break                        # parse_decimal_overflow: the rest ignored
        sig = sig * 10 + int(ch)
        e -= 1
    e += int(exp or 0)
    f = float(sig)
    while True:
        if abs(e) < len(_POW10):
            if e >= 0:
                f *= _POW10[e]
                if f == float("inf"):
                    raise ValueError(f"number out of range: {text!r}")
            else:
                f /= _POW10[-e]
            break
        if f == 0.0:
            break
        if e >= 0:
            raise ValueError(f"number out of range: {text!r}")
        f /= 1e308
        e += 308
    return -f if sign else f


def as_tokenizers_reads(x) -> float:
    """The double `tokenizers` holds for the JSON number x (see the module)."""
    if isinstance(x, JsonFloat):
        return serde_f64(x.text)
    if isinstance(x, int):
        return serde_f64(str(x))
    return serde_f64(repr(float(x)))
