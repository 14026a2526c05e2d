"""Reports checked against the JSON Schemas patchset ships: valid, and every key described.

Each command's own tests validate what it emits (`assert_matches(data, "upstream")`);
tests/registry/test_schemas.py checks the schemas themselves and real check and build reports."""

from __future__ import annotations

from typing import Any

import jsonschema

from patchset import schemas


def undocumented(
    instance: Any, schema: dict[str, Any], root: dict[str, Any], at: str = ""
) -> list[str]:
    """Keys of `instance` the schema does not describe (it accepts them, readers may not
    know them): every field an output carries must be in the schema."""
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        schema = {**root["$defs"][name], **{k: v for k, v in schema.items() if k != "$ref"}}
    found: list[str] = []
    if isinstance(instance, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in instance.items():
            if props is not None and key in props:
                found += undocumented(value, props[key], root, f"{at}.{key}")
            elif isinstance(extra, dict):
                found += undocumented(value, extra, root, f"{at}.{key}")
            elif props is not None:
                found.append(f"{at}.{key}")
    elif isinstance(instance, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(instance):
            found += undocumented(item, schema["items"], root, f"{at}[{i}]")
    return found


def assert_matches(instance: Any, name: str) -> None:
    schema = schemas.load(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(instance, schema, cls=jsonschema.Draft202012Validator)
    assert undocumented(instance, schema, schema) == []
