"""`cronstream completion bash|zsh|fish`: the shell completion script.

    eval "$(cronstream completion bash)"                       # ~/.bashrc
    eval "$(cronstream completion zsh)"                        # ~/.zshrc
    cronstream completion fish > ~/.config/fish/completions/cronstream.fish
"""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

from cronstream.cli.output import emit

PROG = "cronstream"
COMPLETE_VAR = "_CRONSTREAM_COMPLETE"


@click.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the completion script for SHELL (commands, options, choices).

    \b
    bash:  eval "$(cronstream completion bash)"   in ~/.bashrc
    zsh:   eval "$(cronstream completion zsh)"    in ~/.zshrc
    fish:  cronstream completion fish > ~/.config/fish/completions/cronstream.fish
    """
    root = ctx.find_root().command
    completer = get_completion_class(shell)
    assert completer is not None  # the three choices are click's built-ins
    emit(completer(root, {}, PROG, COMPLETE_VAR).source())


COMMANDS = [completion]
