"""The ``lerobot-shards`` command line: one click group, one command per job.

Commands import their implementation lazily, so ``lerobot-shards --help`` stays fast and a
command that is not used costs nothing.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack

import click
from click.core import ParameterSource


def parse_episodes(spec: str) -> list[int]:
    """``"0,3,5-9"`` -> ``[0, 3, 5, 6, 7, 8, 9]`` (ranges inclusive, order kept, no repeats)."""
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part[1:]:
                lo, hi = part.split("-", 1)
                start, stop = int(lo), int(hi)
                if stop < start:
                    raise ValueError
                out.extend(range(start, stop + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise click.BadParameter(
                f"{part!r} is not an episode index or a range like 5-9", param_hint="--episodes"
            ) from None
        if out and out[-1] < 0:
            raise click.BadParameter(f"{part!r}: negative episode index", param_hint="--episodes")
    return list(dict.fromkeys(out))


class JsonObject(click.ParamType):
    """A JSON object given on the command line (fsspec's storage options)."""

    name = "JSON"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None):
        if isinstance(value, dict):
            return value
        try:
            parsed = json.loads(str(value))
        except json.JSONDecodeError as exc:
            self.fail(f"not JSON: {exc}", param, ctx)
        if not isinstance(parsed, dict):
            self.fail(f'{value!r} is not a JSON object like {{"key": "value"}}', param, ctx)
        return parsed


def storage_options(name: str = "--storage-options", verb: str = "read from") -> Callable:
    """fsspec options as JSON for the filesystem datasets are ``verb`` (an endpoint,
    credentials)."""
    return click.option(
        name,
        type=JsonObject(),
        default="{}",
        show_default=True,
        help=f"fsspec options for the filesystem datasets are {verb}, as JSON: an S3-compatible "
        'endpoint (MinIO, R2, ...), credentials, e.g. \'{"endpoint_url": "http://host:9000"}\'.',
    )


LOCAL_WORKERS = click.option(
    "--workers",
    type=click.IntRange(min=0),
    show_default="the CPU count",
    help="Converter processes of the local executor (convert, demo), or the processes "
    "checking shards (verify); 0 or 1: in this process.",
)
EXECUTOR = click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Where episodes are converted (convert) or shards checked (verify): a local process "
    "pool, or Ray tasks on a cluster (needs pip install 'lerobot-shards[ray]').",
)
RAY_ADDRESS = click.option(
    "--ray-address",
    show_default="RAY_ADDRESS, else a new local Ray instance",
    help="The Ray cluster to connect to.",
)


BUFFER_SIZE = click.option(
    "--buffer-size",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Episodes resident in each DataLoader worker's pool (per worker, not per rank).",
)
BYTE_BUDGET = click.option(
    "--byte-budget-gb",
    type=click.FloatRange(min=0, min_open=True),
    show_default="no limit",
    help="GB (10**9 bytes) of fetched episodes and decoded frames for each rank (training "
    "process), split equally over its DataLoader workers.",
)
NUM_WORKERS = click.option(
    "--num-workers",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    help="DataLoader worker processes per rank (0: read in the main process).",
)
SEED = click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="The seed of every epoch's order.",
)
BATCH_SIZE = click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Samples per batch.",
)
WEIGHTS = click.option(
    "--weights",
    show_default="every frame once",
    help="A mixture's weights, one per dataset, e.g. 2,1,1: each dataset's share of an epoch's "
    "samples.",
)
LAYOUT = click.option(
    "--layout",
    "layout_file",
    type=click.Path(exists=True, dir_okay=False),
    show_default="none: each dataset's own items",
    help="A target layout (JSON, or YAML with PyYAML) every dataset is mapped into: a mixture "
    "across robots (docs/embodiments.md).",
)
EPISODES = click.option(
    "--episodes",
    show_default="all",
    help="A selection of episodes by index, e.g. 0,3,5-9: those convert converts, those the "
    "job that cache fill fills for reads.",
)
AS_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
CACHE_DIR = click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    show_default="$LEROBOT_SHARDS_CACHE_DIR, else ~/.cache/lerobot-shards",
    help="The cache folder, on a local disk of the node, shared by every process on it (a "
    "folder on a network filesystem is warned about).",
)


