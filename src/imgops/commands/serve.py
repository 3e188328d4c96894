"""`imgops serve`: a process that stays warm, so that later `imgops gray`, `bin` and `normvol`
calls (with IMGOPS_SERVER set) skip the start-up: the imports, and on a GPU the CUDA context,
nvImageCodec's decoder and the pinned buffers. The socket and the relaying are imgops.serve's;
this command warms up, binds, serves and reports."""

from __future__ import annotations

import sys
import time

import click

from ..cli_common import ImgopsCommand, ImgopsError, quiet_option, verbose_option


@click.command(cls=ImgopsCommand, context_settings={"max_content_width": 100})
@click.option(
    "--socket",
    "socket_path",
    metavar="PATH",
    default=None,
    help="The Unix socket to listen on.  [default: IMGOPS_SERVER's path if it names one, else "
    "$XDG_RUNTIME_DIR/imgops/server.sock or /tmp/imgops-UID/server.sock]",
)
@click.option(
    "--device",
    default="auto",
    show_default=True,
    metavar="auto|cpu|cuda[:N]",
    help="The GPU to keep warm: auto = GPU 0 where the CUDA engine and nvImageCodec can run "
    "there, cpu = none (the imports stay warm all the same).",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(min=0),
    default=1800,
    show_default=True,
    metavar="SECONDS",
    help="Stop after this long without a command (0: never).",
)
@click.option("--detach", is_flag=True, help="Start the server in the background and return "
              "once it answers (its messages go to the socket's path + .log).")  # fmt: skip
@click.option("--status", "action", flag_value="status", help="Say whether a server answers "
              "on the socket (its process, commands run, warm GPUs); exit 1 if none.")  # fmt: skip
@click.option("--stop", "action", flag_value="stop", help="Stop the server on the socket "
              "(after its command in progress); exit 1 if none answers.")  # fmt: skip
@quiet_option
@verbose_option
def serve(
    socket_path: str | None,
    device: str,
    idle_timeout: float,
    detach: bool,
    action: str | None,
    quiet: bool,
    verbose: bool,
) -> None:
    """Keep imgops warm for later commands: they run here, without the start-up.

    Start it once (in the background, or in another terminal), then set IMGOPS_SERVER in the
    shell that runs imgops: `imgops gray`, `bin` and `normvol` are then run by the server, in the
    caller's folder, with the caller's IMGOPS_* settings and umask, their output and exit status
    sent back; Ctrl-C stops the command as it would here. Commands that use stdin or stdout
    (`-`) run in the calling process, as does everything where no server answers (after a
    one-line note). One command runs at a time; others wait their turn.

    A GPU kept warm holds its CUDA context, nvImageCodec's decoder and up to 2 GiB of pinned
    host memory while the server lives; `--device auto` sends a batch of any size to a warm
    GPU. `imgops serve --stop`, Ctrl-C, SIGTERM or the idle timeout stop the server.

    \b
    $ imgops serve --detach            # or: imgops serve &
    $ export IMGOPS_SERVER=1
    $ imgops gray photos/ -d gray/
    $ imgops serve --status
    $ imgops serve --stop
    """
    import os
    import socket

    from ..serve import protocol
    from ..serve.server import Server, ServerBusy

    if not hasattr(socket, "AF_UNIX"):
        raise ImgopsError("imgops serve needs Unix sockets, which this system lacks")

    named = socket_path if socket_path is not None else os.environ.get(protocol.SERVER_VARIABLE)
    path = protocol.server_socket_path(named) or protocol.default_socket_path()

    def say(line: str) -> None:
        if not quiet:
            click.echo(f"imgops serve: {line}", err=True)

    if action is not None:
        from ..serve.client import control

        status = control(path, action)
        if status is None:
            raise ImgopsError(f"no imgops server answers at {path}")
        gpus = ", ".join(f"GPU {i}" for i in status["warm_gpus"]) or "no GPU"
        done = "asked to stop" if action == "stop" else "up"
        click.echo(f"imgops serve at {path}: {done} (pid {status['pid']}, imgops "
                   f"{status['version']}, {status['commands']} command(s) in "
                   f"{status['seconds_up']:g} s, {gpus} warm)")  # fmt: skip
        return

    if detach:
        pid, log_path = _detach(path, device, idle_timeout, verbose)
        say(f"ready at {path} (pid {pid}, messages in {log_path}); in the calling shell: "
            f"export {protocol.SERVER_VARIABLE}={_variable(path)}")  # fmt: skip
        return

    def log(line: str) -> None:
        if verbose and not quiet:
            click.echo(f"imgops serve: {time.strftime('%H:%M:%S')} {line}", err=True)

    server = Server(path, _run_command, idle_timeout=idle_timeout, log=log, when_idle=_tidy)
    try:
        server.bind()
    except (ServerBusy, protocol.ServerSocketError) as error:
        raise ImgopsError(str(error)) from None
    _terminate_removes(server)
    try:
        warm = _warm_up(device)
        say(f"ready at {path} ({warm}); in the calling shell: export "
            f"{protocol.SERVER_VARIABLE}={_variable(path)}")  # fmt: skip
        server.serve()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    say(f"stopped after {server.commands} command(s)")


