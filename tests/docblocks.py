"""The code blocks of the README and of docs/, as a user would paste them (pure: no process runs).

``tests/test_docs.py`` runs what this module finds. A fenced block is *runnable* when its
language is a shell (``sh``, ``bash``, ``shell``, ``console``) or Python (``python``,
``py``); every runnable block is run unless the HTML comment just before it says otherwise.
The comment's words (shell-quoted)::

    <!-- docs-test: skip "why it cannot run here" -->   not run; the harness lists it with the reason
    <!-- docs-test: output -->                          what the runnable block before it prints
    <!-- docs-test: output unordered -->                the same, its lines in any order
    <!-- docs-test: file=train.py -->                   saved as that file in the page's folder, not run
    <!-- docs-test: needs=hosts,server timeout=180 -->  options of a block that runs (below)
    <!-- docs-test: skip-page "why" -->                 (anywhere in a page) none of its blocks runs

Options of a block that runs:

* ``needs=``: what it runs against, comma-separated: ``hosts`` (SSH test hosts ``th1``..``th4``,
  through ``$TLAUNCH_SSH_CONFIG``), ``slurm`` (the SLURM test cluster: ``$SLURM_CONF``),
  ``kube`` (the stand-in Kubernetes API server and its operator: ``$KUBECONFIG``),
  ``server`` (a job server: ``$TLAUNCH_SERVER``, ``$TLAUNCH_TOKEN``), ``torch``, ``deepspeed``
  (DeepSpeed on this machine's CPUs, ``DS_ACCELERATOR=cpu``), ``root`` (it makes test hosts of
  its own, as ``tlaunch demo`` does).
* ``cwd=``: the folder it runs from, relative to the repository (``cwd=.`` for ``pip install .``).
  By default every block runs in its page's own folder: a fresh temporary one, shared by the
  page's blocks in order, where ``examples/`` is the repository's, as in a clone (so a user's
  ``python examples/...`` runs as written and what a block writes stays out of the
  repository); on a filesystem every SSH test host sees when a block of the page needs them,
  as a shared home.
* ``file=NAME``: the block is saved as NAME in the page's folder and not run (a script or a
  config file that the blocks after it use). A Python block that runs is saved as
  ``snippet.py`` and run as ``python snippet.py``.
* ``timeout=`` (seconds, default 120), ``exit=`` (the exit status it ends with, default 0).
* ``venv=fresh``: it runs in a virtualenv made for it, empty (``pip install .`` as on a
  fresh machine).
* ``lines=N``: only its first N lines run; ``rest="why"`` says why the others do not.

An ``output`` block is checked against what its block printed (stdout and stderr together):
each of its lines must appear in that order, each matching a whole line, where ``...``
stands for any text (a line of only ``...`` stands for lines left out). Lines of a
``console`` block that start with ``$ `` are commands; the lines after each are its output.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from markdown_it import MarkdownIt

SHELLS = {"sh", "bash", "shell", "console"}
PYTHONS = {"python", "py", "python3"}
NEEDS = {"hosts", "slurm", "kube", "server", "torch", "deepspeed", "root"}
_DIRECTIVE = re.compile(r"<!--\s*docs-test:(.*?)-->", re.S)
_OPENINGS = (
    "list_item_open",
    "bullet_list_open",
    "ordered_list_open",
)  # may stand between a comment and its block
_OPTIONS = {"needs", "cwd", "file", "timeout", "exit", "venv", "lines", "rest"}  # and "unordered" (output)


class DirectiveError(ValueError):
    """A ``docs-test`` comment that cannot be read; the message names the page and line."""


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page.

    Attributes:
        page: the page, relative to the repository (``README.md``, ``docs/torch.md``).
        line: the line of its opening fence (1-based).
        lang: the fence's language (``sh``, ``python``...; empty when none).
        code: its text.
        skip: why it does not run (None: it runs, or it is not runnable).
        output: the expected output that followed it (None: none is shown).
        options: its directive's options (``needs``, ``cwd``...).
    """

    page: str
    line: int
    lang: str
    code: str
    skip: str | None = None
    output: str | None = None
    options: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        """``page:line``, the block's name in test ids and messages."""
        return f"{self.page}:{self.line}"

    @property
    def runnable(self) -> bool:
        """Whether it runs: a shell or Python block that is not saved as a file."""
        if self.lang not in SHELLS | PYTHONS:
            return False
        return "file" not in self.options

    @property
    def needs(self) -> list[str]:
        """What it runs against (``hosts``, ``server``...)."""
        return [n for n in self.options.get("needs", "").split(",") if n]

    @property
    def timeout(self) -> float:
        """Seconds it may take."""
        return float(self.options.get("timeout", "120"))

    @property
    def exit(self) -> int:
        """The exit status it is expected to end with."""
        return int(self.options.get("exit", "0"))

    def script(self) -> str:
        """What runs: the shell commands (prompts and inline output removed) or the Python source."""
        if self.lang in PYTHONS:
            code = self.code
        else:
            code = "\n".join(cmd for cmd, _ in console_steps(self.code)) + "\n"
        if "lines" in self.options:
            code = "\n".join(code.splitlines()[: int(self.options["lines"])]) + "\n"
        return code

    def expected(self) -> str | None:
        """What it is expected to print: its ``output`` block, or a console block's inline output."""
        if self.output is not None:
            return self.output
        inline = [out for _, out in console_steps(self.code) if out]
        return "\n".join(inline) if inline else None


