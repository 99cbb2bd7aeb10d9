"""Explore mutated datasets for as long as it is given: fresh cases of the fuzz
(``tests/support/fuzz_shards.py``: one lie per case, coordinated or not, in any file of an
image or a video dataset, read plainly and through DataLoader workers, with delta_timestamps
and return_uint8, or in a mixture), each drawn from a seed of its own.

Prints each failing case as it is found, with its seed and the command that replays it, then
the outcomes counted by where the lie is, for each dataset kind: refused by the reader (and
verify), read unchanged but refused by ``verify --deep``, harmless (read unchanged, verify
passes), FAILED. CI runs the same cases derandomized (``tests/test_fuzz_shards.py``), less the
lies the reader does not catch yet (``lies.GAPS``; a failing case of one is marked "known
gap"); this finds the ones it has not drawn. Exit status 1 if any case failed.

    python scripts/fuzz_shards.py --seconds 120 --kind both
    python scripts/fuzz_shards.py --kind video --replay 123456789   # one case, in full

The reader under test is the one Python imports: ``PYTHONPATH=/other/checkout/src`` tests
another checkout's (the golden datasets are converted with it too).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

import lerobot_shards

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from fuzz_shards import FAILED, GOLDEN, HARMLESS, KINDS, REFUSED, VERIFY, Fuzz, start_workers
from lies import Case, Edits, known_gap, random_chooser

OUTCOMES = (REFUSED, VERIFY, HARMLESS, FAILED, "ERROR")
"""Table columns; ERROR is the fuzz's own failure to make a case (a bug here, not a finding)."""


def prepare(kind: str, work: Path) -> Fuzz:
    root = work / kind / "shards"
    if not (root / "index.json").exists():
        lerobot_shards.convert(str(GOLDEN / KINDS[kind]), str(root), workers=0, progress=False)
    return Fuzz.prepare(kind, root, work / kind / "scratch")


def replay_command(kind: str, seed: int) -> str:
    return f"python scripts/fuzz_shards.py --kind {kind} --replay {seed}"


def run_one(fuzz: Fuzz, seed: int) -> tuple[Case, str, str]:
    """The case drawn from ``seed``, its outcome and why."""
    try:
        parts, case = fuzz.draw(random_chooser(seed))
    except Exception:
        return Case("?", "drawing the case", Edits(), [], ""), "ERROR", traceback.format_exc()
    try:
        outcome, why = fuzz.run(parts, case)
    except Exception:
        outcome, why = "ERROR", traceback.format_exc()
    return case, outcome, why


def table(kind: str, counts: dict[str, Counter]) -> str:
    width = max([len("where the lie is"), *map(len, counts)]) + 2
    lines = [f"{kind}: " + f"{sum(sum(c.values()) for c in counts.values())} cases"]
    lines.append("where the lie is".ljust(width) + "".join(f"{o:>10}" for o in OUTCOMES))
    total: Counter = Counter()
    for where in sorted(counts):
        total += counts[where]
        row = "".join(f"{counts[where][o] or '':>10}" for o in OUTCOMES)
        lines.append(where.ljust(width) + row)
    lines.append("total".ljust(width) + "".join(f"{total[o]:>10}" for o in OUTCOMES))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60, help="how long to explore")
    parser.add_argument("--kind", choices=["video", "image", "both"], default="both")
    parser.add_argument("--replay", type=int, help="run only the case of this seed, told in full")
    parser.add_argument("--seed", type=int, help="the run's seed (default: a fresh one)")
    parser.add_argument("--work", type=Path, help="folder for datasets (default: a temporary one)")
    args = parser.parse_args()
    kinds = ["video", "image"] if args.kind == "both" else [args.kind]
    work = args.work or Path(tempfile.mkdtemp(prefix="fuzz-shards-"))
    start_workers()
    print(f"reader under test: {Path(lerobot_shards.__file__).parent}", flush=True)
    try:
        if args.replay is not None:
            if len(kinds) != 1:
                parser.error("--replay needs --kind video or --kind image")
            case, outcome, why = run_one(prepare(kinds[0], work), args.replay)
            gap = known_gap(case)
            print(f"{kinds[0]} seed {args.replay}: {case.where}: {case.description}\n{outcome} "
                  f"{why}" + (f"\nknown gap: {gap}" if gap else ""))  # fmt: skip
            print(f"the case's dataset: {work / kinds[0] / 'scratch' / 'case'}")
            return int(outcome in (FAILED, "ERROR"))
        seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
        print(f"run seed {seed} (--seed {seed} draws these cases again)", flush=True)
        rng = random.Random(seed)
        fuzzes = {kind: prepare(kind, work) for kind in kinds}
        counts: dict[str, dict[str, Counter]] = {kind: {} for kind in kinds}
        failures: dict[str, list[str]] = {kind: [] for kind in kinds}
        stop = time.monotonic() + args.seconds
        while time.monotonic() < stop:
            for kind, fuzz in fuzzes.items():
                case_seed = rng.getrandbits(40)
                case, outcome, why = run_one(fuzz, case_seed)
                where, description = case.where, case.description
                counts[kind].setdefault(where, Counter())[outcome] += 1
                if outcome in (FAILED, "ERROR"):
                    gap = known_gap(case)
                    failures[kind].append(where + (" (known gap)" if gap else ""))
                    why = why + (f"\n  known gap: {gap}" if gap else "")
                    print(f"\n{outcome} {kind} seed {case_seed}: {where}: {description}\n  "
                          f"{why.strip()}\n  replay: {replay_command(kind, case_seed)}",
                          flush=True)  # fmt: skip
        for kind in kinds:
            print("\n" + table(kind, counts[kind]))
            if failures[kind]:
                print(f"{kind}: failing where {dict(Counter(failures[kind]))}")
        return int(any(failures.values()))
    finally:
        if args.work is None and args.replay is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
