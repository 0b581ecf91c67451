"""benchmarks/ stays findable: every `benchmarks/...` path the Markdown names exists, benchmarks/README.md
indexes every script and results folder, links to RESULTS.md and the history pages resolve, raw data
live only in benchmarks/results/<date>-<topic>/, and RESULTS.md is the standing numbers plus an index of
the per-topic history pages (benchmarks/results/<topic>.md, beside the raw data), each standing row dated
with its commit and linked to a history section that holds the command which made it (issue 41).
Plain file reads, no santa import."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import REPO

BENCH = REPO / "benchmarks"
RESULTS_DIR = BENCH / "results"
HISTORY_PAGES = sorted(path.relative_to(REPO).as_posix() for path in RESULTS_DIR.glob("*.md"))
MARKDOWN = ["README.md", "benchmarks/README.md", "benchmarks/RESULTS.md", "benchmarks/KERNEL_NOTES.md",
            "benchmarks/PROTOCOL.md", *HISTORY_PAGES]
# a `benchmarks/...` path: not part of a longer path or of `<commit>:benchmarks/...` (git show)
PATH_IN_TEXT = re.compile(r"(?<![\w:/.\-])benchmarks/(?:[\w.\-/*]|\{[^{}\s`]*\})*")
RAW_DATA_SUFFIXES = {".json", ".jsonl", ".gz", ".png", ".log", ".txt", ".csv", ".pt"}
SCRIPT_SUFFIXES = {".py", ".sh"}
RESULTS_FOLDER_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}-[a-z0-9]+(?:-[a-z0-9]+)*$")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")
# a command in a code span: optional VAR=value prefixes, then a program users run
COMMAND = re.compile(r"`(?:[A-Z_]+=\S* )*(?:python3?|santa|bash|ncu|vllm|pytest|\.venv/bin/\w+)\b[^`]*`")


def brace_expansions(pattern: str) -> list[str]:
    """`a{b,c}d{e,f}` → the four spellings, as the shell expands them."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end():]
    return [spelling for choice in match.group(1).split(",") for spelling in brace_expansions(head + choice + tail)]


def paths_named(text: str) -> set[str]:
    """The `benchmarks/...` paths a text names, braces expanded (a trailing '.' or ',' ends a sentence)."""
    return {spelling for match in PATH_IN_TEXT.finditer(text) for spelling in brace_expansions(match.group(0).rstrip(".,"))}


def exists(spelling: str) -> bool:
    """Whether a repository path exists; with a `*`, whether it matches at least one path."""
    if "*" in spelling:
        return any(REPO.glob(spelling.rstrip("/")))
    return (REPO / spelling).exists()


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(markdown: Path) -> set[str]:
    """Every heading anchor of a Markdown file (a repeated heading gets -1, -2, … as on GitHub)."""
    seen: dict[str, int] = {}
    found = set()
    for line in markdown.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            anchor = github_anchor(line.lstrip("#"))
            found.add(anchor if anchor not in seen else f"{anchor}-{seen[anchor]}")
            seen[anchor] = seen.get(anchor, 0) + 1
    return found


def heading_section(markdown: Path, anchor: str) -> str | None:
    """The text under the heading with this anchor, up to the next heading of its level or above."""
    lines = markdown.read_text(encoding="utf-8").splitlines()
    seen: dict[str, int] = {}
    for i, line in enumerate(lines):
        if not line.startswith("#"):
            continue
        level = len(line) - len(line.lstrip("#"))
        plain = github_anchor(line.lstrip("#"))
        found = plain if plain not in seen else f"{plain}-{seen[plain]}"
        seen[plain] = seen.get(plain, 0) + 1
        if found == anchor:
            end = next((j for j in range(i + 1, len(lines))
                        if lines[j].startswith("#") and len(lines[j]) - len(lines[j].lstrip("#")) <= level), len(lines))
            return "\n".join(lines[i:end])
    return None


