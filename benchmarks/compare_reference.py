"""Side by side: sdxl_tpu against the reference, diffusers 0.39's FlaxStableDiffusionXLPipeline.

    python benchmarks/compare_reference.py --architecture small --steps 20 --runs 3

Writes a random checkpoint of the architecture in diffusers format, starts one worker process per
implementation (the reference in its own virtual environment, benchmarks/.venv-reference,
created on first use from requirements-reference.txt on top of the packages of the interpreter
running this script, a virtual environment's included), both on the same devices (four
simulated CPU devices here by default; the real devices elsewhere with --devices 0), then
alternates calls between them and prints compile times, latencies and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import site
import statistics
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
VENV = HERE / ".venv-reference"


def outer_site_dirs() -> list[str]:
    """The site-packages directories of the interpreter running this script, in its sys.path order:
    those of the active virtual environment when there is one, not its base interpreter's."""
    dirs = set(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.add(site.getusersitepackages())
    return [p for p in dict.fromkeys(sys.path) if p in dirs and os.path.isdir(p)]


def link_outer_packages(python: Path) -> Path:
    """Make the reference environment see this interpreter's packages (jax, flax, torch, ...).

    A .pth file in its site-packages adds them with site.addsitedir, so their own .pth files are
    processed too. They come after the reference environment's own site-packages, so its pinned
    diffusers and transformers win over the ones installed here. (A venv's system_site_packages
    would add the BASE interpreter's site-packages instead: inside a virtual environment, not
    where jax is.)
    """
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
    pth = Path(purelib) / "sdxl-tpu-outer-site-packages.pth"
    pth.write_text("".join(f"import site; site.addsitedir({d!r})\n" for d in outer_site_dirs()))
    return pth


def _python_version(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                          text=True).stdout.strip()


def ensure_reference_env() -> Path:
    python = VENV / "bin" / "python"
    marker = VENV / "installed.txt"
    wanted = (HERE / "requirements-reference.txt").read_text()
    fresh = (python.exists() and marker.exists() and marker.read_text() == wanted
             and _python_version(python) == str(sys.version_info[:2]))  # packages linked below must fit its ABI
    if not fresh:
        print(f"setting up the reference environment in {VENV} ...", file=sys.stderr, flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    # Every run: the packages of whichever interpreter runs this script (system Python or a venv).
    link_outer_packages(python)
    if not fresh:  # pip sees the linked packages and installs only what the pins need beyond them
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(HERE / "requirements-reference.txt")],
                       check=True)
        marker.write_text(wanted)
    return python


class Worker:
    """A long-lived benchmark process: reports its start-up, then one latency per 'run' line."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path):
        self.name, self.log = name, log
        with open(log, "w") as err:  # the reference logs a deprecation warning per module
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                                         env=env, cwd=ROOT)
        self.ready = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            tail = "\n".join(self.log.read_text().splitlines()[-15:])
            raise RuntimeError(f"{self.name} worker died (exit code {self.proc.wait()}); its log ends:\n{tail}")
        return json.loads(line)

    def run(self) -> float:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return self._read()["latency_s"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)


def make_report(args: argparse.Namespace, ours: dict, reference: dict, latencies: dict[str, list[float]]) -> dict:
    """The figures printed: each worker's start-up (`ours`, `reference`: what it reported when ready),
    the latencies of the alternated calls, their medians and the throughput ratio (ours over the
    reference's: above 1 when ours is faster)."""
    med = {k: statistics.median(v) for k, v in latencies.items()}
    return {
        "architecture": args.architecture, "steps": args.steps, "dtype": args.dtype, "images": ours["images"],
        "size": ours["size"], "devices": ours["devices"], "device_kind": ours["device_kind"],
        "versions": {"ours": ours["versions"], "reference": reference["versions"]},
        **{figure: {"ours": ours[figure], "reference": reference[figure]}
           for figure in ("load_s", "compile_s", "first_call_s")},
        "latency_s": latencies, "median_latency_s": med,
        "throughput_ratio": med["reference"] / med["ours"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--architecture", "--preset", dest="architecture", choices=["tiny", "small", "sdxl"],
                        default="small")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--compute-dtype", choices=["bfloat16", "float32"], default=None,
                        help="sdxl_tpu's activation dtype (default: --dtype, but float32 on a CPU)")
    parser.add_argument("--devices", type=int, default=4,
                        help="simulated CPU devices (0: use the machine's real devices)")
    parser.add_argument("--checkpoint", default=None, help="reuse a checkpoint directory instead of writing one")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--setup", action="store_true",
                        help="only create (or refresh) the reference environment, then exit (README's test command)")
    args = parser.parse_args(argv)
    if args.setup:
        print(ensure_reference_env())
        return 0

    env = dict(os.environ)
    if args.devices:
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.devices}".strip()
    env["PYTHONPATH"] = str(ROOT)
    work = Path(tempfile.mkdtemp(prefix="sdxl-compare-"))
    checkpoint = Path(args.checkpoint) if args.checkpoint else work / f"{args.architecture}-checkpoint"
    if not args.checkpoint:
        subprocess.run([sys.executable, "-m", "sdxl_tpu", "make-tiny", str(checkpoint), "--architecture",
                        args.architecture],
                       check=True, env=env, stdout=subprocess.DEVNULL)
    reference_python = ensure_reference_env()
    from sdxl_tpu.weights.architectures import architecture_configs

    width, height = architecture_configs(args.architecture)["size"]
    common = ["--checkpoint", str(checkpoint), "--size", f"{width}x{height}", "--steps", str(args.steps),
              "--dtype", args.dtype]

    workers = []
    try:
        # Start (and so compile) one at a time, so compile times are not measured under contention.
        ours = Worker("sdxl_tpu", [sys.executable, str(HERE / "workers.py"), "ours", *common,
                                   "--compile-cache", str(work / "jax-cache"),
                                   *(["--compute-dtype", args.compute_dtype] if args.compute_dtype else [])],
                     env, work / "ours.log")
        workers.append(ours)
        reference = Worker("reference", [str(reference_python), str(HERE / "workers.py"), "reference", *common], env,
                           work / "reference.log")
        workers.append(reference)
        latencies = {"ours": [], "reference": []}
        for _ in range(args.runs):  # alternate, so drift on a noisy machine hits both alike
            latencies["reference"].append(reference.run())
            latencies["ours"].append(ours.run())
    finally:
        for w in workers:
            w.close()

    report = make_report(args, ours.ready, reference.ready, latencies)
    med = report["median_latency_s"]
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['architecture']} architecture, {report['images']} x {report['size']}, {args.steps} steps, "
              f"{args.dtype}, {report['devices']} x {report['device_kind']}")
        print(f"{'':<22}{'sdxl_tpu':>12}{'reference':>12}")
        print(f"{'load (s)':<22}{report['load_s']['ours']:>12.1f}{report['load_s']['reference']:>12.1f}")
        print(f"{'compile (s)':<22}{report['compile_s']['ours']:>12.1f}{report['compile_s']['reference']:>12.1f}")
        print(f"{'first call (s)':<22}{report['first_call_s']['ours']:>12.1f}"
              f"{report['first_call_s']['reference']:>12.1f}")
        print(f"{'latency median (s)':<22}{med['ours']:>12.3f}{med['reference']:>12.3f}")
        print(f"throughput ours / reference: {report['throughput_ratio']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