def cache_options(command: Callable) -> Callable:
    """``--cache/--no-cache``, ``--cache-dir``, ``--cache-limit-gb``, ``--node-affinity/
    --no-node-affinity``: the reader's node-local episode cache and what each node reads
    (``ShardedLeRobotDataset``'s ``cache``, ``cache_dir``, ``cache_limit_gb``,
    ``node_affinity``)."""
    command = click.option(
        "--node-affinity/--no-node-affinity",
        "node_affinity",
        default=None,
        show_default="on with a cache on several nodes, unless --cache-limit-gb holds the "
        "whole dataset",
        help="Each node reads the same episodes every epoch, so its cache keeps them.",
    )(command)
    command = click.option(
        "--cache-limit-gb",
        type=click.FloatRange(min=0, min_open=True),
        show_default="the folder's last limit, else half the disk's free space plus what the "
        "cache holds",
        help="Most GB (10**9 bytes) the cache holds; it never takes the last 5% of the disk (at "
        "most 1 GiB).",
    )(command)
    command = CACHE_DIR(command)
    return click.option(
        "--cache/--no-cache",
        "cache",
        default=None,
        show_default="remote roots, and any root given --cache-dir",
        help="Cache fetched episodes on the node's disk, so later epochs do not download them "
        "again.",
    )(command)


def cache_settings(
    cache: bool | None, cache_dir: str | None, limit: float | None, node_affinity: bool | None
) -> dict:
    """The dataset arguments of :func:`cache_options`' flags."""
    return {
        "cache": cache,
        "cache_dir": cache_dir,
        "cache_limit_gb": limit,
        "node_affinity": node_affinity,
    }


@click.group()
@click.version_option(package_name="lerobot-shards")
def main() -> None:
    """Per-episode tar shards of LeRobot datasets, and an exact-coverage streaming loader."""


@main.command()
@click.argument("source")
@click.argument("dest")
@EPISODES
@LOCAL_WORKERS
@storage_options()
@storage_options("--dest-storage-options", "written to")
@click.option("--overwrite", is_flag=True, help="Delete DEST first and start afresh.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@EXECUTOR
@RAY_ADDRESS
@click.option(
    "--max-in-flight",
    type=click.IntRange(min=1),
    show_default="two tasks of up to 64 consecutive episodes per worker; with Ray, twice the "
    "cluster's CPUs",
    help="Episodes submitted and not yet collected.",
)
@click.option(
    "--trust-finished",
    is_flag=True,
    help="On a rerun, keep finished shards that have their recorded size without reading them "
    "to check their checksums (a resume on object storage otherwise downloads them).",
)
@click.option(
    "--decode-check",
    is_flag=True,
    help="Also decode each cut's first frame, catching damaged source keyframes at conversion "
    "(about 45% more time per episode; verify --deep decodes every frame).",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Refuse non-finite values (NaN, Inf) in the rows, naming the feature, the episode and "
    "the first index (without it they are reported as warnings, as LeRobot reads them).",
)
@AS_JSON
def convert(
    source: str, dest: str, episodes: str | None, workers: int | None, storage_options: dict,
    dest_storage_options: dict, overwrite: bool, no_progress: bool, executor: str,
    ray_address: str | None, max_in_flight: int | None, trust_finished: bool, decode_check: bool,
    strict: bool, as_json: bool,
) -> None:  # fmt: skip
    """Convert the LeRobot dataset at SOURCE into shards at DEST (paths or fsspec URLs; SOURCE
    may be a Hub repo id, read from LeRobot's local copy when it has one).

    Rerunning an interrupted conversion finishes it without redoing finished episodes. The
    summary warns of what in the rows poisons training though LeRobot reads it: non-finite
    values, action or state dimensions constant over a whole episode, one-frame episodes
    (also in DEST/poisons.json, and in inspect).
    """
    if ray_address is not None and executor != "ray":
        raise click.UsageError("--ray-address needs --executor ray")
    if executor == "local" and workers not in (0, 1):
        from lerobot_shards.converter.forkserver import start_early

        start_early()  # the workers' imports overlap the driver's
    from lerobot_shards.converter.run import ConvertError
    from lerobot_shards.converter.run import convert as run_convert
    from lerobot_shards.source import SourceError

    try:
        summary = run_convert(
            source,
            dest,
            episodes=parse_episodes(episodes) if episodes is not None else None,
            workers=workers,
            storage_options=storage_options or None,
            dest_storage_options=dest_storage_options or None,
            overwrite=overwrite,
            progress=not no_progress,
            executor=executor,
            ray_address=ray_address,
            max_in_flight=max_in_flight,
            decode_check=decode_check,
            trust_finished=trust_finished,
            strict=strict,
        )
    except (ConvertError, SourceError) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(summary.to_json(), indent=2))
        return
    click.echo(summary.line())
    for line in summary.warnings():
        click.echo(line)


