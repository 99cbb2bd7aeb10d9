"""Mutated datasets, read every way a user reads them: each case takes a converted dataset (the
golden ``av1_multifile``, video, or ``image``, PNGs in the rows) apart (``mutate.py``), tells
one lie, puts it back together with every checksum recomputed (only the content lies), reads a
whole epoch and runs ``verify --deep``.

Each lie (``lies.py``: one per case, in one file or coordinated across every file that
states the fact, in any file of the dataset) is read plainly and, drawn, also through a
``ShardedDataLoader`` with two workers, with ``delta_timestamps`` and ``return_uint8``, or as
the second member of a mixture.

The oracle is the unmutated dataset: a case passes if every read raises a ``FormatError``
naming the dataset and ``verify --deep`` reports a problem ("reader"), or if every read yields
the unmutated dataset's items (the same multiset, tensor for tensor) and a ``ds.meta`` equal to
what the unmutated files say (features, fps, stats, tasks, totals, camera keys, episodes,
read from the files here, not by the reader), verify reporting a problem ("verify") or none
("harmless"). Anything else fails: a crash, another exception, reads that disagree, items or
metadata that differ without an error, verify raising or passing a dataset the reader refuses.
The unmutated items themselves are checked, once, against what LeRobot 0.6.1 returned for the
golden datasets.

Cases are drawn by hypothesis in CI (derandomized where ``CI`` is set, else from a printed
seed; the lies the reader does not catch yet, ``lies.GAPS``, left out), or from a seed each
(``scripts/fuzz_shards.py`` explores fresh cases and replays one by its seed). ``main`` prints
one JSON line: the cases, their outcomes by where the lie is, the slowest case and the peak
RSS.

    python tests/support/fuzz_shards.py video|image SHARDS_ROOT SCRATCH_DIR EXAMPLES
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import multiprocessing
import os
import random
import resource
import signal
import sys
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).parent))
from lies import READS, Case, Choose, draw_case, hypothesis_chooser, known_gap
from mutate import Parts, put_together, take_apart

from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset
from lerobot_shards.converter.check import verify_dataset
from lerobot_shards.format import STATS_FILE, TASKS_FILE, FormatError
from lerobot_shards.reader.fetch.ranged import FetchError

GOLDEN = Path(__file__).parents[1] / "data" / "lerobot-0.6.1"
KINDS = {"video": "av1_multifile", "image": "image"}
"""Each dataset kind's golden dataset."""
DELTA = {
    "action": [0.0, 0.1, 0.2, 0.3],
    "observation.images.cam_high": [-0.2, -0.1, 0.0],
    "observation.state": [-0.1, 0.0],
}
"""The delta_timestamps LeRobot's golden ``*.delta.items.npz`` were recorded with."""
CASE_SECONDS = 180
"""A case that takes longer hangs."""
REFUSED, VERIFY, HARMLESS, FAILED = "reader", "verify", "harmless", "FAILED"
"""Outcomes: refused by the reader (and verify); read unchanged, verify reports a problem;
read unchanged, verify passes; anything else."""


# --- the oracle and the reads -----------------------------------------------------------------


def fingerprint(item: dict) -> str:
    """An item, key order, dtypes, shapes and values, as a string (its global index first)."""
    digest = hashlib.sha256()
    for key, value in item.items():
        digest.update(key.encode() + b"\0")
        if isinstance(value, torch.Tensor):
            digest.update(f"{value.dtype}{tuple(value.shape)}".encode())
            digest.update(value.contiguous().numpy().tobytes())
        else:
            digest.update(repr(value).encode())
    index = item.get("index")
    index = int(index) if isinstance(index, torch.Tensor) and index.numel() == 1 else index
    return f"{item.get('dataset_index', '')}/{index}:{digest.hexdigest()[:20]}"


def unbatch(batch: dict) -> list[dict]:
    size = len(next(v for v in batch.values() if isinstance(v, torch.Tensor)))
    return [{k: v[i] for k, v in batch.items()} for i in range(size)]


