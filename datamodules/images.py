"""2-D images generated in code or shipped with scikit-learn (and the hub's natural photos), the sources of
signal fitting and INR generation. No DataModule here: ``signal_ladder.py`` and ``image_sets.py`` build on them.

Sources (all offline but the hub, all deterministic functions of a seed):

- ``procedural_field(size, seed)``: a sum of random Gaussians, sinusoids and piecewise-constant shapes with
  sharp edges; the seed also draws how much each part weighs, so the spectra differ between seeds;
- ``sample_image(name, size, ...)``: scikit-learn's ``load_sample_image("china.jpg" | "flower.jpg")``
  (427 x 640 RGB) or matplotlib's sample photo ``grace_hopper.jpg`` (600 x 512 RGB), both shipped with the
  packages (need Pillow), as a grayscale 256 x 256 crop, area-resampled to ``size``;
- ``ellipse_phantom(size, seed)``: a Shepp-Logan-type phantom of ten ellipses (seed 0: the modified
  Shepp-Logan phantom; other seeds perturb centres, axes, angles and intensities), the ground truth of the
  MRI and CT analogs;
- ``shapes2d(n, size, seed)``: RGB images of 1-3 ellipses, rectangles and triangles on smooth colour
  gradients;
- ``digits_images(size)``: scikit-learn's 8 x 8 digits, bilinearly upsampled;
- ``hub_images(hub_id, size)``: a hub image set (by default the 24 Kodak photos) as grayscale centre crops;
  fails offline with one line naming the embedded default.

``area_resize`` resamples ``(H, W, C)`` images; ``require_pillow`` names the fix when Pillow is missing.
Pixel values are in [0, 1]; signals are ``(H, W, C)``, image sets ``(N, C, H, W)``.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from errors import ConfigError

SAMPLE_IMAGES = ("china", "flower", "grace_hopper")
SampleImage = Literal["china", "flower", "grace_hopper"]


def _grid(size: int, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """Pixel-centre coordinates in [0, 1]^2, ``(x, y)`` each (size, size), x along the width."""
    c = (torch.arange(size, dtype=dtype) + 0.5) / size
    yy, xx = torch.meshgrid(c, c, indexing="ij")
    return xx, yy


def procedural_field(size: int = 256, seed: int = 0, channels: int = 1) -> Tensor:
    """A random field ``(size, size, channels)`` in [0, 1]: Gaussians + sinusoids + sharp shapes.

    Per seed: 3-6 Gaussian bumps (widths 0.03-0.25), 1-3 plane sinusoids (2-16 cycles per image), 1-4
    constant shapes (discs, rectangles, triangles). The three parts are weighted by a Dirichlet draw, so
    one seed is mostly smooth and another mostly edges. Each channel is an independent draw.
    """
    if size < 2:
        raise ConfigError(f"size must be at least 2, got {size}")
    if channels < 1:
        raise ConfigError(f"channels must be positive, got {channels}")
    gen = torch.Generator().manual_seed(int(seed) * 7919 + 17)
    xx, yy = _grid(size, torch.float64)

    def u(*shape: int) -> Tensor:
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    out = []
    for _ in range(channels):
        g = -torch.log(u(3))
        weights = g / g.sum()
        smooth = torch.zeros(size, size, dtype=torch.float64)
        for _ in range(int(3 + 4 * u(1).item())):
            cx, cy, w = u(1), u(1), 0.03 + 0.22 * u(1)
            smooth += (2 * u(1) - 0.5) * torch.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * w**2))
        waves = torch.zeros_like(smooth)
        for _ in range(int(1 + 3 * u(1).item())):
            theta, freq, phase = math.pi * u(1), 2 + 14 * u(1), 2 * math.pi * u(1)
            waves += torch.cos(2 * math.pi * freq * (xx * torch.cos(theta) + yy * torch.sin(theta)) + phase)
        shapes = torch.zeros_like(smooth)
        for _ in range(int(1 + 4 * u(1).item())):
            shapes = torch.where(_shape_mask(xx, yy, gen), 2 * u(1) - 1, shapes)
        parts = [smooth, waves, shapes]
        field = sum(w * (p - p.mean()) / (p.std() + 1e-12) for w, p in zip(weights, parts))
        field = (field - field.min()) / (field.max() - field.min() + 1e-12)
        out.append(field)
    return torch.stack(out, -1).float()


def _shape_mask(xx: Tensor, yy: Tensor, gen: torch.Generator) -> Tensor:
    """A random disc/ellipse, rotated rectangle or triangle as a boolean mask on the grid (xx, yy)."""

    def u() -> float:
        return float(torch.rand((), generator=gen, dtype=torch.float64))

    kind = int(3 * u())
    cx, cy = 0.15 + 0.7 * u(), 0.15 + 0.7 * u()
    if kind == 0:  # ellipse
        a, b, t = 0.05 + 0.25 * u(), 0.05 + 0.25 * u(), math.pi * u()
        dx, dy = xx - cx, yy - cy
        xr, yr = dx * math.cos(t) + dy * math.sin(t), -dx * math.sin(t) + dy * math.cos(t)
        return (xr / a) ** 2 + (yr / b) ** 2 <= 1
    if kind == 1:  # rotated rectangle
        a, b, t = 0.05 + 0.25 * u(), 0.05 + 0.25 * u(), math.pi * u()
        dx, dy = xx - cx, yy - cy
        xr, yr = dx * math.cos(t) + dy * math.sin(t), -dx * math.sin(t) + dy * math.cos(t)
        return (xr.abs() <= a) & (yr.abs() <= b)
    # triangle: three vertices around the centre
    r = 0.08 + 0.25 * u()
    angles = [2 * math.pi * (u() + k / 3 + 0.1 * u()) for k in range(3)]
    pts = [(cx + r * math.cos(a), cy + r * math.sin(a)) for a in angles]
    signs = []
    for (x0, y0), (x1, y1) in zip(pts, pts[1:] + pts[:1]):
        signs.append((x1 - x0) * (yy - y0) - (y1 - y0) * (xx - x0))
    s = torch.stack(signs)
    return (s >= 0).all(0) | (s <= 0).all(0)


def require_pillow() -> None:
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise ConfigError(
            "scikit-learn's sample images need Pillow: pip install pillow, or use the procedural default "
            "(data.init_args.kind: procedural)"
        ) from None


@functools.lru_cache(maxsize=4)
def _photo(name: str) -> np.ndarray:
    """The decoded JPEG (H, W, 3) as float64 (decoded once per process): scikit-learn's (427, 640) or
    matplotlib's (600, 512)."""
    require_pillow()
    if name == "grace_hopper":
        from matplotlib import cbook, image

        with cbook.get_sample_data("grace_hopper.jpg") as f:
            out = np.asarray(image.imread(f), dtype=np.float64)
    else:
        from sklearn.datasets import load_sample_image

        out = np.asarray(load_sample_image(f"{name}.jpg"), dtype=np.float64)
    out.setflags(write=False)
    return out


