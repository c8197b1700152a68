"""The served app over many calls: disk and memory stay flat (a Space runs for days)."""

from __future__ import annotations

from pathlib import Path

import pytest

from served_app import start_app

WARMUP_CALLS, SOAK_CALLS = 20, 120


@pytest.fixture(scope="module")
def soak_app(tmp_path_factory, compile_cache):
    # Images stay downloadable for 2 s here (an hour by default), so a short run shows the sweep.
    yield from start_app(tmp_path_factory.mktemp("soak"), compile_cache, extra_args=("--keep-images", "2"))


def _disk(folder: Path) -> tuple[int, int]:
    files = [p for p in folder.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_disk_and_memory_stay_flat_over_many_calls(soak_app):
    from gradio_client import Client

    client = Client(soak_app["url"] + "/", verbose=False, download_files=False)
    cache, pid = soak_app["cache_dir"], soak_app["proc"].pid
    samples = []
    for i in range(SOAK_CALLS):  # bounded
        gallery, _ = client.predict("a photo of a cat", "blurry", "(No style)", i, False, 5.0, 1, "64x64",
                                    api_name="/generate")
        assert len(gallery) == 4
        if i + 1 in (WARMUP_CALLS, SOAK_CALLS):
            samples.append((*_disk(cache), _rss_bytes(pid)))
    (files_warm, bytes_warm, rss_warm), (files_end, bytes_end, rss_end) = samples
    per_call = (bytes_end - bytes_warm) / (SOAK_CALLS - WARMUP_CALLS)
    print(f"after {WARMUP_CALLS} calls: {files_warm} files, {bytes_warm:,} bytes, RSS {rss_warm / 2**20:.1f} MiB; "
          f"after {SOAK_CALLS}: {files_end} files, {bytes_end:,} bytes, RSS {rss_end / 2**20:.1f} MiB "
          f"({per_call:+,.0f} bytes and {(rss_end - rss_warm) / (SOAK_CALLS - WARMUP_CALLS) / 1024:+.1f} KiB RSS "
          "per call)")
    # Disk: only what the last couple of seconds wrote is still there (4 images a call, ~2 kB each);
    # before the sweep it grew by every call's images, for good.
    assert files_end <= 4 * 20 and bytes_end <= 4 * 20 * 8_000
    # Memory: flat after warm-up, within allocator noise (a leak of one 64x64 call's images, ~50 kB,
    # over 100 calls would be 5 MB).
    assert rss_end - rss_warm <= 24 * 2**20
    # The newest images are still served.
    import urllib.request

    with urllib.request.urlopen(gallery[0]["image"]["url"], timeout=10) as response:
        assert response.status == 200 and response.read(3) == b"\xff\xd8\xff"  # a JPEG