def stats_view(stats: Any) -> Any:
    if stats is None:
        return None
    if isinstance(stats, dict):
        return {k: stats_view(v) for k, v in stats.items()}
    array = np.asarray(stats)
    return (array.dtype.kind, array.shape, array.tolist())


def meta_view(meta: Any) -> dict:
    """What a trainer reads of ``ds.meta`` (a ``DatasetMeta``)."""
    return {
        "features": meta.features,
        "fps": meta.fps,
        "stats": stats_view(meta.stats),
        "tasks": list(meta.task_names),
        "total_frames": meta.total_frames,
        "total_episodes": meta.total_episodes,
        "camera_keys": list(meta.camera_keys),
        "video_keys": list(meta.video_keys),
        "image_keys": list(meta.image_keys),
        "episodes": {
            c: meta.episodes[c]
            for c in ("episode_index", "length", "dataset_from_index", "dataset_to_index")
        },
        "codebase_version": meta.codebase_version,
        "robot_type": meta.robot_type,
    }


def expected_meta(parts: Parts) -> dict:
    """What the unmutated files say ``ds.meta`` holds, read here (not by the reader)."""
    tasks = pq.read_table(io.BytesIO(parts.others[TASKS_FILE])).to_pylist()
    stats = json.loads(parts.others[STATS_FILE]) if STATS_FILE in parts.others else None
    cameras, videos = parts.index["camera_keys"], parts.index["video_keys"]
    return {
        "features": {
            k: {**ft, "shape": tuple(ft["shape"])} for k, ft in parts.info["features"].items()
        },
        "fps": parts.info["fps"],
        "stats": stats_view(stats),
        "tasks": [t["task"] for t in sorted(tasks, key=lambda t: t["task_index"])],
        "total_frames": sum(r["length"] for r in parts.rows),
        "total_episodes": len(parts.rows),
        "camera_keys": cameras,
        "video_keys": videos,
        "image_keys": [k for k in cameras if k not in videos],
        "episodes": {
            c: [r[c] for r in parts.rows]
            for c in ("episode_index", "length", "dataset_from_index", "dataset_to_index")
        },
        "codebase_version": parts.index["codebase_version"],
        "robot_type": parts.info.get("robot_type"),
    }


def mixture_view(meta: Any) -> dict:
    return {
        "features": meta.features,
        "fps": meta.fps,
        "stats": stats_view(meta.stats),
        "camera_keys": meta.camera_keys,
        "total_frames": meta.total_frames,
        "total_episodes": meta.total_episodes,
        "fps_per_dataset": meta.fps_per_dataset,
    }


def difference(got: dict, want: dict) -> list[str]:
    """Where ``got`` differs from ``want``: a key's name, with the value it has (and what the
    files say) where short, or its entries that differ."""
    out = []
    for key in sorted(set(got) | set(want)):
        a, b = got.get(key), want.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            entries = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            out.append(f"{key}: {entries}")
        else:
            out.append(f"{key}: {str(a)[:80]} (the files say {str(b)[:80]})")
    return out


@dataclass
class Read:
    items: Counter
    meta: dict
    mixture: dict | None = None
    samples: list[dict] = field(default_factory=list, repr=False)


def read(how: str, root: Path, other: Path, keep: bool = False) -> Read:
    """A whole epoch of the dataset at ``root`` read ``how``; a mixture's first member is the
    unmutated ``other``."""
    if how == "mixture":
        ds = ShardedLeRobotDataset([str(other), str(root)], seed=5)
        samples = list(ds)
        meta, mixture = ds.meta.datasets[1], mixture_view(ds.meta)
    else:
        options = {"delta_timestamps": DELTA, "return_uint8": True} if how == "delta" else {}
        ds = ShardedLeRobotDataset(str(root), seed=5, **options)
        if how == "loader":
            loader = ShardedDataLoader(ds, batch_size=4, num_workers=2, timeout=120)
            samples = [s for batch in loader for s in unbatch(batch)]
        else:
            samples = list(ds)
        meta, mixture = ds.meta, None
    items = Counter(fingerprint(s) for s in samples)
    return Read(items, meta_view(meta), mixture, samples if keep else [])


