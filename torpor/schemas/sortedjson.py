"""Sorted, compact JSON text (`sort_keys=True`, separators `,` and `:`), written by one C encoder.

`sorted_json(ensure_ascii)` returns a function with exactly the output (and errors) of
`json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=...).encode`. Why:
`JSONEncoder.encode` builds a new C encoder object at every call, which cost as much as
the encoding of the small values the fold and the state rows write (event data, call
lists). Here the C encoder is built with the same arguments on every call but without
`iterencode`'s Python-level set-up. A fresh `markers` dict per call keeps the circular
reference check (an error mid-way cannot leave a stale marker behind). Where the C
accelerator is missing, the plain `encode` is used.
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable
from typing import Final

_ITEM_SEPARATOR: Final = ","
_KEY_SEPARATOR: Final = ":"


def sorted_json(ensure_ascii: bool) -> Callable[[object], str]:
    """The encoding function described in the module docstring."""
    reference = json.JSONEncoder(sort_keys=True, separators=(_ITEM_SEPARATOR, _KEY_SEPARATOR),
                                 ensure_ascii=ensure_ascii)
    make = json.encoder.c_make_encoder  # type: ignore[attr-defined]
    if make is None:
        plain: Callable[[object], str] = reference.encode
        return plain
    string = json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring
    default = reference.default

    def encode(value: object) -> str:
        if isinstance(value, str):
            return string(value)
        chunks = make({}, default, string, None, _KEY_SEPARATOR, _ITEM_SEPARATOR, True, False, True)(value, 0)
        return "".join(chunks)

    return encode
