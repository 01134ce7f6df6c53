"""What every command shares: settings from flags and environment, and error display."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import click

from cronstream.shared.settings import Settings, SettingsError


@dataclass
class CliState:
    overrides: dict[str, Any] = field(default_factory=dict)

    def settings(self, **more: Any) -> Settings:
        merged = {**self.overrides, **{k: v for k, v in more.items() if v is not None}}
        try:
            return Settings.from_env(merged)
        except SettingsError as exc:
            raise click.UsageError(str(exc)) from None


pass_state = click.make_pass_decorator(CliState)


class CronstreamGroup(click.Group):
    """Prints the cause chain of an unexpected error, one line each, and exits 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except KeyboardInterrupt:
            raise click.exceptions.Abort() from None
        except Exception as exc:
            lines = []
            cause: BaseException | None = exc
            while cause is not None:
                lines.append(f"{type(cause).__name__}: {cause}")
                cause = cause.__cause__ or cause.__context__
            raise click.ClickException("\n  caused by ".join(lines)) from exc
