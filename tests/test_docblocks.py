"""The doc-block extractor of tests/test_docs.py (tests/docblocks.py): markers, console blocks, output."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from docblocks import DirectiveError, console_steps, output_mismatch, page_blocks, parse_directive


def _page(tmp_path: Path, text: str) -> list:  # type: ignore[type-arg]
    (tmp_path / "docs").mkdir(exist_ok=True)
    page = tmp_path / "docs" / "p.md"
    page.write_text(text)
    return page_blocks(tmp_path, page)


def test_a_marker_applies_to_the_block_right_after_it(tmp_path: Path) -> None:
    blocks = _page(
        tmp_path,
        '# t\n\n<!-- docs-test: skip "no GPU here" -->\n```sh\nnvidia-smi\n```\n\n```python\nprint(1)\n```\n'
        "\n<!-- docs-test: output -->\n```text\n1\n```\n",
    )
    assert [(b.lang, b.skip) for b in blocks] == [("sh", "no GPU here"), ("python", None)]
    assert blocks[0].id == "docs/p.md:4"
    assert blocks[1].expected() == "1\n"


def test_options_and_files(tmp_path: Path) -> None:
    blocks = _page(
        tmp_path,
        "<!-- docs-test: file=train.py -->\n```python\nx = 1\n```\n\n"
        "<!-- docs-test: needs=hosts,server timeout=30 exit=1 cwd=examples -->\n"
        "```bash\npython train.py\n```\n",
    )
    assert not blocks[0].runnable and blocks[0].options == {"file": "train.py"}
    assert blocks[1].runnable and blocks[1].needs == ["hosts", "server"]
    assert (blocks[1].timeout, blocks[1].exit, blocks[1].options["cwd"]) == (30.0, 1, "examples")


@pytest.mark.parametrize(
    ("comment", "says"),
    [
        ("skip", "needs a reason"),
        ("skip-page", "needs a reason"),
        ("needs=gpu", "'gpu'"),
        ("wait=3", "'wait=3' is not one of"),
        ("venv=old", "the only value is venv=fresh"),
        ("lines=1", 'rest="why'),
        ('skip "unclosed', "No closing quotation"),
    ],
)
def test_a_bad_marker_is_an_error_naming_it(comment: str, says: str) -> None:
    with pytest.raises(DirectiveError, match=r"README\.md:3") as caught:
        parse_directive(comment, "README.md:3")
    assert says in str(caught.value)


def test_a_marker_away_from_its_block_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DirectiveError, match="right before its block"):
        _page(tmp_path, '<!-- docs-test: skip "x" -->\n\nsome prose\n\n```sh\ntrue\n```\n')


def test_an_output_block_needs_a_block_that_runs_before_it(tmp_path: Path) -> None:
    with pytest.raises(DirectiveError, match="must follow a runnable block"):
        _page(tmp_path, "<!-- docs-test: output -->\n```text\nx\n```\n")


def test_a_skipped_page_skips_every_block(tmp_path: Path) -> None:
    blocks = _page(tmp_path, '<!-- docs-test: skip-page "an archive" -->\n```sh\ntrue\n```\n')
    assert blocks[0].skip == "an archive"


def test_console_blocks_split_commands_from_their_output() -> None:
    steps = console_steps("$ python run.py \\\n    --x 1\n[consumer/0] [0, 1]\n$ echo hi\nhi\n")
    assert steps == [("python run.py \\\n    --x 1", "[consumer/0] [0, 1]"), ("echo hi", "hi")]
    assert console_steps("tlaunch ps\n") == [("tlaunch ps", "")]


def test_output_lines_match_in_order_with_ellipses() -> None:
    printed = "tlaunch: starting\n[th1 w/0] worker 0 on th1\nnoise\nprogram ran in 1.18 s on 3 hosts\n"
    assert (
        output_mismatch("[th1 w/0] worker 0 on th1\n...\nprogram ran in ... s on 3 hosts\n", printed) is None
    )
    assert output_mismatch("program ran in ... s on 3 hosts\n[th1 w/0] worker 0 on th1\n", printed) == (
        "[th1 w/0] worker 0 on th1"
    )
    assert output_mismatch("worker 0 on th1\n", printed) == "worker 0 on th1"  # whole lines only


def test_unordered_output_matches_each_line_once_in_any_order(tmp_path: Path) -> None:
    blocks = _page(tmp_path, "```python\nx\n```\n<!-- docs-test: output unordered -->\n```text\na\nb\n```\n")
    assert "unordered" in blocks[0].options
    assert output_mismatch("[th1 w/0] a\n[th2 w/1] b\n", "[th2 w/1] b\n[th1 w/0] a\n", ordered=False) is None
    assert output_mismatch("x ...\nx ...\n", "x 1\n", ordered=False) == "x ..."
