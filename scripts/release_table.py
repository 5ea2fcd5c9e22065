"""docs/releases.md, the table scripts/check_releases.sh writes: one row per (torch release, architecture,
check) that CI does not run, with its counts and the commit it ran on.

    release_table.py pending                  the releases whose CPU suite or NPU checks CI does not run
    release_table.py needs-npu RELEASE        exit 0 when CI does not check that release's NPU part
    release_table.py record TABLE COMMIT TORCH ARCH CHECK LOG STATUS SECONDS
                                              writes (or replaces) that row, its counts read from LOG
    release_table.py verify TABLE             CI's check: every row passed, on a commit whose csrc/compat
                                              and table of releases (build_config.py's DEFAULT_TORCH and
                                              TESTED_RELEASES) are today's; it lists (without failing) the
                                              rows due (DUE_AFTER) and the checks of a release that neither
                                              CI nor a row has run yet

CI runs the default release (build_config.ROLES["default"]) on x86-64, in full but for the checks in rotation
below. So every other release's CPU suite and NPU checks are rows here, and so are the default release's
checks CI runs in part or not at all: the rebuild check to the newest torch, the sanitizers at every
instruction set (CI: one, in rotation), the emulated suite on every chip family (CI: 910B and one other, in
rotation), and on aarch64 the whole suite under qemu and the NPU build check.

A row fails verify when it did not pass or when csrc/compat or the table of releases changed since its commit.
A row that alone runs some code is also listed as due, without failing, when that code changed since (DUE_AFTER:
the aarch64 suite runs the CPU kernels built for NEON, which CI builds only for x86-64; the rebuild check runs
setup.py's build keys over another torch's build). The aarch64 suite takes hours under qemu; a hard gate on every
change to csrc/cpu would make each such change wait for it.
"""
import datetime
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import build_config  # noqa: E402

HEADER = "| torch | torch_npu | arch | check | result | time | commit | date |"
# What a change to must re-run every row: the compatibility code and the table of releases (the values of
# these names in build_config.py; its other lines, the CI roles and the comments, do not change what a row ran).
RELEASE_TABLE_NAMES = ("DEFAULT_TORCH", "TESTED_RELEASES")

CPU_SUITE, NPU_BUILD = "CPU suite", "NPU build check"


def ci_checks(release):
    """The checks .ci/run makes at a release (x86-64): the default release's CPU suite and NPU build check."""
    return {CPU_SUITE, NPU_BUILD} if release == build_config.ROLES["default"] else set()


def required_checks(release):
    return {CPU_SUITE} | ({NPU_BUILD} if build_config.TESTED_RELEASES[release] else set())


def pending():
    ordered = sorted(build_config.TESTED_RELEASES, key=build_config._key)
    return [r for r in ordered if required_checks(r) - ci_checks(r)]


def read_rows(table):
    rows = []
    if not os.path.exists(table):
        return rows
    with open(table) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("|") and len(cells) == 8 and cells[0] not in ("torch", "---"):
                rows.append(cells)
    return rows


def counts(log):
    """The tests a log's pytest runs report: one run's summary ('14,210 passed, 31 skipped'), or, for several
    (the emulated suite's families, the sanitizers' instruction sets), their passed, failed, skipped and error
    counts summed, with the number of runs; None when the log has no summary."""
    with open(log, errors="replace") as f:
        text = f.read()
    summary = r"(\d+ (?:passed|failed)(?:, \d+ \w+)*)"
    # A run's closing line ends with its time; a script's table may repeat it, which is the same run.
    runs = list({m.group(0): m.group(1) for m in re.finditer(summary + r" in [\d.]+s", text)}.values())
    if len(runs) > 1:
        total = {}
        for run in runs:
            for number, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", run):
                kind = "errors" if kind.startswith("error") else kind
                total[kind] = total.get(kind, 0) + int(number)
        parts = [f"{total[kind]} {kind}" for kind in ("passed", "failed", "skipped", "errors") if kind in total]
        return f"{', '.join(parts)} in {len(runs)} pytest runs"
    found = runs or re.findall(summary, text)
    return found[-1] if found else None


def record(table, commit, torch, arch, check, log, status, seconds):
    summary = counts(log)
    result = ("passed" if status == "0" else f"FAILED (exit {status})") + (f": {summary}" if summary else "")
    row = [torch, build_config.TESTED_RELEASES.get(torch) or "none", arch, check, result,
           f"{int(seconds) // 60} min", commit[:12], datetime.date.today().isoformat()]
    rows = [r for r in read_rows(table) if (r[0], r[2], r[3]) != (torch, arch, check)] + [row]
    rows.sort(key=lambda r: (build_config._key(r[0]), r[2], r[3]))
    write(table, rows)


def write(table, rows):
    with open(table) as f:
        text = f.read()
    head = text[: text.index(HEADER)]
    with open(table, "w") as f:
        f.write(head + HEADER + "\n|---|---|---|---|---|---|---|---|\n")
        for row in rows:
            f.write("| " + " | ".join(row) + " |\n")