@main.command()
@click.argument("roots", nargs=-1, required=True)
@AS_JSON
@storage_options()
def inspect(roots: tuple[str, ...], as_json: bool, storage_options: dict) -> None:
    """Summarise the converted dataset at ROOT, or each of several ROOTS (read concurrently)
    and their totals. With --json, several ROOTS give a list."""
    from concurrent.futures import ThreadPoolExecutor

    from lerobot_shards.converter.check import format_inspection, inspect_dataset
    from lerobot_shards.format import FormatError

    try:
        with ThreadPoolExecutor(min(32, len(roots))) as pool:
            summaries = list(pool.map(lambda r: inspect_dataset(r, storage_options), roots))
    except (FormatError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(summaries if len(roots) > 1 else summaries[0], indent=2))
        return
    click.echo("\n\n".join(format_inspection(s) for s in summaries))
    if len(roots) > 1:
        totals = {
            key: sum(s[key] for s in summaries) for key in ("episodes", "frames", "total_bytes")
        }
        click.echo(
            f"\n{len(roots)} datasets: {totals['episodes']} episodes, "
            f"{totals['frames']} frames, {totals['total_bytes'] / 1e6:.1f} MB"
        )


@main.command()
@click.argument("root")
@click.option("--deep", is_flag=True, help="Also decode every frame of every camera.")
@click.option(
    "--sample",
    type=click.IntRange(min=0),
    show_default="every shard",
    help="Check N shards drawn at random (0: the manifest side only).",
)
@LOCAL_WORKERS
@EXECUTOR
@RAY_ADDRESS
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@storage_options()
def verify(
    root: str, deep: bool, sample: int | None, workers: int | None, executor: str,
    ray_address: str | None, no_progress: bool, storage_options: dict,
) -> None:  # fmt: skip
    """Check ROOT's index.json, metadata and manifest, then every shard (or --sample N of
    them) against its manifest row; exit 1 on any problem."""
    if ray_address is not None and executor != "ray":
        raise click.UsageError("--ray-address needs --executor ray")
    if executor == "ray" and workers is not None:
        raise click.UsageError("--workers is for local processes; Ray uses the cluster's CPUs")
    if executor == "local" and workers not in (0, 1) and sample != 0:
        from lerobot_shards.converter.forkserver import start_early

        start_early()  # the workers' imports overlap the manifest's checks
    from lerobot_shards.converter.check import verify_dataset
    from lerobot_shards.converter.job import ConvertError

    try:
        problems = verify_dataset(
            root,
            deep=deep,
            storage_options=storage_options,
            sample=sample,
            workers=(os.cpu_count() or 1) if workers is None else workers,
            executor=executor,
            ray_address=ray_address,
            progress=not no_progress,
        )
    except ConvertError as exc:  # Ray asked for and missing
        raise click.ClickException(str(exc)) from exc
    if problems:
        click.echo("\n".join(str(problem) for problem in problems), err=True)
        click.echo(f"{root}: {len(problems)} problem(s)", err=True)
        sys.exit(1)
    checked = "the manifest side" if sample == 0 else f"{sample} sampled shards" if sample else ""
    click.echo(f"{root}: ok" + (f" ({checked})" if checked else ""))


def layout_settings(layout_file: str | None, embodiments: str | None, count: int) -> dict:
    """``--layout`` read and checked now (its content, not its path, goes into checkpoints)
    and ``--embodiments``, one per root."""
    if layout_file is None:
        if embodiments is not None:
            raise click.BadParameter("embodiments need a --layout", param_hint="--embodiments")
        return {}
    from lerobot_shards.reader.meta.embodiment import TargetLayout

    try:
        layout = TargetLayout.load(layout_file).to_dict()
    except (ValueError, ImportError) as exc:
        raise click.BadParameter(str(exc), param_hint="--layout") from exc
    names = None
    if embodiments is not None:
        names = embodiments.split(",")
        if len(names) != count or not all(names):
            raise click.BadParameter(
                f"{embodiments!r}: one name per --shards ({count})", param_hint="--embodiments"
            )
    return {"layout": layout, "embodiments": names}


