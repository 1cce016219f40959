"""The README's configuration reference is exactly the binaries' ``--help`` (it cannot drift).

Binaries: ``$ASTRO_AGENT_BIN`` / ``$ASTRO_SENTINEL_BIN`` (tests/run.sh sets both), else
``${CARGO_TARGET_DIR:-target}/release/``. Fix a failure with ``python3 demo/gen_config_reference.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GEN = REPO / "demo" / "gen_config_reference.py"


def check(readme: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GEN), "--check", "--readme", str(readme)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)


def test_readme_reference_matches_help():
    result = check(REPO / "README.md")
    assert result.returncode == 0, result.stdout


def test_a_drifted_reference_is_caught(tmp_path):
    readme = (REPO / "README.md").read_text()
    assert "--sync-slots <N>" in readme
    drifted = tmp_path / "README.md"
    drifted.write_text(readme.replace("--sync-slots <N>", "--sync-slots <SLOTS>", 1))
    result = check(drifted)
    assert result.returncode == 1
    assert "+      --sync-slots <N>" in result.stdout, result.stdout
