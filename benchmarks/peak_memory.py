"""Run a command, pass its output through, then say on stderr how much host memory it held at
its peak (its largest process's resident set): `python benchmarks/peak_memory.py CMD...`."""

import resource
import subprocess
import sys

done = subprocess.run(sys.argv[1:])
peak_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # (KiB on Linux)
print(f"peak host memory of {' '.join(sys.argv[1:4])} ...: {peak_gib:.1f} GiB", file=sys.stderr)
sys.exit(done.returncode)
