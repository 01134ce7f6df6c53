"""The built-in `shell` handler: a record names a command the operator wrote; it never
builds an argv (docs/decisions/0038-shell-commands-are-templates.md).

The operator writes each command a worker may run, once, when starting it:

    cronstream worker --allow-shell 'backup=/usr/local/bin/backup --database {db:word}' \\
                      --allow-shell 'report=/opt/reports/run {day:int} --format={fmt:csv|pdf}'

and a job runs one by name, filling its placeholders:

    handler: shell
    params: {command: backup, args: {db: orders}}

The argv is the template's, element for element. A placeholder fills one element (or part
of one) with a value its type admits, so a record chooses *which* of the operator's
commands runs and the values of its typed holes — never an executable, an option or an
extra argument:

- `word`: 1–128 letters, digits and `_ . , : @ % + = -`, not starting with `-`, not only
  dots: never an option, a path or a second argument;
- `int`: a non-negative decimal integer below 10^18;
- `text`: up to 1,024 printable characters, not starting with `-`: any text as one
  argument — it grants whatever the program does with an argument it is given;
- `a|b|c`: one of the values listed.

A bare `--allow-shell NAME[,NAME...]` allows each executable run with no argument at all.
At start, a placeholder in the argv of a program that runs its arguments (shells,
interpreters, `env`, `find -exec`, `xargs`, `git`, `tar`, ...) is refused with why: the
record would choose the code. The command runs with a minimal environment
(`CHILD_ENVIRONMENT`: no `CRONSTREAM_*`, no Kafka or database secret), its executable
resolved once at start (a later PATH cannot swap it), killed with its handler process on
timeout or cancellation.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from cronstream.handlers import REGISTRY, Context, NonRetryableError
from cronstream.shared.escaping import CONTROL

# How the handler processes learn the worker's commands: they inherit this variable from
# the worker (the CLI exports the entries it checked), one entry per line.
ALLOW_SHELL_ENV = "CRONSTREAM_WORKER_ALLOW_SHELL"
OUTPUT_LIMIT = 16 * 1024
# The only variables a command inherits from the worker: nothing a record could read
# a secret from (the worker's own environment holds the database URL and SASL password).
CHILD_ENVIRONMENT = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME")
# Programs that run code or commands named in their arguments: with a placeholder in
# their argv, a record would choose what runs. Basenames, versions stripped
# (`python3.11` → `python`).
ARGUMENT_RUNNERS = frozenset({
    "sh", "bash", "dash", "zsh", "ksh", "mksh", "csh", "tcsh", "fish", "ash", "busybox",
    "env", "find", "xargs", "nice", "nohup", "timeout", "time", "sudo", "su", "doas", "runuser",
    "chroot", "setsid", "stdbuf", "ionice", "taskset", "chrt", "flock", "watch", "unshare",
    "nsenter", "setpriv", "strace", "ltrace", "gdb", "script", "run-parts", "parallel",
    "git", "tar", "rsync", "scp", "ssh", "sftp", "awk", "gawk", "mawk", "nawk", "sed", "perl",
    "python", "ruby", "node", "nodejs", "deno", "bun", "php", "lua", "luajit", "tclsh", "wish",
    "expect", "make", "cmake", "vi", "vim", "nvim", "ed", "ex", "emacs", "less", "more", "man",
    "docker", "podman", "kubectl", "psql", "mysql", "sqlite3", "zip", "unzip", "curl", "wget",
    "openssl", "java", "jshell", "osascript", "pwsh", "powershell", "R", "Rscript", "julia",
    "erl", "elixir", "groovy", "scala", "dotnet", "npx", "npm", "pip", "uv", "systemd-run",
})
_COMMAND_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# `{name}` or `{name:type}`; other braces (`{}`, `{1}`) are literal.
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][^{}]*)\}")
_PLACEHOLDER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_WORD = re.compile(r"^[A-Za-z0-9_.,:@%+=][A-Za-z0-9_.,:@%+=-]{0,127}$")
_INT = re.compile(r"^(0|[1-9][0-9]{0,17})$")
TEXT_LIMIT = 1024


class ShellConfigError(ValueError):
    """An `--allow-shell` entry cannot be used; the message names it and why."""


@dataclass(frozen=True, slots=True)
class Placeholder:
    name: str
    kind: str  # word | int | text | choice
    choices: tuple[str, ...] = ()

    def fill(self, value: Any) -> str:
        """`value` as this placeholder's text, or NonRetryableError naming the rule."""
        field = f"params.args.{self.name}"
        if self.kind == "int":
            text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
            if not isinstance(text, str) or not _INT.match(text):
                raise NonRetryableError(f"{field}: a non-negative integer, got {_shown(value)}")
            return text
        if not isinstance(value, str):
            raise NonRetryableError(f"{field}: a string, got {_shown(value)}")
        if self.kind == "choice":
            if value not in self.choices:
                raise NonRetryableError(f"{field}: one of {', '.join(self.choices)}, got {_shown(value)}")
        elif self.kind == "word":
            if not _WORD.match(value) or not value.strip("."):
                raise NonRetryableError(
                    f"{field}: a word (1-128 letters, digits, _ . , : @ % + = -; not starting with "
                    f"-, no / or space), got {_shown(value)}")
        elif not value or len(value) > TEXT_LIMIT or value.startswith("-") or CONTROL.search(value):
            raise NonRetryableError(f"{field}: 1-{TEXT_LIMIT} printable characters not starting "
                                    f"with -, got {_shown(value)}")
        return value