def links(markdown: Path) -> list[str]:
    """Link targets of a Markdown file: inline `[text](target)` and reference definitions `[name]: target`."""
    text = markdown.read_text(encoding="utf-8")
    inline = re.findall(r"\]\(([^)\s]+)\)", text)
    defined = re.findall(r"^\[[^\]]+\]:\s*(\S+)", text, flags=re.MULTILINE)
    return [target for target in inline + defined if not re.match(r"[a-z]+://", target)]


def section(markdown_text: str, heading: str) -> str:
    """The text of the `## heading` section, up to the next `## ` heading."""
    start = markdown_text.index(f"\n## {heading}\n")
    end = markdown_text.find("\n## ", start + 1)
    return markdown_text[start: end if end != -1 else None]


def table_body_rows(text: str) -> list[str]:
    """The body rows of every Markdown table in a text (the header and separator lines left out)."""
    rows, block = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            block.append(line)
        else:
            rows.extend(block[2:])
            block = []
    return rows


def files_under(folder: Path, suffixes: set[str], *, skip: tuple[Path, ...] = ()) -> list[Path]:
    """Files below a folder with one of the suffixes (caches and the folders in `skip` left out)."""
    return sorted(path for path in folder.rglob("*")
                  if path.is_file() and path.suffix in suffixes and "__pycache__" not in path.parts
                  and not any(path.is_relative_to(other) for other in skip))


@pytest.mark.parametrize("markdown", MARKDOWN)
def test_every_benchmarks_path_the_markdown_names_exists(markdown):
    missing = sorted(spelling for spelling in paths_named((REPO / markdown).read_text(encoding="utf-8"))
                     if not exists(spelling))
    assert missing == [], f"{markdown} names paths that do not exist: {missing}"


@pytest.mark.parametrize(("text", "expected"), [
    ("raw: `benchmarks/results/2026-12-01-kernels-pass5/`.", {"benchmarks/results/2026-12-01-kernels-pass5/"}),
    ("plots `benchmarks/x/{a,b}_c.{json,png}`", {"benchmarks/x/a_c.json", "benchmarks/x/a_c.png",
                                                  "benchmarks/x/b_c.json", "benchmarks/x/b_c.png"}),
    ("see benchmarks/RESULTS.md.", {"benchmarks/RESULTS.md"}),
    ("`git show 4d51ca1:benchmarks/kernels/gone.py` and src/benchmarks/y", set()),
    ("`benchmarks/results/<date>-<topic>/`", {"benchmarks/results/"}),
])
def test_paths_named_reads_paths_as_the_markdown_writes_them(text, expected):
    assert paths_named(text) == expected


def test_a_path_that_does_not_exist_is_reported():
    assert not exists("benchmarks/results/1999-01-01-nothing/")
    assert not exists("benchmarks/results/*/no_such_file_*.json")
    assert exists("benchmarks/results/*/")


@pytest.mark.parametrize("markdown", ["benchmarks/README.md", "benchmarks/RESULTS.md", *HISTORY_PAGES])
def test_every_relative_link_resolves(markdown):
    source = REPO / markdown
    broken = []
    for target in links(source):
        path_part, _, anchor = target.partition("#")
        linked = (source.parent / path_part) if path_part else source
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(target)
    assert broken == [], f"{markdown} links to what does not exist: {broken}"


@pytest.mark.parametrize(("heading", "anchor"), [
    ("## Main job: `santa generate` (issue 2)", "main-job-santa-generate-issue-2"),
    ("## Decode kernels after the plan/run rewrite (issues 11 and 14), 2026-12-01",
     "decode-kernels-after-the-planrun-rewrite-issues-11-and-14-2026-12-01"),
    ("### CPU runs (first session; 4–46 prompts per cell)", "cpu-runs-first-session-446-prompts-per-cell"),
])
def test_github_anchor_matches_githubs_rule(heading, anchor):
    assert github_anchor(heading.lstrip("#")) == anchor


