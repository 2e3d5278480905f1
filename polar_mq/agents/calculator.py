"""The reference agent's tools without its client: the calculator a model may call and the text
protocol's `CALC:` / `ANSWER:` directives. Stdlib only, so what only computes or parses (the tests,
a grader) does not load the OpenAI SDK."""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from typing import Any

_DIRECTIVE = re.compile(r"\b(CALC|ANSWER)\s*:\s*(\S[^\n]*)", re.IGNORECASE)
_MAX_EXPRESSION = 200
_MAX_EXPONENT = 1000
_MAX_BITS = 4096
_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.BitXor: operator.pow,  # models write 2^10 for a power, as calculators do
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


def calculate(expression: str) -> float | int:
    """Evaluate arithmetic from an untrusted model: numbers and operators only, no names."""
    text = expression.strip().strip("`").strip().rstrip("=").strip()
    if not text or len(text) > _MAX_EXPRESSION:
        raise ValueError("expression is empty or too long")
    return _eval_node(ast.parse(text, mode="eval").body)


def _eval_node(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        unary: float | int = _UNARY[type(node.op)](_eval_node(node.operand))
        return unary
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow | ast.BitXor) and (
            abs(right) > _MAX_EXPONENT
            or (isinstance(left, int) and left.bit_length() * abs(right) > _MAX_BITS)
        ):
            raise ValueError("result too large")
        result: float | int = _BINARY[type(node.op)](left, right)
        if isinstance(result, int) and result.bit_length() > _MAX_BITS:
            raise ValueError("result too large")
        return result
    raise ValueError(f"unsupported expression element: {type(node).__name__}")


def format_number(value: float | int | complex) -> str:
    """Integral results print without a trailing `.0` so `6/3` reads `2` like a human writes it."""
    if isinstance(value, complex):
        raise ValueError("complex result")
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(value, ".12g") if isinstance(value, float) else str(value)


def run_calculator(expression: str) -> str:
    """Calculator output as the model sees it; errors are reported, never raised."""
    try:
        return format_number(calculate(expression))
    except (ValueError, SyntaxError, ArithmeticError, TypeError) as exc:
        return f"error: {exc}"


def parse_directive(content: str | None) -> tuple[str, str] | None:
    """The first `CALC: x` or `ANSWER: x` in a reply as ("CALC"|"ANSWER", x); the value may sit
    on the next line, as small models often put it."""
    match = _DIRECTIVE.search(content or "")
    if match is None:
        return None
    return match.group(1).upper(), match.group(2).strip()
