"""A run's params on the command line: `--param KEY=VALUE`... and `--params-file FILE|-`.

    cronstream trigger nightly-export --param region=eu --param limit=100
    cronstream trigger nightly-export --params-file overrides.json

A VALUE that parses as JSON is that JSON (`limit=100` is a number, `dry=true` a boolean,
`tags=["a","b"]` a list); anything else is a string (`region=eu`). The file holds one JSON
object; `--param` flags are applied over it. The job's own params are the starting point:
these overlay them key by key (records.run_params), within the same limits.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

__all__ = ["given_params", "params_options"]


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_value(text: str) -> Any:
    """`text` as JSON when it is JSON (NaN and Infinity are not), else the string itself."""
    try:
        return json.loads(text, parse_constant=_no_constants)
    except ValueError:
        return text


def parse_param(given: str) -> tuple[str, Any]:
    """(key, value) of one `--param KEY=VALUE`; click.BadParameter naming it."""
    key, sep, value = given.partition("=")
    if not sep or not key.strip():
        raise click.BadParameter(f"{given!r}: expected KEY=VALUE (e.g. region=eu)",
                                 param_hint="'--param'")
    return key.strip(), parse_value(value)


def _read_file(path: str) -> dict[str, Any]:
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as file:
                text = file.read()
    except OSError as exc:
        raise click.BadParameter(f"{path}: {exc.strerror or exc}", param_hint="'--params-file'") from None
    where = "stdin" if path == "-" else path
    try:
        data = json.loads(text, parse_constant=_no_constants)
    except ValueError as exc:
        raise click.BadParameter(f"{where}: not valid JSON: {exc}",
                                 param_hint="'--params-file'") from None
    if not isinstance(data, dict):
        raise click.BadParameter(f"{where}: expected a JSON object of params, got "
                                 f"{type(data).__name__}", param_hint="'--params-file'")
    return data


def given_params(params: tuple[str, ...], params_file: str | None) -> dict[str, Any] | None:
    """The params given for the run (the file's, then each --param over them), or None
    when neither option was used."""
    if not params and params_file is None:
        return None
    given = _read_file(params_file) if params_file is not None else {}
    for item in params:
        key, value = parse_param(item)
        given[key] = value
    return given


def params_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The two options, as `params` (a tuple) and `params_file`."""
    fn = click.option("--params-file", "params_file", type=click.Path(allow_dash=True),
                      help="A JSON object of params for the run (- for stdin); "
                           "--param values apply over it.")(fn)
    return click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
                        help="A param for this run, over the job's own (repeatable). A VALUE "
                             "that parses as JSON is that JSON, otherwise a string.")(fn)
