"""The settings reference page (`settings.md` on the docs site), generated from the settings
as the code declares them, at every build: an mkdocs hook (`hooks:` in mkdocs.yml), so the page
cannot drift from the code and there is no copy to keep in step.

    .venv/bin/python docs/gen_settings.py          # print the page (Markdown) to stdout

The planner's and the stream worker's settings are dataclasses: a row per field, its
description taken from the comments beside and above it in the source. The gateway's and the
endpoint picker's are flag tables (name, type, default, help).
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import sys
import tokenize
from typing import Any

PAGE = "settings.md"

HEAD = """# Settings reference

Generated from the code by `docs/gen_settings.py` each time the site is built.
Every setting is a flag, an environment variable, or (for the planner's run-time knobs)
`cacheroute config set`; a flag beats the environment, which beats the default.
"""


def _comments(cls: type) -> dict[str, str]:
    """Each field's description: the comment block right above it and its own trailing
    comment. A block above a group of fields is shown on the first of them only: nothing
    in the source says where a group ends."""
    source = inspect.getsource(cls)
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    names = {f.name for f in dataclasses.fields(cls)}
    block: list[str] = []
    described: dict[str, str] = {}
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.COMMENT and tokens[i - 1].type in (tokenize.NL, tokenize.INDENT,
                                                                   tokenize.DEDENT,
                                                                   tokenize.NEWLINE):
            block.append(tok.string.lstrip("#").strip())
        elif tok.type == tokenize.NL and tokens[i - 1].type == tokenize.NL:
            block = []  # a comment followed by a blank line describes no field
        elif (tok.type == tokenize.NAME and tok.string in names and tok.start[1] == 4
              and tokens[i + 1].string == ":"):
            above, block = " ".join(block), []
            described[tok.string] = " ".join(x for x in (above, _trailing(tokens, i)) if x)
    return described


def _trailing(tokens: list[tokenize.TokenInfo], i: int) -> str:
    line = tokens[i].start[0]
    for tok in tokens[i:]:
        if tok.start[0] != line:
            return ""
        if tok.type == tokenize.COMMENT:
            return tok.string.lstrip("#").strip()
    return ""


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return ""


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        value = ",".join(map(str, value))
    text = repr(value) if isinstance(value, str) else str(value)
    return f"`{text}`".replace("|", "\\|")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _dataclass_table(cls: type, flag_of: Any, env_of: Any, skip: tuple[str, ...] = ()) -> str:
    notes = _comments(cls)
    rows = ["| setting | flag | environment | default | what |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        rows.append(f"| `{f.name}` ({_cell(kind)}) | `{flag_of(f.name)}` | `{env_of(f.name)}` "
                    f"| {_shown(_default(f))} | {_cell(notes.get(f.name, ''))} |")
    return "\n".join(rows)


def _flag_table(flags: dict[str, tuple[Any, Any, str]], env_prefix: str) -> str:
    rows = ["| flag | environment | type | default | what |", "|---|---|---|---|---|"]
    for flag, (kind, default, text) in flags.items():
        env = env_prefix + flag.upper().replace("-", "_")
        rows.append(f"| `--{flag}` | `{env}` | {getattr(kind, '__name__', str(kind))} "
                    f"| {_shown(default)} | {_cell(text)} |")
    return "\n".join(rows)


def render() -> str:
    """The page, as the code declares the settings today."""
    from planner_svc.cli.epp_cmd import FLAGS as EPP_FLAGS
    from planner_svc.cli.gateway_cmd import FLAGS as GATEWAY_FLAGS
    from planner_svc.settings import PlannerSettings
    from streams.settings import ENV_PREFIX
    from streams.settings import Settings as StreamSettings

    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    def env(name: str) -> str:
        return ENV_PREFIX + name.upper()

    sections = [
        HEAD,
        "## The planner (`python -m planner_svc`)\n\n"
        "Declared in `planner_svc/settings.py` (`PlannerSettings`).\n\n"
        + _dataclass_table(PlannerSettings, flag, env, skip=("extra",)),
        "## The stream worker (`python -m streams worker`)\n\n"
        "Declared in `streams/settings.py` (`Settings`).\n\n"
        + _dataclass_table(StreamSettings, flag, env),
        "## The gateway (`cacheroute gateway`)\n\n"
        "Declared in `planner_svc/cli/gateway_cmd.py` and `planner_svc/cli/edge_args.py` "
        "(`FLAGS`); [gateway.md](gateway.md) explains them.\n\n"
        + _flag_table(GATEWAY_FLAGS, "CACHEROUTE_GATEWAY_"),
        "## The endpoint picker (`cacheroute epp`)\n\n"
        "Declared in `planner_svc/cli/epp_cmd.py` (`FLAGS`).\n\n"
        + _flag_table(EPP_FLAGS, "CACHEROUTE_EPP_"),
    ]
    return "\n\n".join(s.strip() for s in sections) + "\n"


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: add the page, rendered now, to the site's files."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files


if __name__ == "__main__":
    sys.stdout.write(render())