def _variable(path) -> str:
    """What IMGOPS_SERVER is set to for the socket at `path`."""
    from ..serve import protocol

    return "1" if path == protocol.default_socket_path() else str(path)


def _detach(path, device: str, idle_timeout: float, verbose: bool) -> tuple[int, str]:
    """Starts `imgops serve` on `path` as a process of its own session (the terminal's Ctrl-C
    and hang-up do not reach it), waits until it answers, and returns its pid and log file;
    ImgopsError with its last message if it stops first."""
    import os
    import subprocess

    from ..serve import protocol
    from ..serve.client import control

    try:
        protocol.private_folder(path, create=True)
    except protocol.ServerSocketError as error:
        raise ImgopsError(str(error)) from None
    if protocol.listening(path):  # (before the log of that server is clobbered)
        raise ImgopsError(f"{path}: an imgops server is already running there")
    log_path = path.with_name(path.name + ".log")
    command = [sys.executable, "-m", "imgops.cli", "serve", "--socket", str(path)]
    command += ["--device", device, "--idle-timeout", f"{idle_timeout:g}"]
    command += ["-v"] if verbose else []
    env = {k: v for k, v in os.environ.items() if k != protocol.SERVER_VARIABLE}
    with open(log_path, "w") as log:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=log, env=env, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if child.poll() is not None:
            lines = log_path.read_text().strip().splitlines() or ["no message"]
            raise ImgopsError(f"the server stopped before it answered: {lines[-1]}")
        status = control(path, "status") if path.exists() else None
        if status is not None and status.get("pid") == child.pid:
            return child.pid, str(log_path)
        time.sleep(0.05)
    child.terminate()
    raise ImgopsError(f"the server did not answer within 300 s (see {log_path})")


def _run_command(argv: list[str]) -> int:
    from ..cli import run_command  # (the CLI imports this module)

    return run_command(argv)


def _tidy() -> str | None:
    """Once idle after a command: the memory its batch freed goes back to the system (a
    command line keeps it until it exits, and back-to-back commands reuse it:
    imgops.engine.allocator). A line for the log (-v), or None."""
    from ..volume.stream import release_free_heap

    before = _resident_mb()
    if not release_free_heap():
        return None
    after = _resident_mb()
    if before is None or after is None:
        return "idle: freed memory given back to the system"
    return f"idle: freed memory given back to the system (resident {before} -> {after} MB)"


def _resident_mb() -> int | None:
    """This process's resident memory in MB (Linux), else None."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _terminate_removes(server) -> None:
    """SIGTERM/SIGHUP/SIGQUIT remove the socket as well as the pending temporaries."""
    import contextlib
    import os
    import signal

    from ..io.signals import TERMINATING_SIGNALS, _terminate

    def terminate(signum: int, frame) -> None:
        with contextlib.suppress(OSError):
            os.unlink(server.path)
        _terminate(signum, frame)

    for signum in TERMINATING_SIGNALS:
        signal.signal(signum, terminate)


def _warm_up(device: str) -> str:
    """Imports what every command needs and starts the GPU stage `device` asks for; says what
    is warm. ImgopsError where `--device cuda[:N]` cannot be kept warm."""
    from ..engine import driver_stage
    from ..engine.cuda_driver import kernels_path
    from ..engine.device import cuda_device_count, driver_engine_usable
    from ..engine.ops import GRAY
    from ..engine.types import default_jobs
    from ..io import gpu_decode, images  # noqa: F401  (numpy and OpenCV, imported once)

    driver_stage.keep_warm()
    if device != "auto" and device != "cpu" and not device.startswith("cuda"):
        raise click.BadParameter(
            f"{device!r}: expected auto, cpu, cuda or cuda:N", param_hint="--device"
        )
    if device == "cpu":
        return "CPU; no GPU kept warm"
    index = int(device.split(":")[1]) if ":" in device else 0
    problem = None
    if cuda_device_count() <= index:
        problem = f"no CUDA GPU {index} is visible"
    elif not driver_engine_usable(GRAY):  # (as imgops doctor tells the two reasons apart)
        problem = "imgops has no fatbin kernels for the torch-free CUDA engine"
        if kernels_path() is not None:
            problem = (
                "IMGOPS_CUDA_ENGINE=torch is set, and a server keeps only the torch-free CUDA "
                "engine warm (unset it, or run the torch engine without a server)"
            )
    elif not gpu_decode.installed():
        problem = f"nvImageCodec is not installed ({gpu_decode.INSTALL_HINT})"
    if problem is None:
        stage = driver_stage.prestart(index, default_jobs())
        try:
            stage.future.result()
        except Exception as error:  # noqa: BLE001 (reported as one line)
            problem = f"GPU {index} could not start: {error}"
            driver_stage.take_prestarted(index)  # (drops the failed stage)
    if problem is not None:
        if device.startswith("cuda"):
            raise ImgopsError(f"--device {device}: {problem}")
        return f"CPU only: {problem}"
    decoder = "nvImageCodec" if stage.decoder is not None else f"the CPU ({stage.decoder_problem})"
    return f"GPU {index} warm, decoding on {decoder}"
