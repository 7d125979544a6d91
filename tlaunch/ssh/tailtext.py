"""What ``tail -F`` prints, back into each file's lines (pure: the caller reads the channel).

``tail -v`` on several files names each (``==> path <==``) before its lines,
and a file's output may stop mid-line: a node that writes ``trainer got`` and
then ``[0, 10]`` in two writes (``print`` with several arguments, unbuffered,
does) may have tail read the first piece, switch to another file, and come
back for the rest. Tail then ends the unfinished line with the newline it
puts before the next file's name, so the line arrives in two pieces, each
looking whole. The same happens before the marks of tlaunch's own shell
(``\\n<mark>``). The stream says which case it is by what follows a line::

    abc\\n\\n==> f2 <==\\n    the file's line "abc" was whole (a blank line, then the name)
    abc\\n==> f2 <==\\n      "abc" was cut: its file's next output goes on with it

so a line is held until the next line (or :meth:`TailText.settle`, once
nothing came for a while) says whether its file had ended it. Blank lines are
held the same way: a blank line right before a name or a mark is tail's own.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["TailText"]


class TailText:
    """The lines of the files one ``tail -F`` follows, from its output (see the module docstring).

    Args:
        first: the file whose lines come first (the only one, without headers).
        headers: tail names each file before its lines (``-v``, several files).
        on_line: called with (file, line) for each whole line of a file.
    """

    def __init__(self, first: str, headers: bool, on_line: Callable[[str, str], None]) -> None:
        self.current = first
        self._headers = headers
        self._on_line = on_line
        self._held: str | None = None  # a line of the current file, not yet known to be whole
        self._blank = False  # a blank line held: the file's own, or tail's before a name or mark
        self._cut: dict[str, str] = {}  # each file's line that tail cut: its next output goes on with it

    @property
    def holding(self) -> bool:
        """Whether a line waits for what follows it (the caller settles it after a short wait)."""
        return self._held is not None

    def line(self, text: str) -> None:
        """One line of tail's output (without its newline), marks and the first answer excluded."""
        if self._headers and text.startswith("==> ") and text.endswith(" <=="):
            self.mark()
            self.current = text[4:-4]
            return
        self.settle()  # more came after it: the line held was whole
        if self._blank:
            self._emit("")
            self._blank = False
        if not text:
            self._blank = True
        else:
            self._held = text

    def mark(self) -> None:
        """A mark (a file's name, or the shell's ``\\n<mark>``) came: its newline cut a line held."""
        if self._held is not None:
            self._cut[self.current] = self._cut.get(self.current, "") + self._held
            self._held = None
        self._blank = False

    def settle(self) -> None:
        """Nothing more came for a while: the line held is whole."""
        if self._held is not None:
            held, self._held = self._held, None
            self._emit(held)

    def end(self, rest: str = "") -> None:
        """The output ended (``rest``: what came after its last newline): every unended line is given."""
        self.settle()
        if rest:
            self._cut[self.current] = self._cut.get(self.current, "") + rest
        for path, text in list(self._cut.items()):
            self._on_line(path, text)
        self._cut.clear()
        self._blank = False

    def _emit(self, text: str) -> None:
        self._on_line(self.current, self._cut.pop(self.current, "") + text)