def console_steps(code: str) -> list[tuple[str, str]]:
    """A shell block as (command, output shown after it) pairs.

    Without ``$ `` prompts the whole block is one command with no output. With them, a
    command runs on past lines ending in a backslash, and the lines up to the next prompt
    are its output.
    """
    lines = code.splitlines()
    if not any(line.startswith("$ ") for line in lines):
        return [(code.rstrip("\n"), "")]
    steps: list[tuple[str, list[str]]] = []
    continued = False
    for line in lines:
        if line.startswith("$ ") and not continued:
            steps.append((line[2:], []))
            continued = line.endswith("\\")
        elif continued:
            steps[-1] = (steps[-1][0] + "\n" + line, steps[-1][1])
            continued = line.endswith("\\")
        elif steps:
            steps[-1][1].append(line)
    return [(cmd, "\n".join(out).strip("\n")) for cmd, out in steps]


def parse_directive(text: str, where: str) -> dict[str, str]:
    """The words of one ``docs-test`` comment as a dict (``skip``, ``output``, options)."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise DirectiveError(f"{where}: docs-test comment {text.strip()!r}: {exc}") from None
    found: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("skip", "skip-page"):
            if i + 1 >= len(words) or "=" in words[i + 1]:
                raise DirectiveError(f'{where}: {word} needs a reason: <!-- docs-test: {word} "why" -->')
            found[word] = words[i + 1]
            i += 2
            continue
        if word == "output":
            found["output"] = ""
        elif word == "unordered":
            found["unordered"] = ""
        elif "=" in word and word.split("=", 1)[0] in _OPTIONS:
            key, value = word.split("=", 1)
            found[key] = value
        else:
            raise DirectiveError(
                f'{where}: docs-test word {word!r} is not one of skip "why", skip-page "why", output, '
                f"or {', '.join(sorted(k + '=' for k in _OPTIONS))} (see tests/docblocks.py)"
            )
        i += 1
    unknown = set(found.get("needs", "").split(",")) - NEEDS - {""}
    if unknown:
        raise DirectiveError(f"{where}: needs={found['needs']}: {sorted(unknown)} not in {sorted(NEEDS)}")
    if found.get("venv", "fresh") != "fresh":
        raise DirectiveError(f"{where}: venv={found['venv']}: the only value is venv=fresh")
    if "lines" in found and "rest" not in found:
        raise DirectiveError(f'{where}: lines={found["lines"]} needs rest="why the other lines do not run"')
    return found


def page_blocks(root: Path, page: Path) -> list[Block]:
    """Every fenced block of ``page`` with its directive applied."""
    rel = page.relative_to(root).as_posix()
    tokens = MarkdownIt("commonmark").parse(page.read_text())
    blocks: list[Block] = []
    pending: dict[str, str] | None = None
    page_skip: str | None = None
    pending_line = 0
    for token in tokens:
        line = token.map[0] + 1 if token.map else 0
        if token.type == "html_block" and "docs-test:" in token.content:
            for match in _DIRECTIVE.finditer(token.content):
                words = parse_directive(match.group(1), f"{rel}:{line}")
                if "skip-page" in words:
                    page_skip = words["skip-page"]
                else:
                    pending, pending_line = words, line
            continue
        if token.type != "fence":
            if pending is not None and token.type not in (
                "list_item_open",
                "bullet_list_open",
                "ordered_list_open",
            ):
                raise DirectiveError(
                    f"{rel}:{pending_line}: a docs-test comment must come right before its block"
                )
            continue
        lang = token.info.split()[0].lower() if token.info.strip() else ""
        words, pending = pending or {}, None
        if "output" in words:
            if not blocks or not blocks[-1].runnable:
                raise DirectiveError(f"{rel}:{line}: an output block must follow a runnable block")
            options = {**blocks[-1].options, **({"unordered": ""} if "unordered" in words else {})}
            blocks[-1] = dataclasses.replace(blocks[-1], output=token.content, options=options)
            continue
        skip = words.pop("skip", None) or page_skip
        blocks.append(Block(rel, line, lang, token.content, skip, None, words))
    return blocks


def doc_pages(root: Path) -> list[Path]:
    """The README and every Markdown page under docs/, in a stable order."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def all_blocks(root: Path) -> Iterator[Block]:
    """Every block of every page (:func:`doc_pages`)."""
    for page in doc_pages(root):
        yield from page_blocks(root, page)


def output_mismatch(expected: str, actual: str, ordered: bool = True) -> str | None:
    """None if ``actual`` shows every line of ``expected`` in order; else the first line missing.

    A line of ``expected`` matches a whole line of ``actual`` (both stripped of trailing
    blanks), where ``...`` matches any text; a line of only ``...`` matches nothing itself.
    With ``ordered=False`` each expected line matches a line of its own, in any order.
    """
    lines = [line.rstrip() for line in actual.splitlines()]
    used: set[int] = set()
    at = 0
    for want in (w.rstrip() for w in expected.splitlines()):
        if want.strip() in ("", "..."):
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in want.split("...")) + r"\Z")
        if not ordered:
            hit = next((i for i, line in enumerate(lines) if i not in used and pattern.match(line)), None)
            if hit is None:
                return want
            used.add(hit)
            continue
        while at < len(lines) and not pattern.match(lines[at]):
            at += 1
        if at == len(lines):
            return want
        at += 1
    return None
