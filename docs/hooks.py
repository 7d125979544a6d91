"""MkDocs hooks of the docs site (``mkdocs.yml``'s ``hooks``): pages made from the code itself.

``<!-- cli-reference: tlaunch -->`` in a page becomes the ``--help`` of that command and of
every subcommand under it, taken from the parsers themselves at build time, so the CLI
reference cannot drift from the CLI; ``<!-- rest-reference -->`` becomes the job server's
endpoints, taken from its OpenAPI document. The plots of ``bench/results/`` go into the
site as they are, so that a page shows them with the path that also works on the
repository's own view of the page (``../bench/results/x.png``).
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from collections.abc import Iterator
from typing import Any

_MARKER = re.compile(r"^<!-- cli-reference: (\S+) -->$", re.M)
_REST = "<!-- rest-reference -->"
_PLOTS = "../bench/results/"
# Docstrings name Python objects with Sphinx's roles (:class:`~a.B`); mkdocstrings shows them as written.
_ROLE = re.compile(r":(?:attr|class|data|exc|func|meth|mod|obj):<code>~?([^<]*)</code>")


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from tlaunch.cli.main import build_parser
    from tlaunch.cli.tlaunchrun import parser

    return {"tlaunch": build_parser(), "tlaunchrun": parser()}


def _walk(name: str, parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    seen: set[int] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield from _walk(f"{name} {sub_name}", sub)


def _reference(command: str) -> str:
    parsers = _parsers()
    if command not in parsers:
        raise ValueError(f"cli-reference: {command!r} is not one of {sorted(parsers)}")
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal's width: the same on every build
    try:
        parts = []
        for name, parser in _walk(command, parsers[command]):
            parser.prog = name
            parts.append(f"### `{name}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
        return "\n".join(parts)
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def _rest_reference() -> str:
    """A table of the job server's endpoints, from the OpenAPI document of a server made here."""
    from tlaunch.server.app import Settings, create_app
    from tlaunch.server.auth import Users

    with tempfile.TemporaryDirectory() as home:
        spec = create_app(Settings(home=home, users=Users({}))).openapi()
    rows = ["| method | path | what |", "| --- | --- | --- |"]
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            what = (op.get("description") or op.get("summary") or "").strip().split("\n\n")[0]
            what = " ".join(what.split()).replace("|", "\\|")
            rows.append(f"| `{method.upper()}` | `{path}` | {what} |")
    return "\n".join(rows) + "\n"


def on_files(files: Any, config: Any) -> Any:
    """Add the bench scripts' plots to the site, at ``bench/results/<name>.png``."""
    from mkdocs.structure.files import File

    results = os.path.join(os.path.dirname(config["docs_dir"]), "bench", "results")
    for name in sorted(os.listdir(results)):
        if name.endswith(".png"):
            path = os.path.join(results, name)
            files.append(File.generated(config, f"bench/results/{name}", abs_src_path=path))
    return files


def on_page_content(html: str, **kwargs: Any) -> str:
    """Show a docstring's ``:class:`~a.B``` as the code ``a.B``, without the role."""
    return _ROLE.sub(lambda m: f"<code>{m.group(1)}</code>", html)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Replace each ``cli-reference`` marker with that command's help, all subcommands included,
    and a ``rest-reference`` marker with the job server's endpoints."""
    markdown = _MARKER.sub(lambda m: _reference(m.group(1)), markdown)
    page = kwargs["page"]
    up = "../" * page.file.src_uri.count("/")  # from the page's folder to the docs' root
    markdown = markdown.replace(f"]({_PLOTS}", f"]({up}bench/results/")
    if _REST in markdown:
        markdown = markdown.replace(_REST, _rest_reference())
    return markdown