def parse_weights(spec: str | None, count: int) -> list[float] | None:
    """``"2,1,1"`` -> ``[2.0, 1.0, 1.0]``, one weight per root."""
    if spec is None:
        return None
    try:
        weights = [float(w) for w in spec.split(",")]
    except ValueError:
        raise click.BadParameter(
            f"{spec!r} is not numbers like 2,1,1", param_hint="--weights"
        ) from None
    if len(weights) != count:
        raise click.BadParameter(
            f"{len(weights)} weights for {count} datasets", param_hint="--weights"
        )
    return weights


@main.command()
@click.argument("roots", nargs=-1, required=True)
@WEIGHTS
@NUM_WORKERS
@BATCH_SIZE
@click.option(
    "--seconds",
    type=click.FloatRange(min=0, min_open=True),
    show_default="run --epochs",
    help="Stop after this long.",
)
@click.option(
    "--epochs",
    type=click.IntRange(min=1),
    show_default="1; with --seconds, as many as fit",
    help="Epochs to stream.",
)
@BUFFER_SIZE
@BYTE_BUDGET
@click.option(
    "--uint8/--float",
    "uint8",
    default=False,
    show_default=True,
    help="Video frames as uint8 (4x fewer bytes: what training reads), or float32 in [0, 1] "
    "as LeRobot returns them by default (ShardedLeRobotDataset's return_uint8).",
)
@click.option(
    "--depth-output-unit",
    type=click.Choice(["mm", "m"]),
    default="mm",
    show_default=True,
    help="Depth cameras' unit: millimetres or metres (LeRobot's depth_output_unit).",
)
@SEED
@click.option(
    "--decode-threads",
    type=click.IntRange(min=0),
    show_default="the cores shared out over the workers",
    help="Threads per process decoding upcoming frames (0: decode in the iterating thread).",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="Seconds between progress lines.",
)
@click.option(
    "--mixed-batches/--no-mixed-batches",
    default=True,
    show_default=True,
    help="Each batch mixes every worker's pool (ShardedDataLoader's default), or comes from "
    "one worker.",
)
@cache_options
@storage_options()
@LAYOUT
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False, writable=True),
    show_default="none",
    help="Also write a picture of where the time went: FILE.html (a page with a summary) or "
    "FILE.png (needs matplotlib: pip install 'lerobot-shards[report]').",
)
def stream(
    roots: tuple[str, ...], weights: str | None, num_workers: int, batch_size: int,
    seconds: float | None, epochs: int | None,
    buffer_size: int, byte_budget_gb: float | None, uint8: bool, depth_output_unit: str,
    seed: int, decode_threads: int | None, interval: float, mixed_batches: bool,
    cache: bool | None, cache_dir: str | None, cache_limit_gb: float | None,
    node_affinity: bool | None, storage_options: dict, layout_file: str | None,
    report_path: str | None,
) -> None:  # fmt: skip
    """Stream the converted dataset at ROOT (several ROOTS: their mixture) through a
    DataLoader and print what it delivers: samples/s, camera frames/s, shard MB/s and the
    epoch's coverage so far, per dataset for a mixture."""
    from lerobot_shards.format import FormatError
    from lerobot_shards.throughput import stream as run_stream

    mixture = len(roots) > 1
    if weights is not None and not mixture:
        raise click.BadParameter(
            "weights are for several ROOTS (a mixture)", param_hint="--weights"
        )
    if report_path is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise click.ClickException(
                "--report draws with matplotlib: pip install 'lerobot-shards[report]'"
            ) from None
    with ExitStack() as running:
        options: dict = {
            "decode_threads": decode_threads,
            "depth_output_unit": depth_output_unit,
            **cache_settings(cache, cache_dir, cache_limit_gb, node_affinity),
        }
        if layout_file is not None:
            options["layout"] = layout_settings(layout_file, None, len(roots))["layout"]
        log = None
        if report_path is not None:
            from lerobot_shards.report import MemorySampler, RunLog

            options["trace_dir"] = running.enter_context(tempfile.TemporaryDirectory())
            log = RunLog()
            running.enter_context(MemorySampler(log))
        try:
            stats = run_stream(
                list(roots) if mixture else roots[0],
                weights=parse_weights(weights, len(roots)),
                workers=num_workers,
                batch_size=batch_size,
                seconds=seconds,
                epochs=epochs,
                buffer_size=buffer_size,
                byte_budget_gb=byte_budget_gb,
                return_uint8=uint8,
                seed=seed,
                storage_options=storage_options,
                dataset_options=options,
                report=lambda s: click.echo(s.line()),
                interval_s=interval,
                log=log,
                mixed_batches=mixed_batches,
            )
        except (FormatError, FileNotFoundError, ValueError) as exc:
            raise click.ClickException(str(exc)) from exc
        if report_path is not None:
            from lerobot_shards.report import write_report
            from lerobot_shards.trace import read_traces

            write_report(
                log,
                read_traces(options["trace_dir"]),
                report_path,
                title=f"lerobot-shards stream {' '.join(roots)}: {num_workers} workers, batch "
                f"{batch_size}, buffer_size {buffer_size}",
            )
            click.echo(f"report: {report_path}")
    finished = ", ".join(f"{100 * c:.1f}%" for c in stats.epoch_coverage) or "none"
    click.echo(
        f"done: {stats.samples} samples in {stats.elapsed_s:.1f} s (first batch after "
        f"{stats.first_batch_s:.2f} s); {stats.samples_per_s:.1f} samples/s, "
        f"{stats.camera_frames_per_s:.1f} camera frames/s, {stats.bytes_per_s / 1e6:.2f} MB/s "
        f"after the first batch ({stats.overall_samples_per_s:.1f} samples/s overall); "
        f"coverage of finished epochs: {finished}"
    )
    for line in stats.dataset_lines():
        click.echo(line)


