"""Mixtures across robots: three datasets that differ in action and state width and names,
camera count and size, storage (video, PNG images) and frame rate, mapped into one target
layout and mixed with weights.

The expectations are computed here, apart from the reader: vectors from the recordings' own
formulas (``observation.state[j] = 100*episode + frame + j/4``, action 0.25 less, the golden
README's and the factory's), normalised in float64 with the statistics read from each dataset's
``meta/stats.json``; video frames decoded from the shards' mp4 members with PyAV and resized by
PyAV's ``reformat`` (swscale, the arithmetic the layout states: a ``yuv420p`` frame scaled into
``yuv422p``, then converted to rgb24; equal bit for bit), and against
Pillow's bilinear resize of each dataset's own frames (other arithmetic: within a tolerance,
below); image features resized by Pillow (the arithmetic stated for them: equal).

Tolerances. Normalised vectors: float32 against float64. The reader subtracts and divides in
float32 with the stats rounded to float32: values and stats below 2**9 carry errors of half an
ulp, 3e-5 at most, divided by a quantile range or std of at least 1 here, and the result (up to
about 40: the factory's quantiles are averages of its episodes', narrower than the data) its own
half ulp: within 1e-4 + 1e-5 of the result. A real mistake (another frame's value, another
dataset's stats, q10 for q01) moves a value by more than 0.1. Frames against Pillow:
swscale scales the YUV 4:2:0 planes and then converts, Pillow scales the RGB frame swscale
converted at full size, both bilinear with a support widened by the shrink ratio but with other
rounding and chroma order; on these frames the mean absolute difference measured 0.5-2.3
levels, and a picture placed one pixel off 8-18, so a mean of at most 4 holds the geometry.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections import Counter
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from support.batches import assert_same_items
from torch.utils.data import DataLoader

import lerobot_shards
from lerobot_shards import (
    DatasetRoot,
    Embodiment,
    ShardedDataLoader,
    ShardedLeRobotDataset,
    TargetLayout,
)
from lerobot_shards.reader.frames.rgb24 import one_thread_options
from lerobot_shards.testing import action_value, make_dataset, state_value

TOP, LEFT, RIGHT = "observation.images.top", "observation.images.left", "observation.images.right"
HIGH = "observation.images.cam_high"
LEFT_WRIST = "observation.images.cam_left_wrist"
RIGHT_WRIST = "observation.images.cam_right_wrist"
PUSHT_CAMERA = "observation.image"
ALOHA_JOINTS = [f"l{i}" for i in range(7)] + [f"r{i}" for i in range(7)]
NAMES = {"arm": ["j0", "j1", "j2", "j3"], "aloha": ALOHA_JOINTS, "pusht": ["x", "y"]}
LENGTHS = {"arm": [12, 1, 30, 9, 17, 5], "aloha": [6, 9, 5], "pusht": [8, 7]}
ORDER = ["arm", "aloha", "pusht"]
ACTION_SLOT = ["j0", "j1", "j2", "j3", *ALOHA_JOINTS, "x", "y", None, None]
STATE_WIDTH = 16
IMAGE_SIZE = (24, 40)
STEPS = 4
CAMERA_SLOTS = {  # dataset -> its camera -> slot
    "arm": {HIGH: TOP, LEFT_WRIST: LEFT},
    "aloha": {HIGH: TOP, LEFT_WRIST: LEFT, RIGHT_WRIST: RIGHT},
    "pusht": {PUSHT_CAMERA: TOP},
}
LAYOUT = TargetLayout(
    vectors={"action": ACTION_SLOT, "observation.state": STATE_WIDTH},
    cameras=[TOP, LEFT, RIGHT],
    image_size=IMAGE_SIZE,
    resize="pad",
    normalize={"action": "quantiles", "observation.state": "mean_std"},
    embodiments={
        "golden_arm": Embodiment(key_map=CAMERA_SLOTS["arm"]),
        "aloha": Embodiment(key_map=CAMERA_SLOTS["aloha"]),
        "pusht": Embodiment(key_map=CAMERA_SLOTS["pusht"]),
    },
)


@pytest.fixture(scope="module")
def roots(av1: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``arm``: the golden av1_multifile (LeRobot 0.6.1's: 4 joints, two AV1 cameras of 40x56
    and 24x32, 10 fps); ``aloha``: 14 named joints, three cameras (32x48, 24x32, 24x32), 50
    fps; ``pusht``: 2 dims, one 32x32 camera stored as PNG images, 15 fps."""
    base = tmp_path_factory.mktemp("embodiments")
    recipes = {
        "aloha": dict(
            cameras={HIGH: (32, 48), LEFT_WRIST: (24, 32), RIGHT_WRIST: (24, 32)},
            fps=50,
            state_names=ALOHA_JOINTS,
            action_names=ALOHA_JOINTS,
            robot_type="aloha",
            seed=1,
        ),
        "pusht": dict(
            cameras={PUSHT_CAMERA: (32, 32)},
            video=False,
            fps=15,
            state_names=NAMES["pusht"],
            action_names=NAMES["pusht"],
            robot_type="pusht",
            seed=2,
        ),
    }
    made = {"arm": av1}
    for name, recipe in recipes.items():
        source = make_dataset(base / f"{name}-source", episode_lengths=LENGTHS[name], **recipe)
        lerobot_shards.convert(str(source), str(base / name), workers=0, progress=False)
        made[name] = base / name
    return made