def check_golden(kind: str, reference: dict[str, Read]) -> None:
    """The unmutated items, each read, are LeRobot 0.6.1's own for the golden dataset (video
    frames compared as LeRobot makes them float: ``uint8 / 255``)."""
    for how, ref in reference.items():
        recorded = np.load(GOLDEN / f"{KINDS[kind]}{'.delta' if how == 'delta' else ''}.items.npz")
        keys = json.loads(str(recorded["__keys__"]))
        tasks = list(recorded["__tasks__"])
        seen = Counter()
        for item in ref.samples:
            index = int(item["index"])
            seen[index] += 1
            got = [k for k in item if k != "dataset_index"]
            assert got == keys, f"{kind} {how}: keys {got}, LeRobot's {keys}"
            assert item["task"] == tasks[index], f"{kind} {how} {index}: task"
            for key in (k for k in keys if k != "task"):
                value, want = item[key], torch.from_numpy(recorded[f"{index}|{key}"])
                if value.dtype == torch.uint8:
                    value = value.to(torch.float32) / 255
                assert value.dtype == want.dtype and value.shape == want.shape, (how, index, key)
                assert torch.equal(value, want), f"{kind} {how} {index} {key}: not LeRobot's"
        copies = 2 if how == "mixture" else 1
        assert set(seen) == set(range(len(tasks))), f"{kind} {how}: indices"
        assert min(seen.values()) >= copies, f"{kind} {how}: a frame missing"


