"""datasets/SHA256SUMS lists every bundled data file with its true checksum."""

from __future__ import annotations

import hashlib
from pathlib import Path

DATASETS = Path(__file__).resolve().parents[2] / "datasets"


def manifest() -> dict[str, str]:
    out = {}
    for line in (DATASETS / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        out[name.lstrip("*")] = digest
    return out


def test_every_listed_file_matches_its_checksum() -> None:
    for name, digest in manifest().items():
        actual = hashlib.sha256((DATASETS / name).read_bytes()).hexdigest()
        assert actual == digest, f"datasets/{name}: sha256 {actual}, manifest says {digest}"


def test_every_data_file_is_listed() -> None:
    data = {p.relative_to(DATASETS).as_posix() for p in DATASETS.rglob("*") if p.suffix in {".csv", ".jsonl"}}
    assert data and data == set(manifest())


def test_cards_keep_provenance() -> None:
    for folder in ("azure2023", "mooncake"):
        card = (DATASETS / folder / "PROVENANCE.md").read_text()
        assert "License" in card and "ite" in card  # licence and citation kept
        assert (DATASETS / folder / "CARD.md").is_file()