def mixture(roots, **options) -> ShardedLeRobotDataset:
    settings = dict(
        layout=LAYOUT,
        weights=[2, 1, 1],
        delta_indices={"action": list(range(STEPS))},
        return_uint8=True,
        seed=5,
        buffer_size=3,
    )
    # the golden dataset's folder is av1_multifile: named here; the others by their folders
    sources = [DatasetRoot(roots["arm"], name="arm"), roots["aloha"], roots["pusht"]]
    return ShardedLeRobotDataset(sources, **{**settings, **options})


def stats_of(root: Path) -> dict:
    return json.loads((root / "meta/stats.json").read_text())


def expected_vector(name: str, key: str, episode: int, frame: int, stats: dict) -> np.ndarray:
    """The dataset's own values of ``key`` for a frame (the action's chunk of ``STEPS``,
    clamped at the episode's end), normalised as the layout says, in float64."""
    n, length = len(NAMES[name]), LENGTHS[name][episode]
    if key == "action":
        frames = np.minimum(frame + np.arange(STEPS), length - 1)
        raw = np.stack([action_value(episode, int(f), n) for f in frames]).astype(np.float64)
        low, high = np.asarray(stats[key]["q01"]), np.asarray(stats[key]["q99"])
        return 2 * (raw - low) / (high - low) - 1
    raw = state_value(episode, frame, n).astype(np.float64)
    return (raw - np.asarray(stats[key]["mean"])) / (np.asarray(stats[key]["std"]) + 1e-8)


def slot_dims(name: str, key: str) -> list[int]:
    """Where the dataset's dims go: the action by name, the state to the leading dims."""
    if key == "action":
        return [ACTION_SLOT.index(n) for n in NAMES[name]]
    return list(range(len(NAMES[name])))


def inner(height: int, width: int) -> tuple[int, int, int, int]:
    """openpi's ``resize_with_pad`` geometry: (top, left, rows, columns) of the picture."""
    ratio = max(width / IMAGE_SIZE[1], height / IMAGE_SIZE[0])
    rows, columns = int(height / ratio), int(width / ratio)
    return (IMAGE_SIZE[0] - rows) // 2, (IMAGE_SIZE[1] - columns) // 2, rows, columns


def padded(picture: np.ndarray, top: int, left: int) -> np.ndarray:
    out = np.zeros((*IMAGE_SIZE, 3), dtype=np.uint8)
    out[top : top + picture.shape[0], left : left + picture.shape[1]] = picture
    return out


