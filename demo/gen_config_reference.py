"""Writes (or checks) the README's configuration reference from the binaries' ``--help``.

    python3 demo/gen_config_reference.py            # rewrite the blocks in README.md
    python3 demo/gen_config_reference.py --check    # exit 1 with a diff when README.md differs

The blocks sit between ``<!-- BEGIN GENERATED: <binary> --help -->`` and
``<!-- END GENERATED: <binary> --help -->``. Binaries: ``$ASTRO_AGENT_BIN`` /
``$ASTRO_SENTINEL_BIN``, else ``${CARGO_TARGET_DIR:-target}/release/<name>`` (build them first).
``--help`` runs without any ``ASTRO_*`` variable (clap prints set values) and with its output
piped (no terminal width); trailing spaces are dropped.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BINARIES = ("astro-agent", "astro-sentinel")


def binary(name: str) -> Path:
    override = os.environ.get(f"{name.upper().replace('-', '_')}_BIN")
    if override:
        return Path(override)
    release = os.environ.get("ASTRO_RELEASE_DIR")  # tests/lib/cargo-target.sh's build
    if release:
        return Path(release) / name
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    if not target.is_absolute():
        target = REPO / target
    return target / "release" / name


def help_text(path: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASTRO_") and k not in ("COLUMNS", "LINES")}
    out = subprocess.run([str(path), "--help"], env=env, check=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, timeout=60).stdout
    return "\n".join(line.rstrip() for line in out.rstrip().splitlines())


def block(name: str, text: str) -> str:
    return (f"<!-- BEGIN GENERATED: {name} --help -->\n"
            f"```text\n$ {name} --help\n{text}\n```\n"
            f"<!-- END GENERATED: {name} --help -->")


def render(readme: str, helps: dict[str, str]) -> str:
    for name, text in helps.items():
        pattern = re.compile(
            rf"<!-- BEGIN GENERATED: {re.escape(name)} --help -->.*?<!-- END GENERATED: {re.escape(name)} --help -->",
            re.S,
        )
        if not pattern.search(readme):
            raise SystemExit(f"no generated block for {name} in the README")
        readme = pattern.sub(lambda _: block(name, text), readme)
    return readme


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="README configuration reference from --help")
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 when the README differs")
    ap.add_argument("--readme", default=str(REPO / "README.md"))
    args = ap.parse_args(argv)
    readme_path = Path(args.readme)
    helps = {}
    for name in BINARIES:
        path = binary(name)
        if not path.exists():
            raise SystemExit(f"{path} missing: cargo build --workspace --release")
        helps[name] = help_text(path)
    old = readme_path.read_text()
    new = render(old, helps)
    if args.check:
        if old != new:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                       f"{readme_path} (as committed)", "from --help"))
            print(f"\n{readme_path}: the configuration reference differs from --help; "
                  "run python3 demo/gen_config_reference.py", file=sys.stderr)
            return 1
        print(f"{readme_path}: the configuration reference matches --help of {', '.join(BINARIES)}")
        return 0
    if old != new:
        readme_path.write_text(new)
        print(f"updated {readme_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
