"""OpenAPI post-processing: every operation documents the error answers it can give.

They all come from gpuplatform.api.handle_exception in one shape, so they are added here once
instead of on every view.
"""

from __future__ import annotations

ERROR = {
    "type": "object",
    "required": ["detail", "errors"],
    "properties": {
        "detail": {"type": "string", "description": "The first problem, for people."},
        "errors": {
            "type": "object",
            "description": "Field path -> reasons (empty when no field is at fault).",
            "additionalProperties": {"type": "array", "items": {"type": "string"}},
        },
    },
}
ANSWERS = {
    "400": "Bad input: each field named with the reason.",
    "401": "No credentials, or a bad, expired or revoked token.",
    "403": "Your role may not do this.",
    "404": "Not found (another tenant's objects are never revealed).",
    "413": "The request body is too large.",
    "429": "Too many requests for your tenant: see Retry-After.",
}


def add_error_answers(result, generator, request, public):
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR
    reference = {"$ref": "#/components/schemas/Error"}
    for path in result.get("paths", {}).values():
        for operation in path.values():
            responses = operation.setdefault("responses", {})
            for code, description in ANSWERS.items():
                responses.setdefault(
                    code,
                    {
                        "description": description,
                        "content": {"application/json": {"schema": reference}},
                    },
                )
    return result
