"""The distribution name: `santa` on the package index is another project, so every install hint
names ours (issue 22)."""

import re
import tomllib

import santa
from helpers import REPO


def test_distribution_name_is_ours_and_pyproject_agrees():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == santa.DISTRIBUTION
    assert santa.DISTRIBUTION != "santa"  # "Assign a secret santa over email" on PyPI
    assert santa.install_hint("tune") == "pip install 'santa-attention[tune]'"


def test_no_install_hint_names_the_other_project():
    """`pip install santa…` with an extra or a version pin would install the secret-santa mailer."""
    wrong = re.compile(r"pip install[^\n`]*?['\"\s]santa(\[|==|>=|['\"\s]|$)")
    files = [REPO / "README.md", *(REPO / "src").rglob("*.py"), *(REPO / "benchmarks").rglob("*.md")]
    offenders = [f"{f.relative_to(REPO)}:{i}" for f in files for i, line in enumerate(f.read_text().splitlines(), 1) if wrong.search(line)]
    assert offenders == []
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("tune", "plot"):
        assert extra in extras