def sample_image_shape(name: SampleImage) -> tuple[int, int]:
    """``(height, width)`` of the sample photo ``name`` in pixels."""
    if name not in SAMPLE_IMAGES:
        raise ConfigError(f"sample image must be one of {list(SAMPLE_IMAGES)}, got {name!r}")
    h, w = _photo(name).shape[:2]
    return h, w


def area_resize(img: Tensor, size: int) -> Tensor:
    """``(H, W, C)`` -> ``(size, size, C)`` by area averaging (antialiased bilinear when not a divisor)."""
    x = img.permute(2, 0, 1)[None]
    if x.shape[-1] == size and x.shape[-2] == size:
        return img
    if x.shape[-1] % size == 0 and x.shape[-2] % size == 0:
        x = F.adaptive_avg_pool2d(x, size)
    else:
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return x[0].permute(1, 2, 0)


def sample_image(name: SampleImage = "china", size: int = 256, crop: int = 256,
                 offset: tuple[int, int] | None = None) -> Tensor:
    """A sample photo shipped with a package as grayscale ``(size, size, 1)`` in [0, 1].

    Args:
        name: ``"china"`` or ``"flower"`` (427 x 640 RGB JPEGs shipped with scikit-learn) or
            ``"grace_hopper"`` (600 x 512, shipped with matplotlib).
        size: output side (area-resampled from the crop).
        crop: side of the square crop, at most the photo's shorter side.
        offset: ``(row, col)`` of the crop's top-left corner (default: centred).
    """
    if name not in SAMPLE_IMAGES:
        raise ConfigError(f"sample image must be one of {list(SAMPLE_IMAGES)}, got {name!r}")
    rgb = torch.tensor(_photo(name)) / 255.0
    h, w = rgb.shape[:2]
    if not 2 <= crop <= min(h, w):
        raise ConfigError(f"crop must be in [2, {min(h, w)}], got {crop}")
    r0, c0 = offset if offset is not None else ((h - crop) // 2, (w - crop) // 2)
    if not (0 <= r0 <= h - crop and 0 <= c0 <= w - crop):
        raise ConfigError(f"crop offset {(r0, c0)} leaves the {h} x {w} image")
    gray = rgb[r0 : r0 + crop, c0 : c0 + crop] @ torch.tensor([0.299, 0.587, 0.114], dtype=torch.float64)
    return area_resize(gray[..., None], size).float().clamp(0, 1)


# Modified Shepp-Logan (Toft): intensity, semi-axes a, b, centre x0, y0, rotation in degrees.
_SHEPP_LOGAN = [
    (1.0, 0.69, 0.92, 0.0, 0.0, 0.0),
    (-0.8, 0.6624, 0.874, 0.0, -0.0184, 0.0),
    (-0.2, 0.11, 0.31, 0.22, 0.0, -18.0),
    (-0.2, 0.16, 0.41, -0.22, 0.0, 18.0),
    (0.1, 0.21, 0.25, 0.0, 0.35, 0.0),
    (0.1, 0.046, 0.046, 0.0, 0.1, 0.0),
    (0.1, 0.046, 0.046, 0.0, -0.1, 0.0),
    (0.1, 0.046, 0.023, -0.08, -0.605, 0.0),
    (0.1, 0.023, 0.023, 0.0, -0.606, 0.0),
    (0.1, 0.023, 0.046, 0.06, -0.605, 0.0),
]


def ellipse_phantom(size: int = 256, seed: int = 0, jitter: float = 0.3) -> Tensor:
    """A Shepp-Logan-type phantom ``(size, size, 1)`` in [0, 1], inside the inscribed disc.

    Seed 0 is the modified Shepp-Logan phantom; any other seed scales the inner ellipses' axes, shifts their
    centres and angles and rescales their intensities by up to ``jitter`` (relative), so that phantoms
    differ while keeping the head-like structure (skull, brain, ventricles, small lesions).
    """
    if size < 2:
        raise ConfigError(f"size must be at least 2, got {size}")
    gen = torch.Generator().manual_seed(int(seed) * 104729 + 3)
    c = (torch.arange(size, dtype=torch.float64) + 0.5) / size * 2 - 1
    yy, xx = torch.meshgrid(-c, c, indexing="ij")  # y up, as in the phantom's definition
    img = torch.zeros(size, size, dtype=torch.float64)
    for k, (rho, a, b, x0, y0, deg) in enumerate(_SHEPP_LOGAN):
        if seed != 0 and k >= 2:
            j = (2 * torch.rand(6, generator=gen, dtype=torch.float64) - 1) * jitter
            rho, a, b = rho * (1 + j[0]), a * (1 + j[1]), b * (1 + j[2])
            x0, y0, deg = x0 + 0.5 * j[3] * a, y0 + 0.5 * j[4] * b, deg + 60 * j[5]
        t = math.radians(float(deg))
        dx, dy = xx - x0, yy - y0
        xr, yr = dx * math.cos(t) + dy * math.sin(t), -dx * math.sin(t) + dy * math.cos(t)
        img += rho * ((xr / a) ** 2 + (yr / b) ** 2 <= 1)
    img = img.clamp(min=0)
    return (img / img.max()).float()[..., None]


def shapes2d(n: int, size: int = 32, seed: int = 0, min_shapes: int = 1, max_shapes: int = 3) -> Tensor:
    """``n`` RGB images ``(n, 3, size, size)`` in [0, 1]: 1-3 shapes on a smooth colour gradient.

    Background: a linear gradient between two random colours along a random direction. Shapes (painted in
    order, later on top): ellipses, rotated rectangles and triangles of random colour, centre and size.
    """
    if n < 1 or size < 4:
        raise ConfigError(f"shapes2d needs n >= 1 and size >= 4, got n={n}, size={size}")
    if not 1 <= min_shapes <= max_shapes:
        raise ConfigError(f"need 1 <= min_shapes <= max_shapes, got {min_shapes}, {max_shapes}")
    gen = torch.Generator().manual_seed(int(seed) * 15485863 + 11)

    def u(*shape: int) -> Tensor:
        return torch.rand(*shape, generator=gen)

    # every random number first, in the order of one pass over all n images, then the painting in chunks:
    # the same images for any chunk size, and the (chunk, S, S) temporaries stay in cache
    theta = 2 * math.pi * u(n, 1, 1)
    c0, c1 = u(n, 3, 1, 1), u(n, 3, 1, 1)
    count = min_shapes + (u(n) * (max_shapes - min_shapes + 1)).long().clamp(max=max_shapes - min_shapes)
    slots = []
    for _ in range(max_shapes):
        kind = (u(n) * 3).long().clamp(max=2)
        cx, cy = (0.2 + 0.6 * u(n, 1, 1)), (0.2 + 0.6 * u(n, 1, 1))
        a, b, t = 0.08 + 0.22 * u(n, 1, 1), 0.08 + 0.22 * u(n, 1, 1), math.pi * u(n, 1, 1)
        slots.append((kind, cx, cy, a, b, t, u(n, 3, 1, 1)))
    xx, yy = _grid(size)
    xx, yy = xx[None], yy[None]  # (1, S, S)
    chunk = max(1, 2**18 // (size * size))
    return torch.cat([_paint_shapes(xx, yy, theta[i : i + chunk], c0[i : i + chunk], c1[i : i + chunk],
                                    count[i : i + chunk], [tuple(v[i : i + chunk] for v in sl) for sl in slots])
                      for i in range(0, n, chunk)])


def _paint_shapes(xx: Tensor, yy: Tensor, theta: Tensor, c0: Tensor, c1: Tensor, count: Tensor,
                  slots: list[tuple[Tensor, ...]]) -> Tensor:
    """``shapes2d``'s images from their drawn parameters: the gradient, then each slot's shape on top."""
    ramp = (xx - 0.5) * torch.cos(theta) + (yy - 0.5) * torch.sin(theta)
    ramp = (ramp / math.sqrt(2) + 0.5).clamp(0, 1)[:, None]  # (n, 1, S, S)
    img = c0 + (c1 - c0) * ramp
    for slot, (kind, cx, cy, a, b, t, colour) in enumerate(slots):
        dx, dy = xx - cx, yy - cy
        xr, yr = dx * torch.cos(t) + dy * torch.sin(t), -dx * torch.sin(t) + dy * torch.cos(t)
        ellipse = (xr / a) ** 2 + (yr / b) ** 2 <= 1
        rect = (xr.abs() <= a) & (yr.abs() <= b)
        # triangle with vertices at angles t, t + 2pi/3, t + 4pi/3 (radius a..b mix)
        signs = []
        verts = [(cx + a * torch.cos(t + 2 * math.pi * k / 3), cy + b * torch.sin(t + 2 * math.pi * k / 3))
                 for k in range(3)]
        for (x0, y0), (x1, y1) in zip(verts, verts[1:] + verts[:1]):
            signs.append((x1 - x0) * (yy - y0) - (y1 - y0) * (xx - x0))
        s = torch.stack(signs)
        tri = (s >= 0).all(0) | (s <= 0).all(0)
        mask = torch.where(kind[:, None, None] == 0, ellipse, torch.where(kind[:, None, None] == 1, rect, tri))
        mask = mask & (slot < count)[:, None, None]
        img = torch.where(mask[:, None], colour, img)
    return img.clamp(0, 1)


def digits_images(size: int = 16) -> Tensor:
    """scikit-learn's 1797 digits as ``(1797, 1, size, size)`` in [0, 1], bilinearly upsampled from 8 x 8."""
    from sklearn.datasets import load_digits

    x = torch.from_numpy(load_digits().data).float().view(-1, 1, 8, 8) / 16.0
    if size != 8:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x.clamp(0, 1)


KODAK_HUB_ID = "Freed-Wu/kodak"  # the 24 Kodak photos (768 x 512 RGB), split "test", column "image"
HUB_DEFAULT = "configs/compression_error/grid_ladder.yaml (procedural fields + scikit-learn's photos, kind: mixed)"


def hub_images(hub_id: str = KODAK_HUB_ID, size: int = 256, split: str = "test", column: str = "image") -> Tensor:
    """Every image of a hub image set as grayscale ``(N, size, size, 1)`` in [0, 1]: the centred square crop
    of the shorter side, area-resampled (the paper-scale natural images; fails offline with one line naming
    the embedded default)."""
    from datamodules.hub import load_hub_dataset

    require_pillow()
    ds = load_hub_dataset(hub_id, HUB_DEFAULT, split=split)
    if column not in ds.column_names:
        raise ConfigError(f"hub data set {hub_id!r} has no column {column!r} (columns: {ds.column_names})")
    out = []
    for img in ds[column]:
        rgb = torch.tensor(np.asarray(img.convert("RGB"), dtype=np.float64)) / 255.0
        h, w = rgb.shape[:2]
        c = min(h, w)
        r0, c0 = (h - c) // 2, (w - c) // 2
        gray = rgb[r0 : r0 + c, c0 : c0 + c] @ torch.tensor([0.299, 0.587, 0.114], dtype=torch.float64)
        out.append(area_resize(gray[..., None], size).float().clamp(0, 1))
    return torch.stack(out)


__all__ = [
    "HUB_DEFAULT",
    "KODAK_HUB_ID",
    "SAMPLE_IMAGES",
    "area_resize",
    "digits_images",
    "ellipse_phantom",
    "hub_images",
    "procedural_field",
    "require_pillow",
    "sample_image",
    "shapes2d",
]
