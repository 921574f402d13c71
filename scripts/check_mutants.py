#!/usr/bin/env python3
"""Apply, one at a time, the seven plausible localizer/divergence bugs of issue 28 to the
working tree, run the tests of rlx-ir, rlx-runtime and rlx-cli, and report which tests fail
for each (every mutant must fail at least one). Each file is restored after its run, also on
error or Ctrl-C. Takes a few minutes (one incremental rebuild per mutant).

    RLX_REQUIRE_FIXTURES=1 RLX_REQUIRE_NUMPY=1 python3 scripts/check_mutants.py [m1 ...]

Exit status 1 when a mutant survives (no test fails) or does not apply.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NC = "crates/rlx-ir/src/numeric_check.rs"
DIAG = "crates/rlx-runtime/src/dist/diagnostics.rs"
MUTANTS = {
    # culprit/propagator count: the elementwise guard, the broadcast factor
    "m1": (NC, "if !elementwise || out.nan <= carried {", "if out.nan <= carried || true {"),
    "m2": (NC, "s.nan_count * (out.len / s.len).max(1)", "s.nan_count"),
    # an Inf that became NaN called "absorbed"
    "m3": (NC, "&& !self.inf_into_nan.contains(o)", ""),
    # the s.nan check of the absorbed-Inf summary
    "m4": (NC, "if s.nan || reported.contains(&origin) {", "if reported.contains(&origin) {"),
    # divergence: the round-off verdict inverted, no replay check, a tenfold output threshold
    "m5": (DIAG, 'if l.kind == "accumulated" && d.nonfinite.is_empty()', 'if l.kind != "accumulated" && d.nonfinite.is_empty()'),
    "m6": (DIAG, "k.rel > tol_rel || k.nonfinite.is_some()\n            } else {", "true\n            } else {"),
    "m7": (DIAG, "d.suspect = d.max_rel > tol_rel ||", "d.suspect = d.max_rel > 10.0 * tol_rel ||"),
}


def main():
    names = sys.argv[1:] or list(MUTANTS)
    bad = 0
    for m in names:
        rel, old, new = MUTANTS[m]
        path = os.path.join(ROOT, rel)
        src = open(path).read()
        if src.count(old) != 1:
            print(f"{m}: does not apply ({rel} holds the original {src.count(old)} times)")
            bad += 1
            continue
        open(path, "w").write(src.replace(old, new))
        try:
            r = subprocess.run(
                ["cargo", "test", "-p", "rlx-ir", "-p", "rlx-runtime", "-p", "rlx-cli", "--no-fail-fast"],
                cwd=ROOT, capture_output=True, text=True)
        finally:
            open(path, "w").write(src)
        out = r.stdout + r.stderr
        if "error[" in out:
            print(f"{m}: the mutant does not build\n{out[-2000:]}")
            bad += 1
            continue
        fails = sorted(set(re.findall(r"^test (\S+) \.\.\. FAILED", out, re.M)))
        print(f"{m}: {len(fails)} failing test(s): {', '.join(fails) or 'NONE (survived)'}", flush=True)
        bad += not fails
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
