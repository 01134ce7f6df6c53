"""Decoding records from Kafka: bytes → validated model, or a reason to dead-letter.

Every consumer decodes every record through `decode`; whatever fails is dead-lettered
with the reason this module gives (docs/reference/limits.md#bad-input).
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import ValidationError

from cronstream.shared.records import MAX_DEFINITION_BYTES, SCHEMA_VERSION, Record

T = TypeVar("T", bound=Record)

# A record larger than this cannot be a valid one: definitions are the largest (256 KiB),
# execution events carry at most 64 KiB of result plus bounded text.
MAX_RECORD_BYTES = MAX_DEFINITION_BYTES + 16 * 1024


MAX_PROBLEMS = 10  # a hostile record can fail validation a million times; name a few


class DecodeError(ValueError):
    """The record cannot be decoded or validated; the message is the reason."""


def describe(exc: ValidationError) -> str:
    """A one-line account of a validation failure that names each field."""
    problems = []
    errors = exc.errors(include_url=False)
    for error in errors[:MAX_PROBLEMS]:
        loc = ".".join(str(p) for p in error["loc"])[:200]
        msg = error["msg"].removeprefix("Value error, ")[:300]
        problems.append(f"{loc}: {msg}" if loc else msg)
    if len(errors) > MAX_PROBLEMS:
        problems.append(f"and {len(errors) - MAX_PROBLEMS} more")
    return "; ".join(problems)


def decode(
    model: type[T],
    value: bytes | None,
    *,
    key: bytes | None = None,
    key_field: str | None = None,
    max_bytes: int = MAX_RECORD_BYTES,
) -> T:
    """Validate `value` as `model`; when `key_field` is given the key must equal it."""
    if value is None:
        raise DecodeError("null value where a record is required")
    if len(value) > max_bytes:
        raise DecodeError(f"record is {len(value)} bytes; the limit is {max_bytes}")
    try:
        record = model.model_validate_json(value, context={"raw_size": len(value)})
    except ValidationError as exc:
        raise DecodeError(_major_version_problem(model, exc)
                          or f"invalid {model.__name__}: {describe(exc)}") from None
    except Exception as exc:
        # Not a validation error, yet the record caused it (a RecursionError from a
        # pathological expression, an OverflowError from a date): the record is bad, the
        # consumer is not.
        raise DecodeError(f"invalid {model.__name__}: {type(exc).__name__}: "
                          f"{str(exc)[:300]}") from None
    if key_field is not None:
        expected = str(getattr(record, key_field))
        if key is None or key != expected.encode():
            shown = key.decode("utf-8", "replace") if key is not None else None
            raise DecodeError(f"key {shown!r} does not match {key_field} {expected!r}")
    return record


def _major_version_problem(model: type[Record], exc: ValidationError) -> str | None:
    """The reason for a record of another major `schema_version`, which no field-by-field
    account would make clear (decision 0050). Checked only once validation has failed,
    so the hot path parses each record once."""
    for error in exc.errors(include_url=False):
        if error["loc"] == ("schema_version",):
            return (f"unsupported schema_version {error['input']!r}: this consumer reads "
                    f"{model.__name__} major version {SCHEMA_VERSION}")
    return None


def decode_key(key: bytes | None) -> str:
    if key is None:
        raise DecodeError("missing key")
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        raise DecodeError("key is not UTF-8") from None