def test_every_results_folder_is_dated_and_indexed():
    readme = (BENCH / "README.md").read_text(encoding="utf-8")
    folders = sorted(path.name for path in RESULTS_DIR.iterdir() if path.is_dir())
    assert folders, "benchmarks/results/ holds no folder"
    badly_named = [name for name in folders if not RESULTS_FOLDER_NAME.match(name)]
    assert badly_named == [], f"results folders not named <YYYY-MM-DD>-<topic>: {badly_named}"
    unindexed = [name for name in folders if f"results/{name}/" not in readme]
    assert unindexed == [], f"benchmarks/README.md does not index these results folders: {unindexed}"
    results_page = (BENCH / "RESULTS.md").read_text(encoding="utf-8")
    loose = [path.name for path in RESULTS_DIR.iterdir()
             if path.is_file() and not (path.suffix == ".md" and f"](results/{path.name})" in results_page)]
    assert loose == [], (f"files directly in benchmarks/results/ (raw data go in a dated folder; a history page "
                         f"is a .md that RESULTS.md lists): {loose}")


def test_every_script_is_indexed():
    readme = (BENCH / "README.md").read_text(encoding="utf-8")
    scripts = [path.relative_to(BENCH).as_posix()
               for path in files_under(BENCH, SCRIPT_SUFFIXES, skip=(RESULTS_DIR,)) if path.name != "__init__.py"]
    assert scripts, "benchmarks/ holds no script"
    unindexed = [script for script in scripts if f"`{script}`" not in readme]
    assert unindexed == [], f"benchmarks/README.md does not describe these scripts: {unindexed}"


def test_raw_data_live_only_in_results():
    stray = [path.relative_to(REPO).as_posix() for path in files_under(BENCH, RAW_DATA_SUFFIXES, skip=(RESULTS_DIR,))]
    assert stray == [], f"raw data outside benchmarks/results/<date>-<topic>/: {stray}"