class DecodedShards:
    """Each episode's frames decoded from the shards' mp4 members with PyAV, for the frames'
    oracle: read from the manifest and the tar by hand, never through the reader."""

    def __init__(self) -> None:
        self.frames: dict[tuple[Path, int, str], list] = {}

    def frame(self, root: Path, episode: int, camera: str, position: int):
        key = (root, episode, camera)
        if key not in self.frames:
            manifest = pq.read_table(root / "manifest.parquet").to_pylist()
            row = next(r for r in manifest if r["episode_index"] == episode)
            members = {m["name"]: m for m in row["members"]}
            data = (root / row["shard"]).read_bytes()

            def member(suffix: str) -> bytes:
                found = members[f"episode-{episode:06d}.{suffix}"]
                return data[found["offset"] : found["offset"] + found["size"]]

            skip = json.loads(member("json"))["cameras"][camera].get("skip_frames", 0)
            with av.open(io.BytesIO(member(f"{camera}.mp4"))) as container:
                self.frames[key] = list(container.decode(video=0))[skip:]
        return self.frames[key][position]


def own_items(roots) -> dict[str, dict[int, dict]]:
    """Each dataset's own items (no layout), uint8 frames, by index."""
    return {
        name: {int(i["index"]): i for i in ShardedLeRobotDataset(roots[name], return_uint8=True)}
        for name in ORDER
    }


def rows_of(batch: dict) -> list[dict]:
    """A collated batch's samples, one dict each."""
    size = len(batch["index"])
    return [
        {k: (v[row] if isinstance(v, (torch.Tensor, list)) else v) for k, v in batch.items()}
        for row in range(size)
    ]


def test_items_batch_and_hold_each_datasets_own_values_in_the_layout(roots):
    ds = mixture(roots, pad=False)
    stats = {name: stats_of(roots[name]) for name in ORDER}
    own = own_items(roots)
    decoded = DecodedShards()
    seen_from: Counter = Counter()
    # batches checked as they come and dropped: the workers' shared segments are reused
    for batch in ShardedDataLoader(ds, batch_size=8, num_workers=2):  # default collate
        assert batch[TOP].shape[1:] == (3, *IMAGE_SIZE) and batch[TOP].dtype == torch.uint8
        assert batch["action"].shape[1:] == (STEPS, len(ACTION_SLOT))
        for sample in rows_of(batch):
            d = int(sample["dataset_index"])
            name = ORDER[d]
            seen_from[name] += 1
            assert sample["dataset"] == name
            assert sample["embodiment"] == ["golden_arm", "aloha", "pusht"][d]
            assert int(sample["embodiment_index"]) == d
            episode, frame = int(sample["episode_index"]), int(sample["frame_index"])
            for key in ("action", "observation.state"):
                dims = slot_dims(name, key)
                got = sample[key].numpy()
                want = expected_vector(name, key, episode, frame, stats[name])
                np.testing.assert_allclose(got[..., dims], want, rtol=1e-5, atol=1e-4)
                rest = np.setdiff1d(np.arange(got.shape[-1]), dims)
                assert (got[..., rest] == 0).all(), (name, key)  # exactly zero
                mask = np.zeros(got.shape[-1], dtype=bool)
                mask[dims] = True
                assert sample[f"{key}_mask"].tolist() == mask.tolist()
            pad = frame + np.arange(STEPS) > LENGTHS[name][episode] - 1
            assert sample["action_is_pad"].tolist() == pad.tolist()
            check_cameras(name, roots[name], sample, own[name][int(sample["index"])], decoded)
    assert sum(seen_from.values()) == len(ds) == ds.epoch_samples == 109
    assert dict(seen_from) == dict(zip(ORDER, ds.samples_per_dataset.tolist(), strict=True))


