"""The JSON response class of the API: orjson, fed straight with the read services' dataclasses.

Results pages carry long token-id arrays; orjson serializes dataclasses, UUIDs, datetimes and int
lists natively and several times faster than re-validating them through pydantic models.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse


class OrjsonResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS)