LEROBOT_VERSION = "0.6.1"
"""The LeRobot whose trainer ``lerobot-shards train`` runs (and is tested with)."""


def lerobot_version() -> str | None:
    """The installed LeRobot's version, None if it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lerobot")
    except PackageNotFoundError:
        return None


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option(
    "--shards",
    "roots",
    multiple=True,
    show_default="on a resume, the checkpoint's",
    help="A converted dataset (folder or fsspec URL); repeat it for a mixture.",
)
@WEIGHTS
@LAYOUT
@click.option(
    "--embodiments",
    show_default="each dataset's robot_type",
    help="Each --shards' embodiment under --layout, e.g. so100,aloha,pusht.",
)
@storage_options()
@BUFFER_SIZE
@BYTE_BUDGET
@cache_options
@click.pass_context
def train(
    ctx: click.Context, roots: tuple[str, ...], weights: str | None, layout_file: str | None,
    embodiments: str | None, storage_options: dict, buffer_size: int,
    byte_budget_gb: float | None, cache: bool | None, cache_dir: str | None,
    cache_limit_gb: float | None, node_affinity: bool | None,
) -> None:  # fmt: skip
    """Train with LeRobot 0.6.1's own trainer, lerobot-train, on shards: every other argument
    is lerobot-train's (--policy.type=act, --steps, --batch_size, --num_workers, --output_dir,
    --resume=true --config_path=..., ...). Run it under accelerate launch or torchrun for
    several GPUs. It runs where LeRobot 0.6.1 is installed: the environment
    scripts/setup_lerobot_env.sh makes (.venv-lerobot), or pip install
    'lerobot[training]==0.6.1'."""
    try:
        from lerobot_shards.train.arguments import RefusedArgument
        from lerobot_shards.train.datasets import Shards
        from lerobot_shards.train.run import train as run_train
    except ImportError as exc:
        raise click.ClickException(
            f"lerobot-shards train runs LeRobot {LEROBOT_VERSION}'s trainer, which this "
            f"environment cannot import ({exc}): run it in LeRobot {LEROBOT_VERSION}'s "
            "environment (from a checkout, bash scripts/setup_lerobot_env.sh makes "
            f".venv-lerobot), or pip install 'lerobot[training]=={LEROBOT_VERSION}'"
        ) from exc
    installed = lerobot_version()
    if installed != LEROBOT_VERSION:
        click.echo(
            f"warning: lerobot-shards train is made for LeRobot {LEROBOT_VERSION}'s trainer; "
            f"this environment has LeRobot {installed}",
            err=True,
        )
    if weights is not None and len(roots) < 2:
        raise click.BadParameter("weights are for several --shards", param_hint="--weights")
    shards = None
    if roots:
        shards = Shards(
            roots=list(roots),
            weights=parse_weights(weights, len(roots)),
            storage_options=storage_options,
            buffer_size=buffer_size,
            byte_budget_gb=byte_budget_gb,
            **cache_settings(cache, cache_dir, cache_limit_gb, node_affinity),
            **layout_settings(layout_file, embodiments, len(roots)),
        )
    elif layout_file or embodiments:
        raise click.BadParameter("--layout and --embodiments go with --shards")
    try:
        run_train(shards, ctx.args)
    except RefusedArgument as exc:
        raise click.ClickException(str(exc)) from exc


@main.command()
@click.option(
    "--workdir",
    default="demo-output",
    show_default=True,
    help="The folder, recreated: the sample LeRobot dataset goes to WORKDIR/lerobot, its shards "
    "to WORKDIR/shards.",
)
@LOCAL_WORKERS
@NUM_WORKERS
@BATCH_SIZE
def demo(workdir: str, workers: int | None, num_workers: int, batch_size: int) -> None:
    """Make a sample LeRobot dataset, convert it, and train one epoch from the stream."""
    from lerobot_shards.demo import format_report, run_demo

    report = run_demo(workdir, workers=workers, num_workers=num_workers, batch_size=batch_size)
    click.echo(format_report(report))
    if report.distinct_seen != report.frames:
        sys.exit(1)


@main.group()
def cache() -> None:
    """The node-local cache of remote episodes: filling it ahead, what it holds, emptying it."""


def open_cache(cache_dir: str | None):
    """The cache at ``cache_dir`` (or the default folder); a click error if it cannot be used."""
    from lerobot_shards.reader.fetch.cache import CacheStore, CacheUnavailable, default_cache_dir

    folder = cache_dir or default_cache_dir()
    if not os.path.isdir(folder):
        raise click.ClickException(f"no cache at {folder}")
    try:
        return CacheStore(folder)
    except CacheUnavailable as exc:
        raise click.ClickException(str(exc)) from exc


@cache.command("fill")
@click.argument("roots", nargs=-1)
@click.option(
    "--resume",
    "resume_path",
    type=click.Path(exists=True, dir_okay=False),
    show_default="a fresh epoch",
    help="Fill what a resumed job reads first: a state it loads (a loader's state_dict as "
    "JSON), or a lerobot-shards train checkpoint's training_state/lerobot_shards.json (its "
    "shards and their settings too, unless ROOTS and the flags give others). The options left "
    "at their defaults take the state's values.",
)
@WEIGHTS
@EPISODES
@click.option(
    "--eval-split",
    type=click.FloatRange(0, 1, max_open=True),
    default=0.0,
    show_default=True,
    help="The job's --dataset.eval_split: the episodes lerobot-shards train holds out are not "
    "read by its training loader.",
)
@storage_options()
@SEED
@BUFFER_SIZE
@BYTE_BUDGET
@cache_options
@click.option(
    "--nodes",
    "node_sizes",
    show_default="--world-size over --local-world-size",
    help="Ranks on each node, in rank order, e.g. 2,4,2 (torchrun's --nproc-per-node of each "
    "node); or --world-size with --local-world-size.",
)
@click.option(
    "--world-size",
    type=click.IntRange(min=1),
    show_default="the state's, else 1",
    help="The training job's ranks, over all nodes.",
)
@click.option(
    "--local-world-size",
    type=click.IntRange(min=1),
    show_default="--world-size, one node",
    help="Ranks per node, the same on every node (torchrun's --nproc-per-node).",
)
@click.option(
    "--node-rank",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="The node to fill for (torchrun's --node-rank).",
)
@NUM_WORKERS
@click.option(
    "--epoch",
    type=click.IntRange(min=0),
    show_default="0, or with --resume the rest of the state's epoch",
    help="A fresh epoch whose first reads are filled.",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Downloads at once.",
)
def cache_fill(
    roots: tuple[str, ...], resume_path: str | None, weights: str | None, episodes: str | None,
    eval_split: float, storage_options: dict, seed: int, buffer_size: int,
    byte_budget_gb: float | None, cache: bool | None, cache_dir: str | None,
    cache_limit_gb: float | None, node_affinity: bool | None, node_sizes: str | None,
    world_size: int | None, local_world_size: int | None, node_rank: int, num_workers: int,
    epoch: int | None, threads: int,
) -> None:  # fmt: skip
    """Download ahead what one node of a training job reads first (ROOT, or several ROOTS: a
    mixture), soonest first, as far as the cache holds it. Give it the job's reader settings
    (the options stream and train take), its layout, and, for a resumed job, the state it
    resumes from: what it fills is then what the job's first epoch reads on that node."""
    from lerobot_shards import ShardedLeRobotDataset
    from lerobot_shards.format import FormatError

    if cache is False:
        raise click.UsageError("cache fill fills the cache: --no-cache has no place here")
    state, shards = read_resume(resume_path)
    given = click.get_current_context().get_parameter_source
    saved = state or {}

    def default(name: str, value: object, recorded: object) -> object:
        """The option's value where given, else what the state or checkpoint recorded."""
        if given(name) is not ParameterSource.DEFAULT or recorded is None:
            return value
        return recorded

    if roots:
        shards = {"roots": list(roots)}
    if not shards.get("roots"):
        raise click.UsageError("give ROOT (or a lerobot-shards train checkpoint's --resume)")
    roots = tuple(shards["roots"])
    settings = {
        "weights": parse_weights(weights, len(roots)) if weights else shards.get("weights"),
        "storage_options": default("storage_options", storage_options, shards.get(
            "storage_options"
        )),
        "buffer_size": default("buffer_size", buffer_size, shards.get("buffer_size") or saved.get(
            "buffer_size"
        )),
        "byte_budget_gb": byte_budget_gb or shards.get("byte_budget_gb"),
        "seed": default("seed", seed, saved.get("seed")),
        "cache_dir": cache_dir or shards.get("cache_dir"),
        "cache_limit_gb": cache_limit_gb or shards.get("cache_limit_gb"),
        "node_affinity": node_affinity if node_affinity is not None else shards.get(
            "node_affinity"
        ),
    }  # fmt: skip
    world = fill_world(node_sizes, world_size, local_world_size, node_rank, state)
    try:
        ds = ShardedLeRobotDataset(
            list(roots) if len(roots) > 1 else roots[0],
            cache=True,
            episodes=fill_episodes(roots, episodes, eval_split, settings["storage_options"]),
            **settings,
        )
        ds.num_workers = default("num_workers", num_workers, saved.get("num_workers"))
        resumed = state is not None and epoch is None
        count, total = ds.fill_cache(
            None if resumed else epoch or 0, threads, world=world, state=state if resumed else None
        )
    except (FormatError, FileNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"cache fill: {count} episodes, {total / 1e6:.1f} MB read through {ds.cache.directory}"
    )


