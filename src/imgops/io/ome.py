"""OME metadata: physical sizes and channel names from OME-XML, the XML rewritten for a new
pixel type, and OME-NGFF (OME-Zarr) multiscales/omero attributes."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

__all__ = [
    "ngff_attributes",
    "ome_channel_names",
    "ome_physical_sizes",
    "ome_xml_for_output",
]

# OME-XML pixel types by numpy dtype name (OME has no float16).
OME_PIXEL_TYPES = {
    "uint8": "uint8",
    "uint16": "uint16",
    "int16": "int16",
    "uint32": "uint32",
    "int32": "int32",
    "float32": "float",
    "float64": "double",
}
_UNIT_WORDS = {
    "µm": "micrometer",
    "um": "micrometer",
    "nm": "nanometer",
    "mm": "millimeter",
    "micron": "micrometer",
    "cm": "centimeter",
    "m": "meter",
    "s": "second",
    "ms": "millisecond",
    "sec": "second",
}


def _pixels(root: ET.Element) -> ET.Element | None:
    for element in root.iter():
        if element.tag.endswith("}Pixels") or element.tag == "Pixels":
            return element
    return None


def ome_physical_sizes(ome_xml: str | None) -> dict[str, Any]:
    """PhysicalSizeX/Y/Z (and their units) of the first OME Pixels element, if any."""
    if not ome_xml:
        return {}
    try:
        pixels = _pixels(ET.fromstring(ome_xml))
    except ET.ParseError:
        return {}
    sizes: dict[str, Any] = {}
    for key, value in pixels.attrib.items() if pixels is not None else ():
        if key.startswith("PhysicalSize") or key in ("TimeIncrement", "TimeIncrementUnit"):
            try:
                sizes[key] = value if key.endswith("Unit") else float(value)
            except ValueError:
                continue
    return sizes


def ome_channel_names(ome_xml: str | None) -> list[str]:
    """The Name of each Channel of the first image (empty strings where unnamed)."""
    if not ome_xml:
        return []
    try:
        pixels = _pixels(ET.fromstring(ome_xml))
    except ET.ParseError:
        return []
    if pixels is None:
        return []
    return [c.get("Name", "") for c in pixels if c.tag.endswith("Channel")]


def ome_xml_for_output(
    ome_xml: str,
    dtype: str,
    file_name: str,
    *,
    sizes: dict[str, int] | None = None,
    physical: dict[str, Any] | None = None,
) -> str | None:
    """The input's OME-XML with the pixel type set to `dtype` and the file named `file_name`.

    Everything else (channels, planes, instrument, annotations, TiffData) is kept as it was:
    the output's pages are written in the input's order, so TiffData still points at them.
    When `sizes` (axis -> length) differ from the XML's (a binned output), SizeX/Y/Z/C/T and
    `physical` sizes are updated, Plane elements dropped and one TiffData maps every page.
    None when the XML cannot describe the output (several images, or a type OME lacks).
    """
    kind = OME_PIXEL_TYPES.get(dtype)
    if kind is None:
        return None
    try:
        root = ET.fromstring(ome_xml)
    except ET.ParseError:
        return None
    images = [e for e in root if e.tag.endswith("}Image") or e.tag == "Image"]
    pixels = _pixels(root)
    if len(images) != 1 or pixels is None:
        return None
    pixels.set("Type", kind)
    if "SignificantBits" in pixels.attrib:
        pixels.set("SignificantBits", str(8 * (8 if kind == "double" else 4)))
    pixels.attrib.pop("BigEndian", None)
    if sizes and any(pixels.get(f"Size{a}") != str(n) for a, n in sizes.items() if a in "XYZCT"):
        for axis, length in sizes.items():
            if axis in "XYZCT":
                pixels.set(f"Size{axis}", str(length))
        for key, value in (physical or {}).items():
            if key.startswith("PhysicalSize") and not key.endswith("Unit"):
                pixels.set(key, repr(float(value)))
        planes = 1
        for axis in "ZCT":
            planes *= int(pixels.get(f"Size{axis}", "1"))
        for child in list(pixels):
            if child.tag.endswith("Plane") or child.tag.endswith("TiffData"):
                pixels.remove(child)
        namespace = re.match(r"\{(.*)\}", pixels.tag)
        tag = f"{{{namespace.group(1)}}}TiffData" if namespace else "TiffData"
        ET.SubElement(pixels, tag, {"IFD": "0", "PlaneCount": str(planes)})
    for element in root.iter():
        if element.tag.endswith("}UUID") and element.get("FileName"):
            element.set("FileName", file_name)
    namespace = re.match(r"\{(.*)\}", root.tag)
    if namespace:
        ET.register_namespace("", namespace.group(1))
    text = ET.tostring(root, encoding="unicode")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + text


def _ngff_unit(unit: str | None) -> str | None:
    if not unit:
        return None
    word = _UNIT_WORDS.get(unit.strip(), unit.strip().lower())
    return word if re.fullmatch(r"[a-z]+", word) else None


def ngff_attributes(
    *,
    axes: str,
    scales: list[list[float]],
    units: dict[str, str | None],
    windows: list[tuple[float, float]] | None,
    channel_names: list[str] | None,
    name: str,
    version: str = "0.5",
) -> dict[str, Any]:
    """OME-NGFF image attributes: `multiscales` (axes, one dataset per level with its scale)
    and `omero` channel windows, for NGFF 0.4 (zarr v2 .zattrs) or 0.5 (zarr v3 "ome" key)."""
    kinds = {"T": "time", "C": "channel", "Z": "space", "Y": "space", "X": "space"}
    axis_list = []
    for axis in axes:
        entry: dict[str, Any] = {"name": axis.lower(), "type": kinds[axis]}
        unit = _ngff_unit(units.get(axis))
        if unit and axis != "C":
            entry["unit"] = unit
        axis_list.append(entry)
    datasets = [
        {"path": str(level), "coordinateTransformations": [{"type": "scale", "scale": scale}]}
        for level, scale in enumerate(scales)
    ]
    multiscales: dict[str, Any] = {"axes": axis_list, "datasets": datasets, "name": name}
    if version == "0.4":
        multiscales["version"] = "0.4"
    attrs: dict[str, Any] = {"multiscales": [multiscales]}
    if windows is not None:
        channels = []
        for index, (low, high) in enumerate(windows):
            channels.append(
                {
                    "label": (channel_names or [])[index]
                    if channel_names and index < len(channel_names) and channel_names[index]
                    else f"channel {index}",
                    "active": True,
                    "color": "FFFFFF",
                    "window": {"start": low, "end": high, "min": low, "max": high},
                }
            )
        omero: dict[str, Any] = {"channels": channels, "rdefs": {"model": "greyscale"}}
        if version == "0.4":
            omero["version"] = "0.4"
        attrs["omero"] = omero
    if version == "0.4":
        return attrs
    return {"ome": {"version": "0.5", **attrs}}
