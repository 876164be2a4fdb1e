"""docs/FIDELITY.md and the `paper` presets cannot drift: every row that names a config key must
hold the preset's value (the preset validated with its defaults)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from orchestrator.config import load_config
from orchestrator.drivers.registry import METHODS, get_method

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "FIDELITY.md"


def sections() -> dict[str, list[tuple[str, str, str]]]:
    """preset file → [(setting, key, preset value)] for every row with a config key."""
    out: dict[str, list] = {}
    current = None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            m = re.search(r"`(configs/[^`]+\.yaml)`", line)
            current = m.group(1) if m else None
            if current:
                out[current] = []
        elif current and line.startswith("| ") and not line.startswith(("| setting", "|---")):
            cells = [c.strip() for c in line.strip("|").split("|")]
            key = cells[2].strip("`")
            if key != "—":
                out[current].append((cells[0], key, cells[3].strip("`")))
    return out


BUCKET_ROOT = "s3://acme-sieve"  # the paper presets read ${SIEVE_STORAGE}; the table names it the same way


@pytest.fixture(autouse=True)
def storage_root(monkeypatch):
    monkeypatch.setenv("SIEVE_STORAGE", BUCKET_ROOT)


def table_value(value: str):
    return yaml.safe_load(value.replace("${SIEVE_STORAGE}", BUCKET_ROOT))


def load_preset(path: str) -> dict:
    method = yaml.safe_load((ROOT / path).read_text())["method"]
    return load_config(get_method(method).config_cls, ROOT / path).model_dump(mode="json")


def at(data: dict, key: str):
    for part in key.split("."):
        data = data[part]
    return data


def test_every_method_has_a_section():
    assert set(sections()) == {recipe.paper_preset() for recipe in METHODS.values()}


def drifts(preset: dict, rows: list[tuple[str, str, str]]) -> list[str]:
    """Every row whose value is not the preset's."""
    return [
        f"{setting} ({key}): table says {value!r}, preset has {at(preset, key)!r}"
        for setting, key, value in rows
        if table_value(value) != at(preset, key)
    ]


@pytest.mark.parametrize("path", sorted(sections()))
def test_the_table_matches_the_paper_preset(path):
    rows = sections()[path]
    assert len(rows) >= 5
    assert drifts(load_preset(path), rows) == []


def test_the_checker_catches_a_drift():
    """The checker the table test uses reports a preset value different from the table's (the check can fail),
    and only that one."""
    preset = load_preset("configs/parabart/paper.yaml")
    rows = sections()["configs/parabart/paper.yaml"]
    assert drifts(preset, rows) == []
    preset["lr_syntax_decoder"] = 5e-4
    [drift] = drifts(preset, rows)
    assert "(lr_syntax_decoder): table says '0.0001', preset has 0.0005" in drift
