"""The README against the facts it restates: its "Supported versions" table names exactly the releases of
build_config.py (the one table of releases), each with the torch_npu pin build_config.py pairs with it, and
marks the default; its layout names every file of csrc/; the README stays within 200 lines."""
import os

from helpers import REPO_ROOT, build_config

README = os.path.join(REPO_ROOT, "README.md")


def _supported_versions_rows() -> list[list[str]]:
    """The cells of the table under README's "## Supported versions", header and separator left out."""
    with open(README) as f:
        text = f.read()
    section = text.split("## Supported versions", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row] for row in rows[2:]]


def test_readme_release_table_is_build_configs():
    config = build_config()
    seen: dict[tuple[str, str], str] = {}
    defaults = []
    for torch_cell, npu_cell, arch_cell, *_ in _supported_versions_rows():
        if "(default)" in torch_cell:
            defaults.append((torch_cell, arch_cell))
        releases = [r.strip() for r in torch_cell.replace("(default)", "").split(",")]
        pins = [p.strip() for p in npu_cell.split(",")] if not npu_cell.startswith("none") else [None]
        assert len(pins) in (1, len(releases)), f"README row {torch_cell!r}: {len(pins)} torch_npu pins"
        for i, release in enumerate(releases):
            assert release in config.TESTED_RELEASES, f"README names torch {release}, build_config.py does not"
            pin = pins[i] if len(pins) == len(releases) else pins[0]
            assert pin == config.TESTED_RELEASES[release], (
                f"README pairs torch {release} with torch_npu {pin}; build_config.py with "
                f"{config.TESTED_RELEASES[release]}")
            arch = arch_cell.replace("-", "_")
            assert arch in config.ARCHITECTURES, arch_cell
            assert (release, arch) not in seen, f"torch {release} on {arch_cell} has two rows"
            seen[(release, arch)] = pin
    assert {r for r, arch in seen if arch == "x86_64"} == set(config.TESTED_RELEASES)
    assert defaults == [(f"{config.DEFAULT_TORCH} (default)", "x86-64")]


def test_readme_is_at_most_200_lines():
    with open(README) as f:
        assert len(f.read().splitlines()) <= 200


def _layout() -> str:
    with open(README) as f:
        return f.read().split("## Layout", 1)[1].split("```", 2)[1]


def test_readme_layout_names_every_file_of_csrc():
    """Each file under csrc/ is named on its directory's lines of the layout (a header and its .cpp may share
    one name, as `checks.h/.cpp`; the instruction sets' files as `isa_avx512/_avx2/_baseline.cpp`)."""
    layout = _layout()
    entries: dict[str, str] = {}
    current = ""
    for line in layout.strip("\n").splitlines():
        head = line[:22].strip()
        if head:
            current = head
        entries[current] = entries.get(current, "") + " " + line
    csrc = os.path.join(REPO_ROOT, "csrc")
    missing = []
    for folder, _, files in os.walk(csrc):
        rel = os.path.relpath(folder, csrc)
        top = rel.split(os.sep)[0]
        key = "csrc/losses.h" if rel == "." else next(
            (k for k in entries if f"csrc/{top}/" in k or (k.startswith("csrc/enable/") and top == "compat")), None)
        text = entries.get(key or "", "")
        for name in files:
            stem, ext = os.path.splitext(name)
            named = (name in text or f"{stem}.h/{ext}" in text or f"{stem}.h/.cpp" in text
                     or (stem.startswith("isa_") and f"_{stem[4:]}" in text)
                     or (rel != "." and f"{os.path.basename(rel)}/{name}" in text))
            if not named:
                missing.append(os.path.join("csrc", rel, name))
    assert not missing, f"README's layout does not name {missing}"