@dataclass(frozen=True, slots=True)
class Command:
    """One command the operator allows: its name and argv, placeholders in it."""

    name: str
    argv: tuple[str, ...]  # argv[0] resolved to a path at start
    placeholders: Mapping[str, Placeholder]

    def render(self, args: Any) -> list[str]:
        """The argv with `args` in its placeholders, every one checked, nothing else added."""
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise NonRetryableError(f"params.args: an object of the command's placeholders, got "
                                    f"{_shown(args)}")
        unknown = sorted(set(args) - set(self.placeholders))
        if unknown:
            raise NonRetryableError(f"params.args.{unknown[0][:64]}: command {self.name!r} has no such "
                                    f"placeholder ({self.signature()})")
        missing = sorted(set(self.placeholders) - set(args))
        if missing:
            raise NonRetryableError(f"params.args.{missing[0]}: missing (command {self.name!r} "
                                    f"takes {self.signature()})")
        values = {name: p.fill(args[name]) for name, p in self.placeholders.items()}
        return [_PLACEHOLDER.sub(lambda m: values[m.group(1).split(":", 1)[0]], element)
                for element in self.argv]

    def signature(self) -> str:
        if not self.placeholders:
            return "no args"
        return ", ".join(f"{p.name}: {'|'.join(p.choices) if p.kind == 'choice' else p.kind}"
                         for p in self.placeholders.values())


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _placeholder(spec: str, entry: str) -> Placeholder:
    name, _, kind = spec.partition(":")
    kind = kind or "word"
    if not _PLACEHOLDER_NAME.match(name):
        raise ShellConfigError(f"{entry!r}: placeholder {{{spec}}} needs a name (letters, digits, _)")
    if "|" in kind:
        choices = tuple(kind.split("|"))
        if not all(choices) or any(c.startswith("-") or CONTROL.search(c) for c in choices):
            raise ShellConfigError(f"{entry!r}: placeholder {{{spec}}}: empty choice, or one "
                                   "starting with -")
        return Placeholder(name, "choice", choices)
    if kind not in ("word", "int", "text"):
        raise ShellConfigError(f"{entry!r}: placeholder {{{spec}}}: type {kind!r} is not word, int, "
                               "text or a|b|c")
    return Placeholder(name, kind)


def _runs_its_arguments(executable: str) -> bool:
    base = os.path.basename(executable)
    return base in ARGUMENT_RUNNERS or re.sub(r"[0-9.]+$", "", base) in ARGUMENT_RUNNERS


def _resolve(executable: str, entry: str) -> str:
    found = shutil.which(executable)
    if found is None:
        raise ShellConfigError(f"{entry!r}: {executable!r} is not an executable "
                               + ("file" if "/" in executable else "on the worker's PATH"))
    return os.path.abspath(found)


def _executables(entry: str) -> list[Command]:
    """`pg_vacuum,/usr/local/bin/rotate`: each executable, run with no argument at all."""
    commands = []
    for executable in (e.strip() for e in entry.split(",")):
        if not executable:
            continue
        if executable == "*" or executable.startswith("-") or any(c.isspace() for c in executable):
            raise ShellConfigError(f"{executable!r}: name a command (NAME=ARGV) or an executable, "
                                   "not a pattern or an option")
        commands.append(Command(os.path.basename(executable), (_resolve(executable, entry),), {}))
    return commands