def read_resume(path: str | None) -> tuple[dict | None, dict]:
    """The state a job resumes from and the shards' settings a train checkpoint records."""
    if path is None:
        return None, {}
    try:
        with open(path) as f:
            saved = json.load(f)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"{path} is not JSON: {exc}", param_hint="--resume") from None
    if "data" in saved and "shards" in saved:  # lerobot-shards train's lerobot_shards.json
        return saved["data"], saved["shards"]
    if "epoch" not in saved:
        raise click.BadParameter(f"{path} holds no reader state", param_hint="--resume")
    return saved, {}


def fill_world(
    node_sizes: str | None,
    world_size: int | None,
    local_world_size: int | None,
    node_rank: int,
    state: dict | None,
):
    """The job's world as ``cache fill`` plans it: the ranks of each node (``--nodes``, or
    ``--world-size`` over ``--local-world-size``, or the state's), filled for ``--node-rank``'s."""
    from lerobot_shards.reader.loading.world import World
    from lerobot_shards.reader.plan.nodes import Nodes

    if node_sizes is not None:
        if world_size is not None or local_world_size is not None:
            raise click.UsageError("give --nodes, or --world-size and --local-world-size")
        try:
            sizes = [int(n) for n in node_sizes.split(",")]
        except ValueError:
            raise click.BadParameter(f"{node_sizes!r} is not like 2,4,2", "--nodes") from None
        if not sizes or min(sizes) < 1:
            raise click.BadParameter(f"{node_sizes!r}: every node has a rank", "--nodes")
        nodes = Nodes(tuple(n for n, size in enumerate(sizes) for _ in range(size)))
    elif world_size is None and state is not None:
        nodes = Nodes.from_state(state.get("nodes", 1), int(state["world_size"]))
    else:
        world = world_size or 1
        local = local_world_size or world
        if world % local:
            raise click.BadParameter(
                f"{world} ranks are not nodes of {local}", param_hint="--local-world-size"
            )
        nodes = Nodes.even(world, world // local)
    if node_rank >= nodes.count:
        raise click.BadParameter(
            f"the job has {nodes.count} nodes, no node {node_rank}", param_hint="--node-rank"
        )
    return World(nodes.ranks(node_rank)[0], nodes.world_size, nodes)


def fill_episodes(
    roots: tuple[str, ...], episodes: str | None, eval_split: float, storage_options: dict | None
) -> list[int] | None:
    """The episodes the job's training loader reads: ``--episodes``, less what
    ``--eval-split`` holds out as lerobot-shards train does (``train/datasets.py``)."""
    selected = parse_episodes(episodes) if episodes is not None else None
    if not eval_split:
        return selected
    if len(roots) > 1:
        raise click.BadParameter("--eval-split takes one ROOT, as train does", "--eval-split")
    from lerobot_shards import ShardedLeRobotDataset
    from lerobot_shards.train.datasets import split_by_task

    manifest = ShardedLeRobotDataset(
        roots[0], episodes=selected, storage_options=storage_options, cache=False
    ).manifest
    first_tasks = [tasks[0] if tasks else "" for tasks in manifest["tasks"].to_pylist()]
    train, _ = split_by_task(manifest["episode_index"].to_pylist(), first_tasks, eval_split)
    return train


@cache.command("ls")
@CACHE_DIR
@AS_JSON
def cache_ls(cache_dir: str | None, as_json: bool) -> None:
    """Show the cache: its folder, limit and bytes used, and per dataset its entries and bytes."""
    from dataclasses import asdict

    from lerobot_shards.reader.fetch.cache import dataset_of

    store = open_cache(cache_dir)
    entries, (used, limit) = store.entries(), store.usage()
    store.close()
    if as_json:
        listing = [asdict(e) for e in entries]
        info = {"directory": str(store.directory), "limit": limit, "used": used}
        click.echo(json.dumps({**info, "entries": listing}, indent=2))
        return
    click.echo(f"{store.directory}: {used / 1e6:.1f} MB of {limit / 1e6:.1f} MB")
    datasets: dict[str, list[int]] = {}
    for entry in entries:
        counts = datasets.setdefault(dataset_of(entry.label) or "(unlabelled)", [0, 0, 0])
        counts[0 if entry.state == "ready" else 1] += 1
        counts[2] += entry.size
    for name, (ready, pending, size) in sorted(datasets.items()):
        in_flight = f" (+{pending} downloading)" if pending else ""
        click.echo(f"  {name}: {ready} episodes{in_flight}, {size / 1e6:.1f} MB")


@cache.command("clear")
@CACHE_DIR
def cache_clear(cache_dir: str | None) -> None:
    """Empty the cache; refused while another process uses it."""
    from lerobot_shards.reader.fetch.cache import CacheBusy

    store = open_cache(cache_dir)
    try:
        store.clear()
    except CacheBusy as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        store.close()
    click.echo(f"{store.directory}: cleared")


def run() -> None:
    """The console entry point: :func:`main`, then exit without tearing the interpreter down.

    Once a command is done, its output flushed and its pools joined, nothing is left to clean
    up; tearing down can still abort the process (exit -6, "terminate called without an active
    exception") when a pyarrow thread is destroyed at exit (apache/arrow#34314, seen here after
    ``verify``), which turns a clean exit code into a crash.
    """
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