def test_results_opens_with_standing_numbers_each_row_dated_with_its_commit():
    text = (BENCH / "RESULTS.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    assert headings[:2] == ["Standing numbers", "History"], f"RESULTS.md's first sections: {headings[:2]}"
    rows = table_body_rows(section(text, "Standing numbers"))
    assert len(rows) >= 6, "the standing numbers hold fewer rows than areas"
    undated = [row[:80] for row in rows if not (DATE.search(row) and COMMIT.search(row))]
    assert undated == [], f"standing rows without a date and a commit: {undated}"


@pytest.mark.parametrize(("row", "dated"), [
    ("| Llama 8k | 19.0 | 17.8 | 2026-12-01 | 087b01b | [fifth pass][k5] |", True),
    ("| Llama 8k | 19.0 | 17.8 | 2026-12-01 | | |", False),
    ("| Llama 8k | 19.0 | 17.8 | | 087b01b | |", False),
])
def test_a_standing_row_needs_a_date_and_a_commit(row, dated):
    assert table_body_rows(f"| a |\n|---|\n{row}\n") == [row]
    assert bool(DATE.search(row) and COMMIT.search(row)) is dated


def test_the_history_index_lists_every_history_section():
    index = section((BENCH / "RESULTS.md").read_text(encoding="utf-8"), "History")
    assert HISTORY_PAGES, "no history page in benchmarks/results/"
    unlisted = []
    for page in HISTORY_PAGES:
        text = (REPO / page).read_text(encoding="utf-8")
        history = [github_anchor(heading) for heading in re.findall(r"^## (.+)$", text, flags=re.MULTILINE)]
        assert history, f"{page} holds no section"
        unlisted += [f"{page}#{anchor}" for anchor in history if f"(results/{Path(page).name}#{anchor})" not in index]
    assert unlisted == [], f"history sections missing from RESULTS.md's index: {unlisted}"


def standing_row_sources(results: Path) -> dict[str, list[str]]:
    """Each standing row → the link targets it names (inline or by reference)."""
    text = results.read_text(encoding="utf-8")
    defined = dict(re.findall(r"^\[([^\]]+)\]:\s*(\S+)", text, flags=re.MULTILINE))
    rows = table_body_rows(section(text, "Standing numbers"))
    return {row: [defined.get(name, "") for name in re.findall(r"\]\[([^\]]+)\]", row)]
            + re.findall(r"\]\(([^)\s]+)\)", row) for row in rows}


def test_every_standing_row_links_the_command_that_made_it():
    results = BENCH / "RESULTS.md"
    missing = []
    for row, targets in standing_row_sources(results).items():
        sections = []
        for target in targets:
            path_part, _, anchor = target.partition("#")
            page = (results.parent / path_part) if path_part else results
            if anchor and page.exists():
                sections.append(heading_section(page, anchor))
        if not any(text and COMMAND.search(text) for text in sections):
            missing.append(row[:80])
    assert missing == [], f"standing rows whose source section names no command: {missing}"


@pytest.mark.parametrize(("text", "command"), [
    ("ran `python benchmarks/kernels/paged_ab.py OUT.jsonl --fp8` on the H200", True),
    ("`SANTA_COMMIT=abc PAGED_ARGS=--quick bash benchmarks/kernels/gpu_run.sh paged`", True),
    ("`santa bench e2e --backends cudnn,santa-prop`", True),
    ("the kernel `prop1_d128_g4` and `benchmarks/results/x.json`", False),
])
def test_a_command_is_a_code_span_that_runs_a_program(text, command):
    assert bool(COMMAND.search(text)) is command


def test_heading_section_stops_at_the_next_heading_of_its_level():
    page = RESULTS_DIR / HISTORY_PAGES[0].rsplit("/", 1)[-1]
    first = re.search(r"^## (.+)$", page.read_text(encoding="utf-8"), flags=re.MULTILINE).group(1)
    text = heading_section(page, github_anchor(first))
    assert text.startswith(f"## {first}") and "\n## " not in text
    assert heading_section(page, "no-such-heading") is None


RAW_LIMIT = 256 * 1024  # ~200 kB: a larger raw file is summarised or compressed (issue 41)
GZIP_MAGIC = b"\x1f\x8b"


def test_large_raw_files_are_compressed():
    """Raw files above the limit are gzip data (kept because a standing row or a report reads them);
    anything else that large is summarised and dropped from git."""
    plain = [path.relative_to(REPO).as_posix() for path in files_under(RESULTS_DIR, RAW_DATA_SUFFIXES | {".md", ".tar"})
             if path.stat().st_size > RAW_LIMIT and path.read_bytes()[:2] != GZIP_MAGIC]
    assert plain == [], f"uncompressed raw files above {RAW_LIMIT // 1024} kB (gzip them or keep a summary): {plain}"


WRITES_RESULTS = re.compile(r"json\.dumps?\(|write_json_atomic\(|append_record\(")


def test_every_script_that_writes_results_records_its_command_and_environment():
    """Beside its data, a benchmark writes santa.provenance.run_record() (command line, environment,
    commit, date, versions, device): bench.kernels.environment() returns it too, and an A/B script that may time an
    old santa tree takes this checkout's (bench.timing.run_record_of_this_checkout())."""
    silent = []
    recorders = ("run_record(", "environment()", "run_record_of_this_checkout()")
    for path in files_under(BENCH, {".py"}, skip=(RESULTS_DIR,)):
        text = path.read_text(encoding="utf-8")
        if WRITES_RESULTS.search(text) and not any(recorder in text for recorder in recorders):
            silent.append(path.relative_to(REPO).as_posix())
    assert silent == [], f"scripts that write results without santa.provenance.run_record(): {silent}"
