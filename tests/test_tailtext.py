"""What ``tail -F`` prints, back into each file's lines (tlaunch.ssh.tailtext, pure)."""

from __future__ import annotations

from tlaunch.ssh.tailtext import TailText


def _read(output: str, headers: bool = True, settle_at: tuple[int, ...] = ()) -> list[tuple[str, str]]:
    """The lines ``output`` (tail's, ``|M|`` a mark of tlaunch's shell) gives, settling after line i."""
    seen: list[tuple[str, str]] = []
    text = TailText("a", headers, lambda path, line: seen.append((path, line)))
    *lines, rest = output.split("\n")
    for i, line in enumerate(lines):
        if line == "|M|":
            text.mark()
        else:
            text.line(line)
        if i in settle_at:
            text.settle()
    text.end(rest)
    return seen


def test_a_line_cut_by_the_next_files_name_goes_on_with_its_files_next_output() -> None:
    # tail read "trainer got" of a, then b's line (its name after a newline), then the rest of a's.
    out = "==> a <==\ntrainer got\n==> b <==\nother\n\n==> a <==\n [0, 10]\n"
    assert _read(out) == [("b", "other"), ("a", "trainer got [0, 10]")]


def test_whole_lines_blank_lines_and_tails_own_blank_before_a_name() -> None:
    out = "==> a <==\none\n\ntwo\n\n\n==> b <==\nthree\n"
    assert _read(out) == [("a", "one"), ("a", ""), ("a", "two"), ("a", ""), ("b", "three")]


def test_a_line_cut_by_a_mark_of_the_shell_goes_on_after_it() -> None:
    assert _read("part\n|M|\n rest\nnext\n", headers=False) == [("a", "part rest"), ("a", "next")]
    assert _read("whole\n\n|M|\nnext\n", headers=False) == [("a", "whole"), ("a", "next")]


def test_a_line_settled_is_given_at_once_and_what_never_ended_is_given_at_the_end() -> None:
    seen: list[tuple[str, str]] = []
    text = TailText("a", True, lambda path, line: seen.append((path, line)))
    text.line("==> a <==")
    text.line("first")
    assert text.holding and seen == []
    text.settle()
    assert seen == [("a", "first")] and not text.holding
    text.line("cut")
    text.line("==> b <==")
    text.end("unended")
    assert seen == [("a", "first"), ("a", "cut"), ("b", "unended")]


def test_one_file_has_no_names_a_line_like_one_is_its_own() -> None:
    assert _read("==> b <==\nx\n", headers=False) == [("a", "==> b <=="), ("a", "x")]
