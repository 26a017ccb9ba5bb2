"""Where the CLI's output goes: tables and colour for people at a terminal, plain aligned
text for pipes and files (so `| grep`, `| head` and scripts see no escape codes), and the
one formatter every command's `--help` uses."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn, TextIO

from rich_argparse import RawDescriptionRichHelpFormatter

from planner_svc.cli.ops_view import TextTable, plain_table


class UsageError(Exception):
    """A mistake in what the user gave (a flag's value, a file, a missing extra) or in the
    machine's setup: `cacheroute` prints the message as one line and exits with
    `exit_code` (2, as for a flag argparse refuses, unless said otherwise)."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def one_line(message: str) -> str:
    """A message for one stderr line: a multi-line one (a server's error with its log's
    tail) as its first line and, in brackets, its last (usually the cause)."""
    lines = [" ".join(ln.split()) for ln in message.splitlines() if ln.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    return f"{lines[0].rstrip(':')} ({lines[-1]})"


class Parser(argparse.ArgumentParser):
    """Refuses a bad command line in one line, what is wrong and where the help is, rather
    than the usage text first (pages of it for the larger commands, which push the error
    itself out of view). Sub-commands inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class HelpFormatter(RawDescriptionRichHelpFormatter):
    """Descriptions as written (they are paragraphs), every meaningful default shown,
    colour only on a terminal (rich decides, and honours NO_COLOR)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (default in (None, "", False, argparse.SUPPRESS) or "default" in text
                or (action.option_strings == [] and action.nargs in ("?", "*"))):
            return text
        return f"{text} (default: %(default)s)"


class AdvancedOptions:
    """Options a command's `--help` leaves out and its `--help-all` shows: the knobs few runs
    turn, working as ever, kept out of the way of the options most runs need."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self._hidden: list[tuple[argparse.Action, str]] = []
        self._groups: list[tuple[Any, str | None]] = []
        parser.add_argument("--help-all", action=HelpAll, advanced=self,
                            help="show this help with the advanced options too, and exit")

    def group(self, parser: argparse.ArgumentParser, title: str,
              description: str | None = None) -> Any:
        """An argument group that `--help` leaves out (every option in it is advanced)."""
        group = parser.add_argument_group(title)
        self._groups.append((group, description))
        return group

    def add(self, group: Any, *flags: str, help: str, **kwargs: Any) -> argparse.Action:
        """An option parsed as any other, its help shown by `--help-all` only."""
        action: argparse.Action = group.add_argument(*flags, help=argparse.SUPPRESS, **kwargs)
        self._hidden.append((action, help))
        return action

    def reveal(self) -> None:
        """Give the advanced options (and their groups' descriptions) back their help."""
        for action, text in self._hidden:
            action.help = text
        for group, description in self._groups:
            group.description = description


class HelpAll(argparse.Action):
    """`--help-all`: reveal the command's advanced options, print its help and exit."""

    def __init__(self, option_strings: list[str], dest: str, *, advanced: AdvancedOptions,
                 help: str | None = None) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                         nargs=0, help=help)
        self.advanced = advanced

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        self.advanced.reveal()
        parser.print_help()
        parser.exit()


def command(sub: Any, name: str, *, help: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A sub-command whose own `--help` opens with the line the command list shows."""
    kwargs.setdefault("description", help)
    kwargs.setdefault("formatter_class", HelpFormatter)
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help, **kwargs)
    return parser


def show(output: str | TextTable, stream: TextIO | None = None) -> None:
    """Print a command's human output: a table as a rich table on a terminal, else as
    aligned plain text."""
    out = stream or sys.stdout
    if isinstance(output, TextTable) and out.isatty():
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        table = Table(box=None, header_style="bold", pad_edge=False)
        for column in output.columns:
            table.add_column(column.name, justify="right" if column.right else "left")
        for row in output.rows:
            table.add_row(*(Text(cell) for cell in row))  # data, never rich markup
        Console(file=out).print(table)
        return
    text = plain_table(output) if isinstance(output, TextTable) else output
    print(text, file=out, flush=True)
