"""JSON parsing that refuses oversized or deeply nested documents before the parser can recurse on them."""

from __future__ import annotations

import json
import re
from typing import Any

from kiln.ir.serde.errors import SerdeError, UnsafeArchiveError

MAX_DEPTH = 256  # torch's graphs nest ~10 levels deep, plus one graph level per cond
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


def load_json(data: bytes, what: str, max_depth: int = MAX_DEPTH) -> Any:
    depth = deepest = 0
    for match in _BRACKET.finditer(_STRING.sub(b'""', data)):
        depth += 1 if match.group() in (b"[", b"{") else -1
        deepest = max(deepest, depth)
        if deepest > max_depth:
            raise UnsafeArchiveError(f"{what} nests deeper than {max_depth} levels",
                                     fix="the file is not a genuine .pt2")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as error:
        raise SerdeError(f"{what} is not valid JSON: {str(error)[:200]}",
                         fix="the file is damaged; write it again") from error
