"""Rich tables for `imgops bench` results (stdout); JSON is produced by the callers."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def kernel_table(report: dict[str, Any]) -> Table:
    """One row per implementation and case: median time, GB/s, % of copy, ratio to the extension."""
    env = report["environment"]
    title = (
        f"imgops {env['imgops']} kernels - torch {env['torch']}, OpenCV {env['opencv']}, "
        f"{env['cpu_threads']} CPU threads (OpenCV: {env['opencv_threads']})"
    )
    if env.get("gpu"):
        title += f", {env['gpu']}"
    table = Table(title=title, title_justify="left")
    for column in ("device", "op", "case", "impl"):
        table.add_column(column)
    for column in ("median ms", "GB/s", "% copy", "x imgops time", "check"):
        table.add_column(column, justify="right")
    for result in report["results"]:
        check = result["verified"] if not result["error"] else f"[red]{result['error']}[/red]"
        table.add_row(
            result["device"],
            result["op"],
            result["case"],
            result["impl"],
            _num(result["median_ms"], ".3f"),
            _num(result["gbps"], ".1f"),
            _num(result["pct_of_copy"], ".0f"),
            _num(result["vs_imgops"], ".2f"),
            check,
        )
    for device, copy in report["copy"].items():
        table.caption = (table.caption or "") + (
            f"{device} copy: {copy['gbps']:.1f} GB/s ({copy['bytes'] / 2**20:.0f} MiB, "
            f"read + write).  "
        )
    return table


def pipeline_table(report: dict[str, Any]) -> Table:
    """One row per tool: wall time, files/s, output bytes, ratio to the OpenCV pool, stages."""
    table = Table(
        title=f"{report['files']} files from {report['input_dir']} "
        f"({report['input_bytes']:,} bytes), {report['cpu_count']} CPUs, "
        f"median of {report['reps']} run(s)",
        title_justify="left",
    )
    table.add_column("tool")
    for column in ("wall s", "files/s", "output bytes", "x pool files/s", "check"):
        table.add_column(column, justify="right")
    table.add_column("stages / notes")
    for run in report["runs"]:
        stages = run.get("stages") or {}
        notes = ", ".join(f"{name} {share:.0%}" for name, share in stages.items())
        if run.get("decoders"):
            notes += f"; decoders {run['decoders']}"
        if run.get("note"):
            notes += run["note"]
        table.add_row(
            run["tool"],
            _num(run["wall_s"], ".2f"),
            _num(run["files_per_s"], ".1f"),
            "-" if run.get("output_bytes") is None else f"{run['output_bytes']:,}",
            _num(run.get("vs_pool"), ".2f"),
            run.get("check") or (f"[red]{run['error']}[/red]" if run.get("error") else ""),
            notes or "-",
        )
    return table


def crossover_table(report: dict[str, Any]) -> Table:
    """One row per batch size: imgops gray wall seconds on cpu and cuda, and which wins."""
    table = Table(
        title=f"imgops gray cpu vs cuda on the first N files of {report['input_dir']}, "
        f"median of {report['reps']}; crossover: {report['crossover_files'] or 'not reached'}",
        title_justify="left",
    )
    for column in ("files", "cpu s", "cuda s", "faster"):
        table.add_column(column, justify="right")
    for row in report["rows"]:
        faster = "cuda" if row["cuda_s"] < row["cpu_s"] else "cpu"
        table.add_row(str(row["files"]), f"{row['cpu_s']:.2f}", f"{row['cuda_s']:.2f}", faster)
    return table


def print_table(table: Table) -> None:
    """Prints a table on stdout, wide enough not to wrap the numbers."""
    Console(width=max(Console().width, 160)).print(table)
