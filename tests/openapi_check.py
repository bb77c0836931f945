"""Validate a JSON body against a response schema of an OpenAPI 3.0 document, with jsonschema."""

from __future__ import annotations

from typing import Any

import jsonschema


def _to_json_schema(node: Any) -> Any:
    """OpenAPI 3.0's `nullable: true` is JSON Schema's "or null"; the rest is the same vocabulary."""
    if isinstance(node, list):
        return [_to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {k: _to_json_schema(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable"):
        return {"anyOf": [converted, {"type": "null"}]}
    return converted


def response_schema(document: dict[str, Any], path: str, method: str, status: int) -> dict[str, Any]:
    responses = document["paths"][path][method]["responses"]
    assert str(status) in responses, f"{method.upper()} {path} answered {status}, which the document does not list"
    response = responses[str(status)]
    if "$ref" in response:
        response = document["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    return response["content"]["application/json"]["schema"]


def check_response(document: dict[str, Any], path: str, method: str, status: int, body: Any) -> None:
    """Raise jsonschema.ValidationError when `body` does not match what the document promises."""
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "components": _to_json_schema(document["components"]),
        **_to_json_schema(response_schema(document, path, method, status)),
    }
    jsonschema.validate(body, schema, cls=jsonschema.Draft202012Validator)
