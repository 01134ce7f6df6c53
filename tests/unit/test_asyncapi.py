"""The topic contract (schemas/asyncapi.yaml) is a valid AsyncAPI 3 document, checked
offline against the vendored official schema; it names every public topic, and every
`$ref` resolves inside schemas/."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from cronstream.shared.topics import Topics

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
OFFICIAL = SCHEMAS / "vendor" / "asyncapi-3.0.0.schema.json"
OFFICIAL_SHA256 = "abe96881dbfaad495ccbb6bd8d3fb43ca18a13b9d7564849ccb66f39d5e5b20f"


def document() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((SCHEMAS / "asyncapi.yaml").read_text())
    return loaded


def refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for v in node.values() for r in refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in refs(v)]
    return []


def pointer(root: Any, fragment: str) -> Any:
    node = root
    for part in filter(None, fragment.lstrip("/").split("/")):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def test_the_vendored_schema_is_the_recorded_one() -> None:
    assert hashlib.sha256(OFFICIAL.read_bytes()).hexdigest() == OFFICIAL_SHA256


def test_the_document_is_valid_asyncapi_3() -> None:
    official = json.loads(OFFICIAL.read_text())
    validator = jsonschema.Draft7Validator(official)
    errors = sorted(validator.iter_errors(document()), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)
    assert document()["asyncapi"].startswith("3.")


def test_it_fails_on_a_broken_document() -> None:
    # The validation above can fail: an operation without its action is refused.
    broken = document()
    del broken["operations"]["sendExecutionEvents"]["action"]
    assert list(jsonschema.Draft7Validator(json.loads(OFFICIAL.read_text())).iter_errors(broken))


def test_every_public_topic_is_a_channel() -> None:
    addresses = {c["address"] for c in document()["channels"].values()}
    public = Topics(prefix="{prefix}").public()
    assert public and set(public) <= addresses
    assert document()["components"]["parameters"]["prefix"]["default"] == Topics().prefix


def test_every_ref_resolves_inside_schemas() -> None:
    doc = document()
    found = refs(doc)
    assert any(r.startswith("./") for r in found)
    for ref in found:
        target, _, fragment = ref.partition("#")
        if not target:
            assert pointer(doc, fragment) is not None, ref
            continue
        path = (SCHEMAS / target).resolve()
        assert path.parent == SCHEMAS.resolve() and path.is_file(), ref
        schema = json.loads(path.read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        jsonschema.Draft7Validator.check_schema(schema)  # usable by draft-07 tooling too
        if fragment:
            assert pointer(schema, fragment) is not None, ref
