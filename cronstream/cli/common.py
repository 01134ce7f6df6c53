"""What every command shares: settings from flags and environment, exit codes, errors.

Exit codes (README, docs): 0 ok, 1 failed, 2 usage, 3 cannot reach Kafka or PostgreSQL,
4 not found. Errors print one line per cause on stderr; a closed stdout (`| head`) ends
the command quietly with 0.
"""

from __future__ import annotations

import difflib
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import click
from confluent_kafka import KafkaError, KafkaException

from cronstream.client import Client
from cronstream.errors import CronstreamError, NotFoundError, UnavailableError
from cronstream.shared.settings import ENV_PREFIX, Settings, SettingsError, from_text

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_NOT_FOUND = 0, 1, 2, 3, 4

# librdkafka's codes for "no broker answers".
_KAFKA_UNREACHABLE = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE,
                      KafkaError._TIMED_OUT}


def stdout_closed() -> None:
    """Point stdout at /dev/null, so that no later flush (the interpreter's last one
    included) complains about the closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


class Unreachable(click.ClickException):
    exit_code = EXIT_UNREACHABLE


class NotFound(click.ClickException):
    exit_code = EXIT_NOT_FOUND


def setting_assignments(items: tuple[str, ...]) -> dict[str, Any]:
    """`--set NAME=VALUE` items as settings overrides. NAME is a setting as its environment
    variable names it, with or without the prefix, in any case (`worker_dead_after_seconds`,
    `CRONSTREAM_WORKER_DEAD_AFTER_SECONDS`); VALUE is read as the variable's would be
    (lists comma-separated: `worker_queues=a,b`). Librdkafka properties go through --kafka-config."""
    settable = sorted(set(Settings.model_fields) - {"kafka_config"})
    found: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        key = name.strip().lower().removeprefix(ENV_PREFIX.lower())
        if not sep or key not in settable:
            close = difflib.get_close_matches(key, settable, n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise click.BadParameter(
                f"{item!r}: expected NAME=VALUE with NAME a setting; {hint}"
                f"settings: {', '.join(settable)} (Kafka properties: --kafka-config)",
                param_hint="--set")
        found[key] = from_text(key, value)
    return found


@dataclass
class CliState:
    overrides: dict[str, Any] = field(default_factory=dict)
    timeout: float = 10.0

    def settings(self, **more: Any) -> Settings:
        merged = {**self.overrides, **{k: v for k, v in more.items() if v is not None}}
        try:
            return Settings.from_env(merged)
        except SettingsError as exc:
            raise click.UsageError(str(exc)) from None

    def client(self, **more: Any) -> Client:
        """An SDK client for this command (close it, or use `with`)."""
        return Client(self.settings(**more), timeout=self.timeout)


pass_state = click.make_pass_decorator(CliState)


def _cause_chain(exc: BaseException) -> str:
    lines = []
    cause: BaseException | None = exc
    while cause is not None:
        lines.append(f"{type(cause).__name__}: {cause}")
        cause = cause.__cause__ or cause.__context__
    return "\n  caused by ".join(lines)


class CronstreamGroup(click.Group):
    """Maps errors to exit codes; an unexpected one prints its cause chain and exits 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except BrokenPipeError:
            # Before click turns it into exit 1: whoever read our output has gone
            # (`| head -1`), which is how pipelines end, not a failure.
            stdout_closed()
            raise click.exceptions.Exit(EXIT_OK) from None
        except KeyboardInterrupt:
            raise click.exceptions.Abort() from None
        except UnavailableError as exc:
            raise Unreachable(str(exc)) from None
        except NotFoundError as exc:
            raise NotFound(str(exc)) from None
        except CronstreamError as exc:
            raise click.ClickException(str(exc)) from None
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if err is not None and err.code() in _KAFKA_UNREACHABLE:
                raise Unreachable(f"cannot reach Kafka: {err.str()}") from None
            raise click.ClickException(_cause_chain(exc)) from exc
        except (ConnectionRefusedError, TimeoutError) as exc:
            raise Unreachable(f"cannot connect: {exc}") from None
        except Exception as exc:
            raise click.ClickException(_cause_chain(exc)) from exc
