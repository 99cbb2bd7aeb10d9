"""What the test-dataset factory writes into each frame and row: pure functions of the indices.

Tests recompute the expected content from ``(episode, frame)`` instead of storing it, so every
value a loader returns can be checked against what was written.

``"blocks"`` reproduces the golden LeRobot 0.6.1 recording pixel for pixel at its two camera
sizes: a gradient whose red ramp moves with the frame and whose green ramp moves with the episode,
plus the frame number (5 bits) and episode number (3 bits) drawn as 8x8 black/white blocks in
raster order from the top-left, least significant bit first. Blocks that large survive AV1 at
crf 30, so a decoder that returns the neighbouring frame is caught.

``"realistic"`` is for benchmarks (e.g. 480x640): a smooth textured scene with a slowly panning
background and a few moving shapes, so AV1 compresses it like camera video rather than like noise
or flat colour. The same code blocks sit in its top-left corner so decoded frames stay checkable.
"""

from __future__ import annotations

import functools

import numpy as np

CONTENTS = ("blocks", "realistic")
BLOCK = 8
FRAME_BITS = 5
EPISODE_BITS = 3
WHITE, BLACK = 240, 15


def state_value(episode: int, frame: int, dims: int = 4) -> np.ndarray:
    """``observation.state`` of a frame: ``100*episode + frame + j/4`` for j in 0..dims-1
    (4 by default, as the golden recording), float32."""
    return (100.0 * episode + frame + np.arange(dims) / 4.0).astype(np.float32)


def action_value(episode: int, frame: int, dims: int = 4) -> np.ndarray:
    """``action`` of a frame: the state (of ``dims`` dims) minus 0.25, float32."""
    return (state_value(episode, frame, dims) - np.float32(0.25)).astype(np.float32)


def frame_content(
    episode: int, frame: int, height: int, width: int, content: str = "blocks", seed: int = 0
) -> np.ndarray:
    """The HWC uint8 RGB image the factory encodes for this camera size, episode and frame.

    ``seed`` only varies the ``"realistic"`` scene; ``make_dataset`` passes its own seed.
    """
    if content == "blocks":
        image = _gradient(episode, frame, height, width)
    elif content == "realistic":
        image = _scene(episode, frame, height, width, seed)
    else:
        raise ValueError(f"unknown frame content {content!r}; expected one of {CONTENTS}")
    _draw_code(image, episode, frame)
    return image


def _gradient(episode: int, frame: int, height: int, width: int) -> np.ndarray:
    """Golden gradient; the blue level depends on the width so cameras of different sizes differ."""
    y = np.arange(height, dtype=np.int64)[:, None]
    x = np.arange(width, dtype=np.int64)[None, :]
    image = np.empty((height, width, 3), dtype=np.uint8)
    image[..., 0] = (4 * x + 7 * frame) % 256
    image[..., 1] = (5 * y + 30 * episode) % 256
    image[..., 2] = (220 - 5 * width // 2) % 256
    return image


def _draw_code(image: np.ndarray, episode: int, frame: int) -> None:
    """Frame bits then episode bits as BLOCKxBLOCK squares, raster order, LSB first."""
    height, width = image.shape[:2]
    per_row = width // BLOCK
    bits = [(frame >> i) & 1 for i in range(FRAME_BITS)]
    bits += [(episode >> i) & 1 for i in range(EPISODE_BITS)]
    for k, bit in enumerate(bits):
        row, col = divmod(k, per_row)
        if (row + 1) * BLOCK > height:
            break
        image[row * BLOCK : (row + 1) * BLOCK, col * BLOCK : (col + 1) * BLOCK] = (
            WHITE if bit else BLACK
        )


@functools.lru_cache(maxsize=8)
def _texture(height: int, width: int, seed: int) -> np.ndarray:
    """A static scene twice the frame size (so the view can pan): a wall over a table.

    Low-frequency shading plus fine low-contrast grain, muted colours; HWC uint8.
    """
    rng = np.random.default_rng(seed)
    h, w = 2 * height, 2 * width
    y = np.linspace(0.0, 1.0, h, dtype=np.float32)[:, None]
    x = np.linspace(0.0, 1.0, w, dtype=np.float32)[None, :]
    light = np.zeros((h, w), dtype=np.float32)
    for low, high, amplitude in ((0.5, 3.0, 0.08), (20.0, 60.0, 0.03)):
        for _ in range(3):
            fy, fx = rng.uniform(low, high, size=2)
            phase = rng.uniform(0.0, 2 * np.pi)
            light += amplitude * np.sin(2 * np.pi * (fy * y + fx * x) + phase)
    table = (y > 0.55).astype(np.float32)
    wall_tint = np.array([0.78, 0.76, 0.70], dtype=np.float32)
    table_tint = np.array([0.55, 0.40, 0.28], dtype=np.float32)
    tint = wall_tint * (1.0 - table)[..., None] + table_tint * table[..., None]
    scene = (0.85 + light)[..., None] * tint
    # Clutter: boxes with hard edges and a dark outline, some striped like printed packaging.
    for _ in range(14):
        bh, bw = (rng.uniform(0.04, 0.16, size=2) * (h, w)).astype(int) + 4
        top, left = rng.integers(0, h - bh), rng.integers(0, w - bw)
        colour = rng.uniform(0.15, 0.9, size=3).astype(np.float32)
        box = scene[top : top + bh, left : left + bw]
        box[...] = 0.25 * colour
        inner = box[2:-2, 2:-2]
        inner[...] = colour
        if rng.random() < 0.5:
            period = int(rng.integers(3, 9))
            inner[:, (np.arange(inner.shape[1]) // period) % 2 == 1] *= 0.7
    return (np.clip(scene, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def _scene(episode: int, frame: int, height: int, width: int, seed: int) -> np.ndarray:
    """Slowly panning background plus three moving soft-edged objects."""
    texture = _texture(height, width, seed)
    t = frame / 10.0
    dy = int((0.25 + 0.2 * np.sin(0.3 * t + episode)) * height)
    dx = int((0.25 + 0.2 * np.cos(0.2 * t + 2 * episode)) * width)
    image = texture[dy : dy + height, dx : dx + width].copy()
    rng = np.random.default_rng([seed, episode])
    for _ in range(3):
        cy, cx = rng.uniform(0.2, 0.8, size=2)
        ay, ax = rng.uniform(0.05, 0.2, size=2)
        wy, wx = rng.uniform(0.5, 2.0, size=2)
        radius = rng.uniform(0.06, 0.15) * min(height, width)
        colour = rng.uniform(20.0, 230.0, size=3).astype(np.float32)
        py = (cy + ay * np.sin(wy * t)) * height
        px = (cx + ax * np.cos(wx * t)) * width
        y0, y1 = max(int(py - radius) - 2, 0), min(int(py + radius) + 3, height)
        x0, x1 = max(int(px - radius) - 2, 0), min(int(px + radius) + 3, width)
        if y0 >= y1 or x0 >= x1:
            continue
        yy = np.arange(y0, y1, dtype=np.float32)[:, None] - py
        xx = np.arange(x0, x1, dtype=np.float32)[None, :] - px
        alpha = (np.clip(radius - np.sqrt(yy * yy + xx * xx), 0.0, 1.5) / 1.5)[..., None]
        patch = image[y0:y1, x0:x1].astype(np.float32)
        image[y0:y1, x0:x1] = (patch * (1.0 - alpha) + colour * alpha + 0.5).astype(np.uint8)
    return image