def check_cameras(name, root, sample, own, decoded) -> None:
    slots = CAMERA_SLOTS[name]
    for slot in (TOP, LEFT, RIGHT):
        frame = sample[slot].permute(1, 2, 0).numpy()
        camera = next((c for c, s in slots.items() if s == slot), None)
        assert bool(sample[f"{slot}_mask"]) == (camera is not None)
        if camera is None:  # a slot the dataset lacks: a zero image
            assert not frame.any(), (name, slot)
            continue
        native = own[camera].permute(1, 2, 0).numpy()
        if native.dtype != np.uint8:  # an image feature: float32 = uint8 / 255, exactly
            native = np.round(native * 255).astype(np.uint8)
        top, left, rows, columns = inner(*native.shape[:2])
        bands = np.ones(IMAGE_SIZE, dtype=bool)
        bands[top : top + rows, left : left + columns] = False
        assert not frame[bands].any(), (name, slot)
        pillow = np.asarray(Image.fromarray(native).resize((columns, rows), Image.BILINEAR))
        if name == "pusht":  # image features are resized by Pillow: the same arithmetic
            assert np.array_equal(frame, padded(pillow, top, left)), slot
            continue
        picture = frame[top : top + rows, left : left + columns].astype(np.int16)
        assert np.abs(picture - pillow).mean() <= 4, (name, slot)
        source = decoded.frame(
            root, int(sample["episode_index"]), camera, int(sample["frame_index"])
        )
        threads = one_thread_options()
        if source.format.name == "yuv420p" and (rows, columns) != (source.height, source.width):
            # scaled into yuv422p, then converted (stated); a frame of the size, converted
            source = source.reformat(width=columns, height=rows, format="yuv422p", **threads)
            swscale = source.reformat(format="rgb24", **threads).to_ndarray()
        else:
            swscale = source.reformat(
                width=columns, height=rows, format="rgb24", **threads
            ).to_ndarray()
        assert np.array_equal(frame, padded(swscale, top, left)), (name, slot)


def epoch_ids(loader) -> Counter:
    return Counter(
        pair
        for batch in loader
        for pair in zip(batch["dataset_index"].tolist(), batch["index"].tolist(), strict=True)
    )


