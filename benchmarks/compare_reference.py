"""Side by side: sdxl_tpu against the reference, diffusers 0.39's FlaxStableDiffusionXLPipeline.

    python benchmarks/compare_reference.py --architecture small --steps 20 --runs 3

Writes a random checkpoint of the architecture in diffusers format, starts one worker process per
implementation (the reference in its own virtual environment, benchmarks/.venv-reference,
created on first use from requirements-reference.txt on top of the packages of the interpreter
running this script, a virtual environment's included), both on the same devices (four
simulated CPU devices here by default; the real devices elsewhere with --devices 0), then
alternates calls between them and prints compile times, latencies and their ratio.

Where one process at a time may hold the device (a TPU), `--one-at-a-time` runs each worker's
calls alone, and `--only ours|reference` with `--other FILE` splits the two over separate runs:

    python benchmarks/compare_reference.py --architecture sdxl --devices 0 --only ours --work /tmp/c --json > ours.json
    python benchmarks/compare_reference.py --architecture sdxl --devices 0 --only reference --work /tmp/c \
        --reference-python python3 --other ours.json --json
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


def half_report(args: argparse.Namespace, side: str, ready: dict, latencies: list[float]) -> dict:
    """One side's figures (`--only`), which a later run of the other side completes with `--other`."""
    return {"what": "compare_reference_half", "side": side, "architecture": args.architecture, "steps": args.steps,
            "dtype": args.dtype, "ready": ready, "latency_s": latencies}


def complete_report(args: argparse.Namespace, side: str, ready: dict, latencies: list[float], other: dict) -> dict:
    """The whole report from this run's side and the other side's half_report, which must have
    measured the same work."""
    mine = half_report(args, side, ready, latencies)
    for key in ("architecture", "steps", "dtype"):
        if other[key] != mine[key]:
            raise SystemExit(f"--other measured {key}={other[key]!r}, this run {mine[key]!r}")
    for key in ("images", "size", "devices"):
        if other["ready"][key] != ready[key]:
            raise SystemExit(f"--other measured {key}={other['ready'][key]!r}, this run {ready[key]!r}")
    halves = {side: mine, other["side"]: other}
    if set(halves) != {"ours", "reference"}:
        raise SystemExit(f"--other holds the same side ({side}) as this run")
    return make_report(args, halves["ours"]["ready"], halves["reference"]["ready"],
                       {s: halves[s]["latency_s"] for s in ("ours", "reference")})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--architecture", "--preset", dest="architecture", choices=["tiny", "small", "sdxl"],
                        default="small")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--images", type=int, default=None, help="images a call (default: one a device)")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--compute-dtype", choices=["bfloat16", "float32"], default=None,
                        help="sdxl_tpu's activation dtype (default: --dtype, but float32 on a CPU)")
    parser.add_argument("--devices", type=int, default=4,
                        help="simulated CPU devices (0: use the machine's real devices)")
    parser.add_argument("--checkpoint", default=None, help="reuse a checkpoint directory instead of writing one")
    parser.add_argument("--checkpoint-dtype", choices=["float32", "float16"], default="float32",
                        help="the written checkpoint's tensors (float16: half the disk and host memory, as "
                             "the published fp16 files)")
    parser.add_argument("--work", default=None, help="the folder for the checkpoint and compile cache (default: a "
                                                     "new temporary one); a checkpoint already there is reused")
    parser.add_argument("--one-at-a-time", action="store_true",
                        help="each worker makes its calls alone, then quits (default with --devices 0: a TPU "
                             "lets one process at a time hold it)")
    parser.add_argument("--only", choices=["ours", "reference"], default=None,
                        help="measure one side; its JSON completes a later run of the other with --other")
    parser.add_argument("--other", default=None, help="the other side's JSON from an --only run")
    parser.add_argument("--reference-python", default=None,
                        help="an interpreter that imports diffusers 0.39 and transformers 4.57 (with "
                             "--reference-path ahead of PYTHONPATH) instead of the script's virtual environment")
    parser.add_argument("--reference-path", default=None, help="prepended to PYTHONPATH for the reference worker")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--setup", action="store_true",
                        help="only create (or refresh) the reference environment, then exit (README's test command)")
    args = parser.parse_args(argv)
    if args.setup:
        print(ensure_reference_env())
        return 0
    sides = (args.only,) if args.only else ("ours", "reference")
    other = json.loads(Path(args.other).read_text().strip().splitlines()[-1]) if args.other else None

    env = dict(os.environ)
    if args.devices:
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.devices}".strip()
    # Ahead of what is there (a TPU machine's PYTHONPATH names its JAX: kept, not replaced).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="sdxl-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    checkpoint = Path(args.checkpoint) if args.checkpoint else work / f"{args.architecture}-checkpoint"
    if not (checkpoint / "model_index.json").exists():
        write = ("import sys, numpy; from sdxl_tpu.weights.tiny import write_checkpoint; "
                 "write_checkpoint(sys.argv[1], sys.argv[2], dtype=numpy.dtype(sys.argv[3]))")
        # On the CPU, so that writing it never holds the accelerator.
        subprocess.run([sys.executable, "-c", write, str(checkpoint), args.architecture, args.checkpoint_dtype],
                       check=True, env={**env, "JAX_PLATFORMS": "cpu"}, stdout=subprocess.DEVNULL)
    from sdxl_tpu.weights.architectures import architecture_configs

    width, height = architecture_configs(args.architecture)["size"]
    common = ["--checkpoint", str(checkpoint), "--size", f"{width}x{height}", "--steps", str(args.steps),
              "--dtype", args.dtype, *(["--images", str(args.images)] if args.images else [])]

    def start(side: str) -> Worker:
        if side == "ours":
            return Worker("sdxl_tpu", [sys.executable, str(HERE / "workers.py"), "ours", *common,
                                       "--compile-cache", str(work / "jax-cache"),
                                       *(["--compute-dtype", args.compute_dtype] if args.compute_dtype else [])],
                          env, work / "ours.log")
        python = args.reference_python or str(ensure_reference_env())
        reference_env = dict(env)
        if args.reference_path:
            reference_env["PYTHONPATH"] = os.pathsep.join([args.reference_path, env["PYTHONPATH"]])
        return Worker("reference", [python, str(HERE / "workers.py"), "reference", *common], reference_env,
                      work / "reference.log")

    ready, latencies, workers = {}, {side: [] for side in sides}, []
    try:
        if args.one_at_a_time or not args.devices:
            for side in sides:
                worker = start(side)
                workers.append(worker)
                ready[side] = worker.ready
                latencies[side] = [worker.run() for _ in range(args.runs)]
                worker.close()
        else:
            # Start (and so compile) one at a time, so compile times are not measured under contention.
            for side in sides:
                workers.append(start(side))
                ready[side] = workers[-1].ready
            for _ in range(args.runs):  # alternate, so drift on a noisy machine hits both alike
                for side, worker in zip(sides, workers, strict=True):
                    latencies[side].append(worker.run())
    finally:
        for w in workers:
            w.close()

    if len(sides) == 1 and other is None:
        print(json.dumps(half_report(args, sides[0], ready[sides[0]], latencies[sides[0]])))
        return 0
    report = (complete_report(args, sides[0], ready[sides[0]], latencies[sides[0]], other) if other
              else make_report(args, ready["ours"], ready["reference"], latencies))
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