@dataclass
class Fuzz:
    """One dataset kind, taken apart, with its unmutated reads: what every case is held to."""

    kind: str
    root: Path
    scratch: Path
    original: Parts
    expected: dict
    reference: dict[str, Read]

    @classmethod
    def prepare(cls, kind: str, root: Path, scratch: Path) -> Fuzz:
        scratch.mkdir(parents=True, exist_ok=True)
        original = take_apart(root)
        original.scratch = str(scratch)
        expected = expected_meta(original)
        reference = {how: read(how, root, root, keep=True) for how in sorted(set(READS))}
        check_golden(kind, reference)
        for how, ref in reference.items():
            assert ref.meta == expected, f"{kind} {how}: the unmutated ds.meta is not its files'"
            ref.samples.clear()
        return cls(kind, root, scratch, original, expected, reference)

    def draw(self, choose: Choose) -> tuple[Parts, Case]:
        parts = self.original.copy()
        return parts, draw_case(parts, self.kind, choose)

    def run(self, parts: Parts, case: Case) -> tuple[str, str]:
        """The case's outcome, and why where it FAILED."""
        dest = self.scratch / "case"
        edits = case.edits
        put_together(
            parts,
            dest,
            edit_rows=edits.rows,
            edit_index=edits.index,
            edit_shard=edits.shard,
            rechecksum=edits.rechecksum,
        )
        results: dict[str, Read | Exception] = {}
        with deadline(CASE_SECONDS):
            for how in case.reads:
                try:
                    results[how] = read(how, dest, self.root)
                except (ValueError, FetchError) as exc:  # FormatError is a ValueError
                    results[how] = exc
                except Exception as exc:  # any other exception is the finding
                    return FAILED, f"{how}: {type(exc).__name__} (not a FormatError): {exc}"
            try:
                problems = verify_dataset(str(dest), deep=True)
            except Exception as exc:
                return FAILED, f"verify raised {type(exc).__name__}: {exc}"
        refused = [how for how, r in results.items() if isinstance(r, Exception)]
        for how in refused:
            if str(dest) not in str(results[how]):
                return FAILED, f"{how}: the error names no dataset: {results[how]}"
            clear = isinstance(results[how], FormatError | FetchError)  # FetchError: no shard
            if not clear and (how == "plain" or not isinstance(results["plain"], Exception)):
                # a ValueError of delta_timestamps or a mixture's keys, only where the reader
                # refused the lie itself
                return FAILED, f"{how}: {type(results[how]).__name__}: {results[how]}"
        if refused and len(refused) < len(results):
            return FAILED, f"{refused} refuse it, {sorted(set(results) - set(refused))} read it"
        if refused:
            return (
                (REFUSED, "")
                if problems
                else (
                    FAILED,
                    f"verify --deep passed what the reader refuses: {results[refused[0]]}",
                )
            )
        for how, got in results.items():
            ref = self.reference[how]
            if got.items != ref.items:
                extra, missing = got.items - ref.items, ref.items - got.items
                return FAILED, (
                    f"{how}: items differ without an error: {len(extra)} not the "
                    f"unmutated dataset's (e.g. {sorted(extra)[:2]}), {len(missing)} "
                    f"of its missing (e.g. {sorted(missing)[:2]})"
                )
            differ = difference(got.meta, self.expected)
            if differ:
                return FAILED, f"{how}: ds.meta differs without an error: {differ}"
            if got.mixture != ref.mixture:
                return FAILED, f"{how}: the mixture's meta differs without an error"
        return (VERIFY, "") if problems else (HARMLESS, "")


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Raise ``TimeoutError`` in the main thread after ``seconds`` (a hang is a finding)."""

    def alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"the case ran past {seconds} s")

    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)


def start_workers() -> None:
    """DataLoader workers from a forkserver: this process runs reader threads, and a fork
    while one of them holds a lock can deadlock the child (tests/conftest.py says more)."""
    multiprocessing.set_start_method("forkserver", force=True)
    multiprocessing.set_forkserver_preload(["torch", "av", "lerobot_shards.reader.loading.dataset"])


def main(kind: str, root: Path, scratch: Path, examples: int) -> int:
    from hypothesis import HealthCheck, assume, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    start_workers()
    fuzz = Fuzz.prepare(kind, root, scratch)
    derandomize = bool(os.environ.get("CI"))
    seed = int(os.environ.get("FUZZ_SEED") or random.SystemRandom().getrandbits(32))
    summary: dict = {
        "kind": kind,
        "derandomized": derandomize,
        "seed": None if derandomize else seed,
        "cases": 0,
        "outcomes": Counter(),
        "where": {},
        "slowest_s": 0.0,
    }
    print(
        f"fuzz {kind}: "
        + (
            "derandomized (CI)"
            if derandomize
            else f"seed {seed} (FUZZ_SEED={seed} replays this run)"
        ),
        file=sys.stderr,
        flush=True,
    )

    @settings(
        max_examples=examples,
        derandomize=derandomize,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def case(data: Any) -> None:
        started = time.monotonic()
        parts, drawn = fuzz.draw(hypothesis_chooser(data))
        assume(known_gap(drawn) is None)
        outcome, why = fuzz.run(parts, drawn)
        assert outcome != FAILED, f"{kind} {drawn.where}: {drawn.description}: {why}"
        summary["cases"] += 1
        summary["outcomes"][outcome] += 1
        summary["where"].setdefault(drawn.where, Counter())[outcome] += 1
        summary["slowest_s"] = max(summary["slowest_s"], time.monotonic() - started)

    if not derandomize:
        case = hypothesis_seed(seed)(case)
    try:
        case()
    except Exception:
        print(traceback.format_exc(), file=sys.stderr)
        print(
            f"fuzz {kind}: FAILED; rerun with FUZZ_SEED={seed} (or CI=1 if derandomized), "
            "or replay the @reproduce_failure blob above",
            file=sys.stderr,
        )
        return 1
    summary["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])))
