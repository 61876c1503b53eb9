"""The committed results and their documentation agree: README's results table is ``metrics/sweep.md``'s
headline table, every file under ``metrics/`` is named in docs/results.md with its command, and every
archived folder says what produced it. Reads files only (no compute)."""

import re

REPO_README, RESULTS, METRICS = "README.md", "docs/results.md", "metrics"
MARK = ("<!-- sweep-headline -->", "<!-- /sweep-headline -->")


def table_rows(text: str) -> list[list[str]]:
    """The first markdown table in ``text``: its rows (header first, the ``|---|`` line left out) as stripped cells."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                rows.append(cells)
        elif rows:
            break
    return rows


def readme_headline(repo) -> list[list[str]]:
    text = (repo / REPO_README).read_text()
    assert MARK[0] in text and MARK[1] in text, f"{REPO_README}: the results table must sit between {MARK[0]} and {MARK[1]}"
    return table_rows(text.split(MARK[0], 1)[1].split(MARK[1], 1)[0])


def sweep_headline(repo) -> list[list[str]]:
    text = (repo / METRICS / "sweep.md").read_text()
    assert "## Headline" in text, "metrics/sweep.md has no '## Headline' section: regenerate it with `lopd sweep --profile demo --seeds 0,1,2,3,4`"
    return table_rows(text.split("## Headline", 1)[1])


def test_readme_results_table_is_the_sweeps_headline_table(repo):
    readme, sweep = readme_headline(repo), sweep_headline(repo)
    assert sweep, "metrics/sweep.md's headline table is empty"
    assert readme == sweep, (
        f"README.md's results table (between {MARK[0]} and {MARK[1]}) differs from the headline table of metrics/sweep.md: "
        "copy the table from metrics/sweep.md into README.md, unchanged (rows and cells)\n"
        + "\n".join(f"  README row {i}: {r}\n  sweep  row {i}: {s}" for i, (r, s) in enumerate(zip(readme, sweep)) if r != s)
        + (f"\n  README has {len(readme)} rows, sweep.md {len(sweep)}" if len(readme) != len(sweep) else ""))


def files_table(repo) -> list[list[str]]:
    text = (repo / RESULTS).read_text()
    section = text.split("## Files under `metrics/`", 1)[1]
    return table_rows(section)[1:]


def test_every_file_under_metrics_is_named_with_its_command(repo):
    rows = files_table(repo)
    named = {name for row in rows for name in re.findall(r"`([^`]+)`", row[0])}
    assert all(row[1].strip() for row in rows), f"{RESULTS}: a row of the metrics files table has no command"
    present = [p.name for p in (repo / METRICS).iterdir() if p.is_file()]
    present += [f"plots/{p.name}" for p in (repo / METRICS / "plots").iterdir() if p.is_file()]
    missing = sorted(f for f in present if f not in named)
    assert not missing, (f"{RESULTS}, 'Files under `metrics/`': {missing} are not named; add each with the command that writes it "
                         "at this commit, or, if no command does, `git mv` it to metrics/archive/<what>/ with a README.md line")
    archived = sorted(p.name for p in (repo / METRICS / "archive").iterdir() if p.is_dir())
    unnamed = [d for d in archived if f"archive/{d}/" not in named]
    assert not unnamed, f"{RESULTS}, 'Files under `metrics/`': the archive folders {unnamed} are not named"


def test_every_archive_folder_says_what_produced_it(repo):
    folders = [p for p in (repo / METRICS / "archive").iterdir() if p.is_dir()]
    assert folders
    for d in folders:
        readme = d / "README.md"
        assert readme.exists(), f"{d.relative_to(repo)}: add a README.md line saying which command and commit wrote it, on which world"
        lines = [line for line in readme.read_text().splitlines() if line.strip()]
        assert len(lines) == 1, f"{readme.relative_to(repo)}: one line (command, commit, world), got {len(lines)}"
        command = re.search(r"`(lopd |make |benchmarks/|\.venv/bin/)[^`]*`", lines[0])  # the command, quoted as code
        assert command and "commit" in lines[0] and "world seed" in lines[0], f"{readme.relative_to(repo)}: {lines[0]}"
        assert [p for p in d.iterdir() if p.name != "README.md"], f"{d.relative_to(repo)}: an empty archive folder"
