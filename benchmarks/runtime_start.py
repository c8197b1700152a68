"""What a new process pays on an accelerator before its first program runs, step by step.

    python benchmarks/runtime_start.py [--transfer] [--program FILE.pickle] [--profile] --json

Seconds for `import jax`, the runtime's start (`jax.devices()`: on a TPU it pins its host buffer,
TPU_PREMAPPED_BUFFER_SIZE), the package's imports after it; with --transfer, 200 arrays of 25 MB
(SDXL's weights' size and largest tensors) to the device; with --program, reading one stored program
(benchmarks/program_compile.py --store writes them) and, with --profile, where that read's time goes
by Python function (cProfile). Run it in a new process per setting: the runtime starts once.
`bash benchmarks/tpu.sh start` runs it under three host buffer sizes.
"""

from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # (a stored program's trees name the package)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transfer", action="store_true", help="time 200 arrays of 25 MB to the device")
    parser.add_argument("--program", help="a stored program (program_compile.py --store) to read back")
    parser.add_argument("--profile", action="store_true", help="with --program: cProfile's top functions of the read")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    seconds: dict[str, float] = {}

    def step(name: str, since: float) -> float:
        now = time.perf_counter()
        seconds[name] = round(now - since, 2)
        return now

    mark = START
    import jax
    mark = step("import_jax", mark)
    devices = jax.devices()
    mark = step("runtime_start", mark)
    import sdxl_tpu.generate.loading  # noqa: F401
    import sdxl_tpu.server.core  # noqa: F401
    step("package_imports", mark)
    report: dict = {"seconds": seconds, "device": devices[0].device_kind,
                    "host_buffer": os.environ.get("TPU_PREMAPPED_BUFFER_SIZE", "the runtime's default")}
    if args.transfer:
        import numpy as np

        arrays = [np.full((1280, 10240), i, np.float16) for i in range(200)]
        mark = time.perf_counter()
        jax.block_until_ready(jax.device_put(arrays))
        step("transfer_200x25MB", mark)
    if args.program:
        import pickle

        from jax.experimental.serialize_executable import deserialize_and_load

        executable, in_tree, out_tree = pickle.loads(Path(args.program).read_bytes())
        mark = time.perf_counter()
        if args.profile:
            import cProfile
            import io
            import pstats

            profiler = cProfile.Profile()
            profiler.runcall(deserialize_and_load, executable, in_tree, out_tree)
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(8)
            report["program_read_profile"] = text.getvalue().splitlines()[-14:]
        else:
            deserialize_and_load(executable, in_tree, out_tree)
        step("program_read", mark)
    seconds["total"] = round(time.perf_counter() - START, 2)
    print(json.dumps(report) if args.json else json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
