"""A Gemini `GenerateContentRequest` as the engine's chat-completions request.

The agent's conversation (`contents`, `systemInstruction`, `tools`, `toolConfig`,
`generationConfig`) becomes chat messages, tools and sampling parameters, so the engine renders
it with its own chat template and the proxy captures the ids it sampled. The mapping is a pure
function of the request: an agent re-sending its history gets the same chat messages (and the
same generated tool-call ids) on every turn, which keeps consecutive calls' token ids prefixes of
each other for `prefix_merge`. Anything the engine cannot honour (grounding tools, code
execution, file references, cached content, several candidates) is refused with a 400 instead
of being silently dropped: an agent that relies on it would otherwise train on a different task.

Google's JSON parser accepts both `lowerCamel` and `snake_case` field names; so do we.
"""

from __future__ import annotations

import json
import re
from typing import Any

from polar_mq.proxy.apis.base import FamilyError

USER_ROLES = ("user", "function")
MODEL_ROLE = "model"
PART_KINDS = ("text", "inlineData", "functionCall", "functionResponse")
PART_METADATA = ("thought", "thoughtSignature", "partMetadata", "mediaResolution", "videoMetadata")
"""Part fields that annotate a part rather than being its content: accepted and ignored."""
MODES = {"AUTO": "auto", "VALIDATED": "auto", "ANY": "required", "NONE": "none"}
SCHEMA_KEPT = (
    "description",
    "title",
    "default",
    "enum",
    "format",
    "pattern",
    "minimum",
    "maximum",
    "required",
)
SCHEMA_COUNTS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties")
"""int64 fields: Google's JSON writes them as strings ("1"); JSON Schema wants numbers."""
SUPPORTED_MIME = ("text/plain", "application/json")
_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")


def get(obj: dict[str, Any], name: str) -> Any:
    """`obj[name]` under its lowerCamel or its snake_case spelling (Google accepts both)."""
    if name in obj:
        return obj[name]
    return obj.get(_SNAKE.sub("_", name).lower())


def split_action(model_action: str) -> tuple[str, str]:
    """(`model`, `action`) of the path segment `<model>:<action>` (`models/` prefix dropped)."""
    model, sep, action = model_action.rpartition(":")
    if not sep or not model:
        return model_action.removeprefix("models/"), ""
    return model.removeprefix("models/"), action


