"""The README's table names every vector file, and every vector file it names exists."""

import re

from .vectors import HERE, VECTOR_DIR, load_all


def test_readme_table_and_vector_files_agree():
    named = set(re.findall(r"\(vectors/([^)]+)\.json\)", (HERE / "README.md").read_text()))
    files = {v.id for v in load_all()}
    assert files - named == set(), "vectors missing from README.md"
    assert named - files == set(), f"README.md names files not in {VECTOR_DIR}"