def parse_entry(entry: str) -> list[Command]:
    """One `--allow-shell` entry: `NAME=ARGV`, or executables allowed with no arguments."""
    entry = entry.strip()
    name, eq, template = entry.partition("=")
    if not eq:
        return _executables(entry)
    name = name.strip()
    if not _COMMAND_NAME.match(name):
        raise ShellConfigError(f"{entry!r}: command name {name!r} must match {_COMMAND_NAME.pattern}")
    try:
        argv = shlex.split(template)
    except ValueError as exc:
        raise ShellConfigError(f"{entry!r}: {exc}") from None
    if not argv:
        raise ShellConfigError(f"{entry!r}: an empty command")
    if _PLACEHOLDER.search(argv[0]):
        raise ShellConfigError(f"{entry!r}: the executable is the operator's to write, never a "
                               "placeholder")
    placeholders: dict[str, Placeholder] = {}
    for match in (m for element in argv[1:] for m in _PLACEHOLDER.finditer(element)):
        p = _placeholder(match.group(1), entry)
        if placeholders.setdefault(p.name, p) != p:
            raise ShellConfigError(f"{entry!r}: placeholder {p.name!r} has two types")
    if placeholders and _runs_its_arguments(argv[0]):
        raise ShellConfigError(
            f"{entry!r}: {os.path.basename(argv[0])!r} runs code or commands named in its "
            "arguments, so a placeholder would let a record choose what runs; write its argv in "
            "full, or put the command in a script of yours and allow that")
    return [Command(name, (_resolve(argv[0], entry), *argv[1:]), placeholders)]


def parse(entries: Iterable[str]) -> dict[str, Command]:
    """Every entry's commands by name; two commands of one name are refused."""
    commands: dict[str, Command] = {}
    for entry in entries:
        for command in parse_entry(entry):
            if command.name in commands:
                raise ShellConfigError(f"command {command.name!r} is allowed twice")
            commands[command.name] = command
    return commands


_commands: dict[str, Command] = {}  # filled in place by enable


def child_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {k: env[k] for k in CHILD_ENVIRONMENT if k in env}


def _prctl() -> Any:
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the command may outlive a killed handler
        return None


_PRCTL = _prctl()  # looked up before any fork: the child only calls it


def _die_with_parent() -> None:
    # The handler process is SIGKILLed on timeout; its command must not outlive it
    # (PR_SET_PDEATHSIG). Runs between fork and exec: nothing here but the one call.
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)


class _Tail:
    """The last `limit` bytes of a stream, read on a thread of its own."""

    def __init__(self, stream: IO[bytes], limit: int = OUTPUT_LIMIT) -> None:
        self._data = bytearray()
        self._limit = limit
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        fd = stream.fileno()
        for chunk in iter(lambda: os.read(fd, 65536), b""):
            self._data += chunk
            if len(self._data) > 2 * self._limit:
                del self._data[:-self._limit]

    def text(self) -> str:
        self._thread.join()
        return bytes(self._data[-self._limit:]).decode("utf-8", "replace")


def shell(ctx: Context) -> dict[str, Any]:
    """Runs the allowed command named by `params.command`, its placeholders filled from
    `params.args`; returns its exit code and the last 16 KiB of each stream."""
    name = ctx.params.get("command")
    if not isinstance(name, str):
        raise NonRetryableError(
            f"params.command: the name of a command this worker allows ({', '.join(sorted(_commands))})"
            + ("; an argv list is not accepted: the operator writes the argv "
               "(--allow-shell 'NAME=ARGV')" if isinstance(name, list) else ""))
    command = _commands.get(name)
    if command is None:
        raise NonRetryableError(f"params.command: {name[:128]!r} is not a command this worker allows "
                                f"({', '.join(sorted(_commands))})")
    argv = command.render(ctx.params.get("args"))
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=child_environment(),
                          # One foreign call, looked up before the fork (_PRCTL): none of
                          # the locks another thread may hold is taken in the child.
                          preexec_fn=_die_with_parent, close_fds=True) as proc:  # noqa: PLW1509
        assert proc.stdout is not None and proc.stderr is not None
        out, err = _Tail(proc.stdout), _Tail(proc.stderr)
        while proc.poll() is None:
            if ctx.wait_cancelled(0.05):
                proc.kill()
                proc.wait()
                out.text(), err.text()  # the readers end with the pipes
                return {"command": name, "cancelled": True}
        stdout, stderr = out.text(), err.text()
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: exit status {proc.returncode}: {stderr.strip()[-2000:]}")
    return {"command": name, "exit_code": 0, "stdout": stdout, "stderr": stderr}


def enable(entries: Sequence[str] | None = None) -> dict[str, Command]:
    """Register `shell` for the commands of `entries` (None: those of the worker's
    environment, in a handler process); no entry registers nothing. Raises
    ShellConfigError for an entry that cannot be used."""
    if entries is None:
        entries = [e for e in os.environ.get(ALLOW_SHELL_ENV, "").split("\n") if e.strip()]
    commands = parse(entries)
    _commands.clear()
    _commands.update(commands)
    if _commands:
        REGISTRY.register("shell", shell)
    return commands
