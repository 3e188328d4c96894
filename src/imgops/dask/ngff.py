"""Minimal OME-NGFF 0.4 multiscale metadata (one level) for the stores imgops.dask writes, and
reading the image array out of an OME-Zarr (0.4 or 0.5) group.

Kept here until `imgops.io.zarr_io` (the single-process OME-Zarr writer) is on main; then the
volume path should take its metadata from there (one definition of the metadata).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

NGFF_VERSION = "0.4"
_SPACE_UNITS = {"micrometer", "nanometer", "millimeter", "meter", "angstrom"}
_DEFAULT_AXES = {
    2: ("y", "x"),
    3: ("z", "y", "x"),
    4: ("c", "z", "y", "x"),
    5: ("t", "c", "z", "y", "x"),
}
_AXIS_TYPES = {"t": "time", "c": "channel", "z": "space", "y": "space", "x": "space"}


def default_axes(ndim: int) -> list[dict[str, Any]]:
    """NGFF axes for an array of `ndim` dims (2..5), innermost x."""
    if ndim not in _DEFAULT_AXES:
        raise ValueError(f"OME-Zarr images have 2 to 5 dimensions, got {ndim}")
    return [{"name": name, "type": _AXIS_TYPES[name]} for name in _DEFAULT_AXES[ndim]]


def multiscales(
    ndim: int,
    *,
    axes: Sequence[dict[str, Any]] | None = None,
    scale: Sequence[float] | None = None,
    name: str = "image",
    path: str = "0",
) -> list[dict[str, Any]]:
    """The "multiscales" attribute of a one-level NGFF 0.4 image whose array is at `path`."""
    axes = list(axes) if axes is not None else default_axes(ndim)
    if len(axes) != ndim:
        raise ValueError(f"{len(axes)} axes for an array of {ndim} dimensions")
    scale = [float(s) for s in scale] if scale is not None else [1.0] * ndim
    if len(scale) != ndim:
        raise ValueError(f"{len(scale)} scale factors for an array of {ndim} dimensions")
    return [
        {
            "version": NGFF_VERSION,
            "name": name,
            "axes": axes,
            "datasets": [
                {"path": path, "coordinateTransformations": [{"type": "scale", "scale": scale}]}
            ],
        }
    ]


def image_metadata(attrs: dict[str, Any]) -> dict[str, Any] | None:
    """The first multiscale of a group's attributes (NGFF 0.4 top level, 0.5 under "ome")."""
    entry = attrs.get("multiscales")
    if entry is None and isinstance(attrs.get("ome"), dict):
        entry = attrs["ome"].get("multiscales")
    if not entry or not isinstance(entry, list) or not isinstance(entry[0], dict):
        return None
    return entry[0]


def full_resolution(meta: dict[str, Any]) -> tuple[str, list[dict[str, Any]] | None, list | None]:
    """(path, axes, scale) of the first (full-resolution) dataset of one multiscale."""
    datasets = meta.get("datasets") or []
    if not datasets or "path" not in datasets[0]:
        raise ValueError("the OME-Zarr multiscales lists no dataset")
    first = datasets[0]
    scale = None
    for transform in first.get("coordinateTransformations", []):
        if transform.get("type") == "scale":
            scale = transform.get("scale")
    axes = meta.get("axes")
    if axes is not None and axes and isinstance(axes[0], str):  # NGFF 0.3: names only
        axes = [{"name": a, "type": _AXIS_TYPES.get(a, "space")} for a in axes]
    return str(first["path"]), axes, scale