def verify(table):
    problems, due = [], []
    rows = read_rows(table)
    for torch, _, arch, check, result, _, commit, _ in rows:
        where = f"{table}: torch {torch} {arch} {check} ({commit})"
        if not result.startswith("passed"):
            problems.append(f"{where}: {result}")
        if subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT,
                          capture_output=True).returncode != 0:
            problems.append(f"{where}: commit not in this repository")
        elif changed_since(commit, ("csrc/compat",)):
            problems.append(f"{where}: csrc/compat or the release table changed since; "
                            f"run bash scripts/check_releases.sh {rerun(torch, arch, check)}")
        elif due_after(check) and changed_since(commit, due_after(check)):
            due.append(f"{where}: {' or '.join(due_after(check))} changed since; "
                       f"run bash scripts/check_releases.sh {rerun(torch, arch, check)}")
    for problem in problems:
        print(f"release table: {problem}")
    for row in due:
        print(f"release table: due (not failing): {row}")
    unchecked = missing(rows)
    for release, arch, check in unchecked:
        print(f"release table: not checked yet: torch {release} {arch} '{check}' (bash scripts/check_releases.sh "
              f"{rerun(release, arch, check)})")
    if problems:
        sys.exit(1)
    print(f"release table: {len(rows)} rows, each passed on a commit with today's csrc/compat and release table; "
          f"{len(due)} due, {len(unchecked)} checks not run yet")


def _release_table(source):
    """build_config.py's release table (RELEASE_TABLE_NAMES' literal values) read from its source."""
    import ast

    values = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in RELEASE_TABLE_NAMES:
                values[node.targets[0].id] = ast.literal_eval(node.value)
    return values


def changed_since(commit, paths):
    """True when one of `paths` or the table of releases differs between `commit` and the work tree."""
    if subprocess.run(["git", "diff", "--quiet", commit, "--", *paths], cwd=ROOT).returncode != 0:
        return True
    then = subprocess.run(["git", "show", f"{commit}:build_config.py"], cwd=ROOT, capture_output=True, text=True)
    with open(os.path.join(ROOT, "build_config.py")) as f:
        now = f.read()
    return then.returncode != 0 or _release_table(then.stdout) != _release_table(now)


DEBUG_SUITE = "whole suite from a DEBUG=1 build (-O0)"
SANITIZERS = "sanitizers (ASan, UBSan), every instruction set"
AARCH64_NPU = "NPU build check (cross-built)"
EMULATED = "emulated NPU, every chip family"
EMULATED_910B = "emulated NPU 910B"


def rebuild_check():
    return f"rebuild over {build_config.DEFAULT_TORCH} (one venv), a slice of the suite"


# The code whose change makes a row due, by check_releases.sh's name of the check: what no other check runs
# (CI builds the CPU kernels only for x86-64, and builds over no other torch's build).
DUE_AFTER = {"aarch64": ("csrc/cpu",), "rebuild": ("setup.py",)}


def check_name(check):
    """check_releases.sh's name of a row's check (a rebuild row names the default release it built over)."""
    return CHECK_NAMES.get(check) or ("rebuild" if check.startswith("rebuild over ") else None)


def due_after(check):
    return DUE_AFTER.get(check_name(check), ())


def rerun(torch, arch, check):
    """check_releases.sh's argument that runs this row again."""
    if arch == "x86_64" and check == CPU_SUITE:
        return f"{torch}/cpu"
    if arch == "x86_64" and check in (NPU_BUILD, EMULATED_910B):
        return f"{torch}/npu"
    return check_name(check) or torch


CHECK_NAMES = {"whole suite (qemu)": "aarch64", "tests over 2**31 elements": "large", DEBUG_SUITE: "debug",
               SANITIZERS: "sanitizers", EMULATED: "emulated", rebuild_check(): "rebuild", AARCH64_NPU: "aarch64-npu"}


def missing(rows):
    """The checks neither CI nor a passing row covers: (release, arch, check)."""
    passed = {(r[0], r[2], r[3]) for r in rows if r[4].startswith("passed")}
    wanted = [(release, "x86_64", check) for release in build_config.TESTED_RELEASES
              for check in sorted(required_checks(release) - ci_checks(release))]
    default = build_config.DEFAULT_TORCH
    wanted += [(default, "aarch64", "whole suite (qemu)"), (default, "aarch64", AARCH64_NPU),
               (default, "x86_64", "tests over 2**31 elements"),
               (default, "x86_64", DEBUG_SUITE), (default, "x86_64", SANITIZERS), (default, "x86_64", EMULATED),
               (build_config.ROLES["newest"], "x86_64", rebuild_check())]
    return [w for w in wanted if w not in passed]


def main(argv):
    if argv == ["pending"]:
        print("\n".join(pending()))
    elif len(argv) == 2 and argv[0] == "needs-npu":
        release = argv[1]
        sys.exit(0 if NPU_BUILD in required_checks(release) - ci_checks(release) else 1)
    elif len(argv) == 9 and argv[0] == "record":
        record(*argv[1:])
    elif len(argv) == 2 and argv[0] == "verify":
        verify(argv[1])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