def test_weighted_counts_per_frame_are_exact_over_epochs(roots):
    ds = mixture(roots, pad=False)
    frames = {
        d: [(d, i) for i in range(sum(LENGTHS[name]))] for d, name in enumerate(ORDER)
    }  # each dataset's global indices start at 0
    loader = ShardedDataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True)
    so_far: Counter = Counter()
    for epoch in range(3):
        ds.set_epoch(epoch)
        seen = epoch_ids(loader)
        so_far.update(seen)
        for d, n in enumerate(ds.samples_per_dataset.tolist()):
            counts = [seen[f] for f in frames[d]]
            assert sum(counts) == n
            assert set(counts) <= {n // len(counts), -(-n // len(counts))}
            cumulative = [so_far[f] for f in frames[d]]
            assert max(cumulative) - min(cumulative) <= 1, (epoch, d)
    assert ds.samples_per_dataset.tolist() == [55, 27, 27]  # 109 * 2/4, 1/4, 1/4


def ids_of(batch) -> list[tuple[int, int]]:
    return list(zip(batch["dataset_index"].tolist(), batch["index"].tolist(), strict=True))


def test_resume_and_elastic_resume_are_exact(roots):
    def make(**options):
        return mixture(roots, **options)

    ds = make()
    full = [ids_of(b) for b in ShardedDataLoader(ds, batch_size=5, num_workers=2)]
    ds = make()
    loader = ShardedDataLoader(ds, batch_size=5, num_workers=2)
    it = iter(loader)
    head = [ids_of(next(it)) for _ in range(6)]
    state = loader.state_dict()
    del it
    resumed = make()
    loader = ShardedDataLoader(resumed, batch_size=5, num_workers=2)
    loader.load_state_dict(state)
    rest = [ids_of(b) for b in loader]
    assert head + rest == full

    elastic = make(pad=False)  # 0 workers to 3: the rest of the epoch, each sample once
    epoch = Counter(p for b in DataLoader(make(pad=False), batch_size=4) for p in ids_of(b))
    it = iter(elastic)
    before = [(int(i["dataset_index"]), int(i["index"])) for i in (next(it) for _ in range(23))]
    state = elastic.state_dict()
    after = make(pad=False)
    after.num_workers = 3
    after.load_state_dict(state)
    rest = Counter(p for b in DataLoader(after, batch_size=4, num_workers=3) for p in ids_of(b))
    assert Counter(before) + rest == epoch


def test_ranks_are_balanced_and_the_cache_serves_the_same_items(roots, monkeypatch, tmp_path):
    """Two ranks: equal parts that together are the epoch; a rank reading through the
    node-local cache yields the uncached reader's items, tensor for tensor."""
    epoch = Counter((int(i["dataset_index"]), int(i["index"])) for i in mixture(roots, pad=False))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # both ranks on this node, as torchrun says
    parts = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        cached = list(mixture(roots, cache_dir=tmp_path / "cache"))
        uncached = list(mixture(roots, cache=False))
        assert_same_items(cached, uncached)
        parts.append(Counter((int(i["dataset_index"]), int(i["index"])) for i in cached))
    assert sum(parts[0].values()) == sum(parts[1].values()) == 55
    assert not epoch - parts[0] - parts[1]  # every sample of the epoch
    assert sum((parts[0] + parts[1] - epoch).values()) == 1  # 109 samples: one padded repeat


def test_every_camera_slot_has_its_region_in_the_loaders_batch_ring(roots):
    """Mixed batches are written into the loader's ring, a region per camera: every slot of
    the layout has one at its size, those the first dataset lacks too (else their frames
    would travel torch's way, one pickled copy each: 4x the CPU per sample, measured)."""
    ds = mixture(roots)
    ring = ShardedDataLoader(ds, batch_size=4, num_workers=2)._make_ring()
    assert ring is not None
    regions = {key: capacity for key, _, capacity in ring.handle.regions}
    frame = 3 * IMAGE_SIZE[0] * IMAGE_SIZE[1]
    assert set(regions) == {TOP, LEFT, RIGHT} and min(regions.values()) >= 4 * frame
    assert ds.item_cameras == {slot: ("uint8", (3, *IMAGE_SIZE)) for slot in (TOP, LEFT, RIGHT)}


def test_each_datasets_statistics_are_kept_in_its_slots(roots):
    ds = mixture(roots)
    meta = ds.meta
    assert meta.dataset_names == ORDER
    assert meta.embodiment_names == ["golden_arm", "aloha", "pusht"]
    assert meta.features["action"]["shape"] == (len(ACTION_SLOT),)
    assert meta.features[TOP] == {
        "dtype": "video", "shape": (*IMAGE_SIZE, 3), "names": ["height", "width", "channels"]
    }  # fmt: skip
    assert meta.camera_keys == [TOP, LEFT, RIGHT]
    for name in ORDER:
        own = stats_of(roots[name])
        for key in ("action", "observation.state"):
            placed = meta.stats_by_dataset[name][key]
            dims = slot_dims(name, key)
            rest = np.setdiff1d(np.arange(len(placed["mean"])), dims)
            for stat in ("mean", "std", "min", "max", "q01", "q10", "q50", "q90", "q99"):
                assert placed[stat][dims].tolist() == own[key][stat], (name, key, stat)
            assert (placed["mean"][rest] == 0).all() and (placed["std"][rest] == 1).all()
            assert (placed["q01"][rest] == -1).all() and (placed["q99"][rest] == 1).all()
            assert placed["count"].tolist() == own[key]["count"]
    # normalised in the reader: LeRobot's normaliser must leave the values as they are
    for key in ("action", "observation.state"):
        combined = meta.stats[key]
        assert (combined["mean"] == 0).all() and (combined["std"] == 1).all()
        assert (combined["q01"] == -1).all() and (combined["q99"] == 1).all()
        assert (combined["min"] == -1).all() and (combined["max"] == 1).all()


def test_without_normalisation_each_slot_dim_is_pooled_over_the_datasets_that_fill_it(roots):
    layout = dataclasses.replace(LAYOUT, normalize=None)
    meta = mixture(roots, layout=layout).meta
    own = {name: stats_of(roots[name]) for name in ORDER}
    state = meta.stats["observation.state"]
    for dim in range(STATE_WIDTH):
        having = [n for n in ORDER if dim < len(NAMES[n])]
        if not having:  # no dataset fills it: the identity
            assert (state["mean"][dim], state["std"][dim]) == (0, 1)
            continue
        counts = np.array([own[n]["observation.state"]["count"][0] for n in having], float)
        means = np.array([own[n]["observation.state"]["mean"][dim] for n in having])
        stds = np.array([own[n]["observation.state"]["std"][dim] for n in having])
        mean = (counts * means).sum() / counts.sum()
        std = np.sqrt((counts * (stds**2 + (means - mean) ** 2)).sum() / counts.sum())
        np.testing.assert_allclose(state["mean"][dim], mean, rtol=1e-12)
        np.testing.assert_allclose(state["std"][dim], std, rtol=1e-12)
        low = min(own[n]["observation.state"]["min"][dim] for n in having)
        assert state["min"][dim] == low
    action = meta.stats["action"]
    assert action["mean"][-2:].tolist() == [0, 0] and action["std"][-2:].tolist() == [1, 1]
    for name in ORDER:  # a dim only one dataset fills holds that dataset's statistics
        for dim, value in zip(slot_dims(name, "action"), own[name]["action"]["mean"], strict=True):
            np.testing.assert_allclose(action["mean"][dim], value, rtol=1e-12)


def test_without_resize_frames_are_each_datasets_own_and_float_as_lerobot_gives_them(roots):
    """No image_size: a slot's datasets must agree on its size; frames are each dataset's own
    (float32 in [0, 1] without return_uint8) and a missing camera's image is float zeros."""
    layout = TargetLayout(
        vectors={"action": 14},
        cameras=[LEFT, RIGHT],
        embodiments={
            "golden_arm": Embodiment(key_map={HIGH: None, LEFT_WRIST: LEFT}),
            "aloha": Embodiment(key_map={HIGH: None, LEFT_WRIST: LEFT, RIGHT_WRIST: RIGHT}),
        },
    )
    ds = ShardedLeRobotDataset([roots["arm"], roots["aloha"]], layout=layout, seed=1)
    own = {
        n: {int(i["index"]): i for i in ShardedLeRobotDataset(roots[n])} for n in ("arm", "aloha")
    }
    for batch in DataLoader(ds, batch_size=7):
        for sample in rows_of(batch):
            name = ["arm", "aloha"][int(sample["dataset_index"])]
            theirs = own[name][int(sample["index"])]
            assert torch.equal(sample[LEFT], theirs[LEFT_WRIST])
            if name == "aloha":
                assert torch.equal(sample[RIGHT], theirs[RIGHT_WRIST])
            else:
                assert sample[RIGHT].dtype == torch.float32 and not sample[RIGHT].any()
            n = len(NAMES[name])
            assert torch.equal(sample["action"][:n], theirs["action"])  # not normalised
            assert not sample["action"][n:].any()
    assert ds.meta.features[LEFT]["shape"] == (24, 32, 3)


def with_changes(vectors=None, embodiments=None, **fields) -> dict:
    """The test layout as a dict, with some vectors, embodiments and fields replaced."""
    base = LAYOUT.to_dict()
    base["vectors"].update(vectors or {})
    base["embodiments"].update(embodiments or {})
    return {**base, **fields}


@pytest.mark.parametrize(
    ("layout", "match"),
    [
        (
            with_changes(vectors={"observation.state": 8}),
            r"dataset 1 \(.*aloha\).*vector 'observation.state' has 14 dims, wider than its slot "
            "of 8",
        ),
        (
            with_changes(embodiments={"aloha": {"key_map": {HIGH: TOP, LEFT_WRIST: TOP}}}),
            r"aloha.*cameras 'observation.images.cam_high' and 'observation.images.cam_left_wrist'"
            r" are both mapped to slot 'observation.images.top'",
        ),
        (
            with_changes(embodiments={"pusht": {}}),
            r"pusht.*camera 'observation.image' has no slot in the layout",
        ),
        (
            with_changes(
                embodiments={
                    "pusht": {
                        "key_map": {
                            PUSHT_CAMERA: TOP,
                            "observation.state": None,
                            "frame_index": "observation.state",
                        }
                    }
                }
            ),
            r"pusht.*vector 'observation.state' \(its 'frame_index'\) is int64, which cannot be "
            "padded",
        ),
        (
            with_changes(vectors={"action": ["j0", "j1", "j2", "j3", "x", "y"]}),
            r"aloha.*vector 'action': names \['l0'.*are not in the slot's names",
        ),
        (
            with_changes(image_size=None),
            r"camera slot 'observation.images.top' has no one size .*give the layout an "
            "image_size",
        ),
        (
            with_changes(
                embodiments={"pusht": {"key_map": {PUSHT_CAMERA: TOP, "observation.imag": TOP}}}
            ),
            r"embodiment 'pusht': its key_map names \['observation.imag'\], which none of its "
            "datasets",
        ),
    ],
    ids=["wider", "camera-twice", "camera-unplaced", "int", "name", "sizes", "typo"],
)
def test_what_does_not_fit_is_refused_naming_the_dataset_and_the_key(roots, layout, match):
    with pytest.raises(ValueError, match=match):
        ShardedLeRobotDataset([roots[n] for n in ORDER], layout=layout)


def test_names_quantiles_and_deltas_that_cannot_apply_are_refused(roots, shards):
    with pytest.raises(ValueError, match=r"datasets \['arm'\] appear more than once by name"):
        ShardedLeRobotDataset(
            [DatasetRoot(roots["arm"], name="arm"), DatasetRoot(roots["aloha"], name="arm")],
            layout=LAYOUT,
        )
    # LeRobot 0.3.3 wrote no quantiles: normalising by them is refused, naming what is missing
    v21 = DatasetRoot(shards("v21_video"), embodiment="golden_arm")
    with pytest.raises(
        ValueError,
        match=r"v21_video.*vector 'action'.*normalize='quantiles' needs its stats \['q01', 'q99'\]",
    ):
        ShardedLeRobotDataset([roots["arm"], v21], layout=LAYOUT)
    with pytest.raises(ValueError, match=r"in both delta_timestamps and delta_indices"):
        ShardedLeRobotDataset(
            roots["arm"], delta_timestamps={"action": [0.0]}, delta_indices={"action": [0]}
        )


def test_layouts_are_checked_and_read_from_json_and_yaml(tmp_path):
    for bad, match in [
        ({"vectors": {"action": 0}}, "width must be a positive int"),
        ({"vectors": {"action": 4}, "normalize": "zscore"}, "unknown mode 'zscore'"),
        ({"vectors": {"action": 4}, "normalize": {"state": "mean_std"}}, "not vector keys"),
        ({"cameras": ["a", "a"]}, "camera slots must be distinct"),
        ({"vectors": {"a": 2}, "cameras": ["a"]}, "both camera slots and vector keys"),
        ({"vectors": {"action": 4}, "resize": "crop"}, "unknown resize policy 'crop'"),
        ({"vectors": {"action": 4}, "camera": ["a"]}, r"unknown keys \['camera'\]"),
        ({"vectors": {"action": ["a", "a"]}}, "names must be distinct"),
        ({"vectors": {"action": 4}, "embodiments": {"so100": {"dims": {"state": [0]}}}}, "dims of"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            TargetLayout.from_dict(bad)
    (tmp_path / "layout.json").write_text(json.dumps(LAYOUT.to_dict()))
    assert TargetLayout.load(tmp_path / "layout.json") == LAYOUT
    yaml = pytest.importorskip("yaml")
    (tmp_path / "layout.yaml").write_text(yaml.safe_dump(LAYOUT.to_dict()))
    assert TargetLayout.of(str(tmp_path / "layout.yaml")) == LAYOUT


def test_delta_indices_are_steps_with_lerobots_pad_masks(av1, golden_dir):
    """Steps at the dataset's own rate: at 10 fps, steps 0..3 are LeRobot's own items for
    ``delta_timestamps`` of 0.0..0.3 s (recorded by LeRobot 0.6.1), values and masks."""
    recorded = np.load(golden_dir / "av1_multifile.delta.items.npz")
    ds = ShardedLeRobotDataset(av1, delta_indices={"action": [0, 1, 2, 3]}, shuffle=False)
    for item in ds:
        i = int(item["index"])
        assert torch.equal(item["action"], torch.from_numpy(recorded[f"{i}|action"])), i
        assert torch.equal(item["action_is_pad"], torch.from_numpy(recorded[f"{i}|action_is_pad"]))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), width=st.integers(1, 12), steps=st.sampled_from([None, 1, 3]))
def test_a_vector_lands_in_its_slot_dims_and_nothing_else(data, width, steps):
    """Any source width, placed by any dims (the embodiment's), normalised or not: the slot
    dims hold the normalised values, every other dim exactly zero, the mask says which."""
    from lerobot_shards.reader.meta.placement import Placement

    n = data.draw(st.integers(1, width))
    dims = data.draw(st.permutations(range(width)))[:n]
    mode = data.draw(st.sampled_from([None, "mean_std", "quantiles"]))
    floats = st.floats(-100, 100, allow_nan=False, width=32)
    values = np.array(
        data.draw(st.lists(floats, min_size=n * (steps or 1), max_size=n * (steps or 1))),
        np.float32,
    )
    mean = np.array(data.draw(st.lists(floats, min_size=n, max_size=n)), np.float64)
    low = mean - 1
    stats = {
        "v": {
            "mean": mean,
            "std": np.full(n, 2.0),
            "q01": low,
            "q99": low + 4,
            "count": np.array([9]),
        }
    }
    layout = TargetLayout(vectors={"action": width}, normalize=mode,
                          embodiments={"e": Embodiment(dims={"action": dims})})  # fmt: skip
    placement = Placement(
        layout, key_map={"v": "action"}, features={"v": {"dtype": "float32", "shape": [n]}},
        stats=stats, steps={} if steps is None else {"action": steps}, slot_shapes={},
        return_uint8=True, dataset_index=0, name="d", embodiment="e", embodiment_index=0, where="d",
    )  # fmt: skip
    raw = torch.from_numpy(values.reshape(-1, n) if steps else values.reshape(n))
    item = {"action": raw}
    if steps:
        item["action_is_pad"] = torch.zeros(steps, dtype=torch.bool)
    out = placement.apply(item, None)
    got = out["action"].numpy()
    assert got.shape == ((steps,) if steps else ()) + (width,)
    want = raw.numpy().astype(np.float64)
    if mode == "mean_std":
        want = (want - mean) / (2.0 + 1e-8)
    elif mode == "quantiles":
        want = 2 * (want - low) / 4 - 1
    np.testing.assert_allclose(got[..., dims], want, rtol=1e-6, atol=1e-5)
    rest = [d for d in range(width) if d not in dims]
    assert (got[..., rest] == 0).all()
    assert out["action_mask"].tolist() == [d in dims for d in range(width)]
