"""`imgops bench`: kernel GB/s against a copy and peers; whole batches against OpenCV."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..cli_common import ImgopsCommand, ImgopsError, Reporter, quiet_option


def _devices(choice: str) -> list:
    import torch

    from .. import _extension
    from ..errors import ImgopsError

    cuda_ok = torch.cuda.is_available() and bool(_extension.load().get("cuda_kernels"))
    if choice == "cpu":
        return [torch.device("cpu")]
    if choice == "cuda" and not cuda_ok:
        raise ImgopsError("--device cuda: no CUDA GPU or no CUDA kernels (run `imgops doctor`)")
    if choice == "cuda":
        return [torch.device("cuda")]
    return [torch.device("cpu")] + ([torch.device("cuda")] if cuda_ok else [])


@click.command(cls=ImgopsCommand, context_settings={"max_content_width": 100})
@click.option(
    "--device",
    type=click.Choice(["cpu", "cuda", "all"]),
    default="all",
    show_default=True,
    help="Where to time the kernels (all: CPU, and CUDA when present).",
)
@click.option("--quick", is_flag=True, help="Small sizes and few repetitions (a smoke test).")
@click.option("--no-compile", is_flag=True, help="Skip torch.compile (slow to start).")
@click.option("--reps", type=click.IntRange(min=3), help="Repetitions per measurement.")
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    help="CPU threads for torch and OpenCV  [default: torch's default]",
)
@click.option(
    "--pipeline",
    "pipeline_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    metavar="DIR",
    help="Instead: time `imgops gray` (cpu, and cuda with a GPU) on the images in DIR against "
    "an OpenCV process pool, with the CPU and GPU decode floors.",
)
@click.option("--png-level", type=click.IntRange(0, 9), help="--png-level passed to imgops gray.")
@click.option(
    "--gray-device",
    default="all",
    show_default=True,
    help="With --pipeline: the --device values to time (all: cpu, and cuda with a GPU).",
)
@click.option("--jpg", is_flag=True, help="With --pipeline: also time JPEG output (-f jpg).")
@click.option(
    "--fsync/--no-fsync",
    default=True,
    show_default=True,
    help="With --pipeline: whether imgops gray flushes each file to disk (the OpenCV pool "
    "never does; --no-fsync compares like with like).",
)
@click.option(
    "--server",
    is_flag=True,
    help="With --pipeline: also time each imgops gray relayed to an `imgops serve` started for "
    "the run (GPU kept warm), after one untimed run: a process that stays up.",
)
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="With --pipeline: files per nvImageCodec call for the GPU decode floor.",
)
@click.option(
    "--crossover",
    "crossover_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    metavar="DIR",
    help="Instead: imgops gray cpu vs cuda on the first N files of DIR for growing N (the "
    "batch size from which --device auto picks CUDA).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (for machines) instead of tables."
)
@quiet_option
def bench(
    device: str,
    quick: bool,
    no_compile: bool,
    reps: int | None,
    threads: int | None,
    pipeline_dir: Path | None,
    png_level: int | None,
    gray_device: str,
    jpg: bool,
    fsync: bool,
    server: bool,
    batch: int,
    crossover_dir: Path | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Measure imgops against its peers on this machine; medians, ratios, % of copy bandwidth.

    Kernels: each op on fresh random inputs, the extension next to the torch reference (eager
    and torch.compile) and OpenCV's cvtColor on the same number of threads; time, GB/s (bytes
    read + written) and % of a plain copy measured in the same run. Each output is checked
    against the reference before it is timed.

    Pipeline (--pipeline DIR): `imgops gray` over DIR's images on the CPU and on CUDA (with a
    GPU) against an OpenCV script with a process pool over all cores, and two floors: OpenCV's
    decode alone in the same pool, and nvImageCodec's batched GPU decode alone. Wall time,
    files/s, output bytes, the ratio to the pool. --server adds the same runs relayed to a
    warm `imgops serve`.

    \b
    $ imgops bench
    $ imgops bench --device cuda --json > kernels.json
    $ imgops bench --quick --no-compile --device cpu
    $ imgops bench --pipeline photos/ --reps 3 --jpg
    $ imgops bench --pipeline photos/ --server --no-fsync
    $ imgops bench --crossover photos/
    """
    from ..bench.report import crossover_table, kernel_table, pipeline_table, print_table

    reporter = Reporter(quiet=quiet)
    if crossover_dir is not None:
        from ..bench.pipeline import run_crossover

        reporter.info(f"imgops bench: cpu vs cuda over growing batches of {crossover_dir} ...")
        try:
            result = run_crossover(crossover_dir, reps=reps or (1 if quick else 3))
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--crossover") from None
        if as_json:
            click.echo(json.dumps(result, indent=2))
        else:
            print_table(crossover_table(result))
        return
    if pipeline_dir is not None:
        from ..bench.pipeline import run_pipeline

        reporter.info(f"imgops bench: timing batches over {pipeline_dir} ...")
        try:
            result = run_pipeline(
                pipeline_dir,
                reps=reps or (1 if quick else 3),
                device=gray_device,
                png_level=png_level,
                jpg=jpg,
                batch=batch,
                durable=fsync,
                server=server,
            )
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--pipeline") from None
        except RuntimeError as error:  # the server did not start
            raise ImgopsError(str(error)) from None
        if as_json:
            click.echo(json.dumps(result, indent=2))
        else:
            print_table(pipeline_table(result))
        return

    from ..bench.kernels import Settings, run_kernels

    settings = Settings(quick=quick, compile=not no_compile, reps=reps or 0, threads=threads or 0)
    report = run_kernels(_devices(device), settings, progress=reporter.info).to_json()
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        print_table(kernel_table(report))
    if any(r["error"] for r in report["results"]):
        reporter.error("some implementations failed or disagreed with the reference (see table)")
        raise SystemExit(1)