def _dict(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FamilyError(f"`{where}` must be an object")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise FamilyError(f"`{where}` must be a list")
    return value


def call_id(turn: int, n: int) -> str:
    """The id given to a `functionCall` the agent sent without one: stable as history repeats."""
    return f"call_{turn}_{n}"


def to_chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """`systemInstruction` + `contents` as chat messages; raises `FamilyError` on bad input."""
    messages: list[dict[str, Any]] = []
    system = get(body, "systemInstruction")
    if system is not None:
        text = _system_text(system)
        if text:
            messages.append({"role": "system", "content": text})
    contents = get(body, "contents")
    if not isinstance(contents, list) or not contents:
        raise FamilyError("`contents` must be a non-empty list of Content objects")
    pending: list[tuple[str, str]] = []
    """(id, name) of the function calls of the last model turn that have no response yet."""
    for turn, content in enumerate(contents):
        content = _dict(content, f"contents[{turn}]")
        role = content.get("role") or "user"
        parts = _list(content.get("parts"), f"contents[{turn}].parts")
        if not parts:
            raise FamilyError(f"`contents[{turn}].parts` must not be empty")
        if role == MODEL_ROLE:
            message, pending = _model_message(turn, parts)
            messages.append(message)
        elif role in USER_ROLES:
            messages.extend(_user_messages(turn, parts, pending))
        else:
            raise FamilyError(f"`contents[{turn}].role` must be 'user' or 'model', not {role!r}")
    return messages


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    parts = _list(_dict(system, "systemInstruction").get("parts"), "systemInstruction.parts")
    texts = []
    for index, part in enumerate(parts):
        text = _dict(part, f"systemInstruction.parts[{index}]").get("text")
        if not isinstance(text, str):
            raise FamilyError("`systemInstruction` parts must be text parts")
        texts.append(text)
    return "\n".join(texts)


def _kind(part: Any, where: str) -> tuple[str, Any]:
    """The part's one content field (name, value); any other kind is refused."""
    part = _dict(part, where)
    found = [(kind, get(part, kind)) for kind in PART_KINDS if get(part, kind) is not None]
    if len(found) == 1:
        return found[0]
    known = set(PART_KINDS) | set(PART_METADATA)
    other = sorted(k for k in part if _camel(k) not in known)
    if other:
        raise FamilyError(
            f"`{where}`: unsupported part kind {other[0]!r} (supported: text, "
            "inlineData images, functionCall, functionResponse)"
        )
    raise FamilyError(
        f"`{where}` must have exactly one of text, inlineData, functionCall, functionResponse"
    )


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


def _model_message(turn: int, parts: list[Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """One assistant message; text parts are joined as they were streamed (no separator)."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for index, part in enumerate(parts):
        where = f"contents[{turn}].parts[{index}]"
        kind, value = _kind(part, where)
        if kind == "text":
            if not isinstance(value, str):
                raise FamilyError(f"`{where}.text` must be a string")
            (thoughts if part.get("thought") is True else texts).append(value)
        elif kind == "functionCall":
            calls.append(_tool_call(_dict(value, f"{where}.functionCall"), turn, len(calls)))
        else:
            raise FamilyError(f"`{where}`: a model turn holds text and functionCall parts only")
    text = "".join(texts)
    # An empty text part (a stream's closing chunk, kept by the client) next to function calls
    # is the same turn as the calls alone: the same message, hence the same prompt tokens.
    content = text if texts and (text or not calls) else None
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thoughts:
        message["reasoning"] = "".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    pending = [(c["id"], c["function"]["name"]) for c in calls]
    return message, pending


def _tool_call(call: dict[str, Any], turn: int, n: int) -> dict[str, Any]:
    name = call.get("name")
    if not isinstance(name, str) or not name:
        raise FamilyError(f"`contents[{turn}]`: a functionCall needs a name")
    args = call.get("args")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise FamilyError(f"`contents[{turn}]`: functionCall.args must be an object")
    given = call.get("id")
    return {
        "id": given if isinstance(given, str) and given else call_id(turn, n),
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
    }


def _user_messages(
    turn: int, parts: list[Any], pending: list[tuple[str, str]]
) -> list[dict[str, Any]]:
    """Tool messages for the function responses (first: they must follow the calls), then the
    user's text and images as one user message."""
    tools: list[dict[str, Any]] = []
    content: list[dict[str, Any]] = []
    for index, part in enumerate(parts):
        where = f"contents[{turn}].parts[{index}]"
        kind, value = _kind(part, where)
        if kind == "text":
            if not isinstance(value, str):
                raise FamilyError(f"`{where}.text` must be a string")
            content.append({"type": "text", "text": value})
        elif kind == "inlineData":
            content.append(_image(_dict(value, f"{where}.inlineData"), where))
        elif kind == "functionResponse":
            tools.append(_tool_message(_dict(value, f"{where}.functionResponse"), where, pending))
        else:
            raise FamilyError(f"`{where}`: a functionCall belongs in a 'model' turn")
    messages = tools
    if content:
        only_text = len(content) == 1 and content[0]["type"] == "text"
        messages.append({"role": "user", "content": content[0]["text"] if only_text else content})
    return messages


def _image(blob: dict[str, Any], where: str) -> dict[str, Any]:
    mime, data = get(blob, "mimeType"), blob.get("data")
    if not isinstance(mime, str) or not isinstance(data, str):
        raise FamilyError(f"`{where}.inlineData` needs a mimeType and base64 data")
    if not mime.startswith("image/"):
        raise FamilyError(f"`{where}`: inline {mime!r} is not supported (images only)")
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}}


def _tool_message(
    response: dict[str, Any], where: str, pending: list[tuple[str, str]]
) -> dict[str, Any]:
    """A tool message answering the matching call: by id, else the first open call of that name."""
    name, given = response.get("name"), response.get("id")
    result = response.get("response")
    if not isinstance(name, str) or not isinstance(result, dict):
        raise FamilyError(f"`{where}.functionResponse` needs a name and a response object")
    match = None
    if isinstance(given, str) and given:
        match = next((c for c in pending if c[0] == given), None)
    if match is None:
        match = next((c for c in pending if c[1] == name), None)
    if match is None:
        if not (isinstance(given, str) and given):
            raise FamilyError(
                f"`{where}`: functionResponse {name!r} answers no functionCall of the model turn"
                " before it"
            )
        match = (given, name)
    else:
        pending.remove(match)
    output = result.get("output")
    if len(result) == 1 and isinstance(output, str):
        content = output  # Google's convention for a plain result: the tool's text as it is
    else:
        content = json.dumps(result, ensure_ascii=False)
    return {"role": "tool", "tool_call_id": match[0], "content": content}


def to_chat_tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    """`tools[].functionDeclarations[]` as chat function tools; other tool kinds are refused."""
    tools = get(body, "tools")
    if tools is None:
        return []
    out: list[dict[str, Any]] = []
    for index, tool in enumerate(_list(tools, "tools")):
        tool = _dict(tool, f"tools[{index}]")
        for key, value in tool.items():
            if _camel(key) != "functionDeclarations" and value is not None:
                raise FamilyError(
                    f"`tools[{index}]`: tool {key!r} is not supported (functionDeclarations only)"
                )
        declarations = get(tool, "functionDeclarations") or []
        for n, declaration in enumerate(_list(declarations, f"tools[{index}]")):
            out.append(_function(_dict(declaration, f"tools[{index}].functionDeclarations[{n}]")))
    return out


def _function(declaration: dict[str, Any]) -> dict[str, Any]:
    name = declaration.get("name")
    if not isinstance(name, str) or not name:
        raise FamilyError("every functionDeclaration needs a name")
    function: dict[str, Any] = {"name": name}
    if isinstance(declaration.get("description"), str):
        function["description"] = declaration["description"]
    raw_schema = get(declaration, "parametersJsonSchema")
    if raw_schema is not None:
        function["parameters"] = raw_schema
    elif declaration.get("parameters") is not None:
        function["parameters"] = json_schema(declaration["parameters"], f"{name}.parameters")
    else:
        function["parameters"] = {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def json_schema(schema: Any, where: str) -> dict[str, Any]:
    """Google's OpenAPI-subset `Schema` as JSON Schema: lowercase types, `nullable` folded into
    the type, counts as numbers; fields JSON Schema lacks (`propertyOrdering`, `example`) drop.

    Keys keep the agent's order: the schema is rendered into the prompt, so the same declaration
    must give the same tokens as the engine's own chat API would for the same JSON.
    """
    schema = _dict(schema, where)
    out: dict[str, Any] = {}
    for raw_key, value in schema.items():
        name = _camel(raw_key)
        if value is None:
            continue
        if name == "type":
            if isinstance(value, str) and value.upper() != "TYPE_UNSPECIFIED":
                kind = value.lower()
                nullable = schema.get("nullable") is True and kind != "null"
                out["type"] = [kind, "null"] if nullable else kind
        elif name in SCHEMA_KEPT:
            out[name] = value
        elif name in SCHEMA_COUNTS:
            try:
                out[name] = int(value)
            except (TypeError, ValueError) as exc:
                raise FamilyError(f"`{where}.{name}` must be an integer") from exc
        elif name == "properties" and isinstance(value, dict):
            out[name] = {k: json_schema(v, f"{where}.{k}") for k, v in value.items()}
        elif name == "items":
            out[name] = json_schema(value, f"{where}.items")
        elif name == "anyOf" and isinstance(value, list):
            out[name] = [json_schema(s, f"{where}.anyOf") for s in value]
        elif name == "additionalProperties":
            extra = isinstance(value, bool)
            out[name] = value if extra else json_schema(value, f"{where}.{name}")
        elif name in ("defs", "$defs") and isinstance(value, dict):
            out["$defs"] = {k: json_schema(v, f"{where}.$defs.{k}") for k, v in value.items()}
        elif name in ("ref", "$ref") and isinstance(value, str):
            out["$ref"] = value
    return out


def tool_choice(body: dict[str, Any]) -> Any:
    """`toolConfig.functionCallingConfig` as chat `tool_choice` (None: the engine's default)."""
    config = get(body, "toolConfig")
    if config is None:
        return None
    calling = get(_dict(config, "toolConfig"), "functionCallingConfig")
    if calling is None:
        return None
    calling = _dict(calling, "toolConfig.functionCallingConfig")
    mode = calling.get("mode")
    if mode is None or mode == "MODE_UNSPECIFIED":
        return None
    if mode not in MODES:
        raise FamilyError(f"`functionCallingConfig.mode` {mode!r} is not one of {', '.join(MODES)}")
    allowed = get(calling, "allowedFunctionNames")
    if mode == "ANY" and isinstance(allowed, list) and len(allowed) == 1:
        return {"type": "function", "function": {"name": allowed[0]}}
    return MODES[mode]


def sampling(body: dict[str, Any]) -> dict[str, Any]:
    """`generationConfig` as chat sampling parameters (what the engine cannot do is refused)."""
    config = get(body, "generationConfig")
    if config is None:
        return {}
    config = _dict(config, "generationConfig")
    out: dict[str, Any] = {}
    for name, chat_name in (
        ("temperature", "temperature"),
        ("topP", "top_p"),
        ("topK", "top_k"),
        ("maxOutputTokens", "max_tokens"),
        ("seed", "seed"),
        ("presencePenalty", "presence_penalty"),
        ("frequencyPenalty", "frequency_penalty"),
    ):
        value = get(config, name)
        if value is not None:
            out[chat_name] = value
    stops = get(config, "stopSequences")
    if stops:
        out["stop"] = stops
    count = get(config, "candidateCount")
    if count is not None and count != 1:
        raise FamilyError("`generationConfig.candidateCount` must be 1 (one candidate per call)")
    modalities = get(config, "responseModalities")
    if isinstance(modalities, list) and any(m != "TEXT" for m in modalities):
        raise FamilyError("`generationConfig.responseModalities`: only TEXT is supported")
    format_ = _response_format(config)
    if format_ is not None:
        out["response_format"] = format_
    return out


def _response_format(config: dict[str, Any]) -> dict[str, Any] | None:
    mime = get(config, "responseMimeType")
    raw_schema = get(config, "responseJsonSchema")
    schema = get(config, "responseSchema")
    if mime is None or mime == "text/plain":
        if raw_schema is not None or schema is not None:
            raise FamilyError("a response schema needs `responseMimeType: application/json`")
        return None
    if mime not in SUPPORTED_MIME:
        raise FamilyError(f"`responseMimeType` {mime!r} is not supported ({SUPPORTED_MIME})")
    if raw_schema is None and schema is not None:
        raw_schema = json_schema(schema, "responseSchema")
    if raw_schema is None:
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "response", "schema": raw_schema}}


def check_unsupported(body: dict[str, Any]) -> None:
    """Top-level fields whose meaning the engine cannot reproduce."""
    if get(body, "cachedContent"):
        raise FamilyError("`cachedContent` is not supported: send the full contents")
