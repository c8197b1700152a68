"""The batcher: requests that arrive together share a pipeline call, a lone one waits at most
max_wait, abandoned work is dropped or stopped, and errors reach every caller."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from sdxl_tpu.generate.denoising_loop import LOOKAHEAD
from sdxl_tpu.server.batcher import Batcher, SHUTTING_DOWN
from sdxl_tpu.request.errors import Cancelled, RequestError
from sdxl_tpu.request.request import GenerationResult, ImageInfo, Request


def infos(seed: int, n: int = 4, steps: int = 2, size=(64, 64), **more) -> list[ImageInfo]:
    return [ImageInfo(seed=seed + i, prompt=f"p{seed}", negative_prompt="", guidance_scale=5.0, steps=steps, size=size,
                      **more) for i in range(n)]


class FakePipeline:
    """Records each call; `hold` keeps a call running until set; steps poll `stop`."""

    def __init__(self, images_per_call: int = 8, step_seconds: float = 0.0):
        self.images_per_call, self.step_seconds = images_per_call, step_seconds
        self.calls: list[tuple[float, list[int]]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.fail: Exception | None = None
        self.steps_run = 0
        self.init_images: list[np.ndarray | None] = []  # each call's
        self.masks: list[np.ndarray | None] = []  # each call's

    def run_images(self, infos, progress=None, stop=None, init_images=None, masks=None):
        self.calls.append((time.monotonic(), [i.seed for i in infos]))
        self.init_images.append(init_images)
        self.masks.append(masks)
        self.hold.wait(10)
        if self.fail is not None:
            raise self.fail
        for step in range(infos[0].steps):
            time.sleep(self.step_seconds)
            self.steps_run += 1
            if progress:
                progress(step + 1, infos[0].steps)
            if step + 1 < infos[0].steps and stop and stop():
                raise Cancelled("stopped")
        return GenerationResult(images=[f"image {i.seed}" for i in infos], infos=list(infos),
                                timings={"total": 0.0})


def held_batcher(images_per_call: int, step_seconds: float = 0.0, **options) -> tuple[FakePipeline, Batcher]:
    """A fake pipeline whose calls wait until `pipe.hold` is set, and a batcher over it."""
    pipe = FakePipeline(images_per_call=images_per_call, step_seconds=step_seconds)
    pipe.hold.clear()
    return pipe, Batcher(pipe, **options)


def wait_until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds  # bounded
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def started(pool, batcher, pipe, *args):
    """Submit a job and wait until the fake pipeline has begun its call."""
    calls = len(pipe.calls)
    future = pool.submit(batcher.submit, *args)
    wait_until(lambda: len(pipe.calls) > calls)
    return future


def test_concurrent_requests_share_a_call_and_each_gets_its_own_images():
    pipe, batcher = held_batcher(images_per_call=8, max_wait=0.02)
    with ThreadPoolExecutor(3) as pool:
        first = started(pool, batcher, pipe, infos(100))  # runs alone (held), the next two wait together
        a, b = pool.submit(batcher.submit, infos(200)), pool.submit(batcher.submit, infos(300))
        time.sleep(0.05)
        pipe.hold.set()
        results = [f.result(10) for f in (first, a, b)]
    assert [seeds for _, seeds in pipe.calls] == [[100, 101, 102, 103], [200, 201, 202, 203, 300, 301, 302, 303]] or \
        [seeds for _, seeds in pipe.calls] == [[100, 101, 102, 103], [300, 301, 302, 303, 200, 201, 202, 203]]
    assert batcher.calls == 2
    for result, base in zip(results, (100, 200, 300)):
        assert result.seeds == [base + i for i in range(4)]
        assert result.images == [f"image {base + i}" for i in range(4)]


def test_a_lone_request_waits_at_most_max_wait_for_a_partner():
    pipe = FakePipeline(images_per_call=8)
    batcher = Batcher(pipe, max_wait=0.02)
    waits = []
    for seed in range(5):  # bounded
        start = time.monotonic()
        batcher.submit(infos(seed))
        waits.append(pipe.calls[-1][0] - start)
    print(f"lone request's wait for a partner: median {np.median(waits) * 1000:.1f} ms, max {max(waits) * 1000:.1f} ms")
    assert min(waits) >= 0.015 and np.median(waits) <= 0.06


def test_a_full_call_does_not_wait_and_shapes_do_not_mix():
    pipe = FakePipeline(images_per_call=4)
    batcher = Batcher(pipe, max_wait=1.0)  # a wait would show: 1 s
    start = time.monotonic()
    batcher.submit(infos(1))
    assert pipe.calls[-1][0] - start < 0.5
    pipe, batcher = held_batcher(images_per_call=8, max_wait=0.02)
    with ThreadPoolExecutor(3) as pool:
        held = started(pool, batcher, pipe, infos(0))
        other_steps = pool.submit(batcher.submit, infos(10, steps=3))
        other_size = pool.submit(batcher.submit, infos(20, size=(96, 64)))
        other_schedule = pool.submit(batcher.submit, infos(30, schedule="Karras"))
        time.sleep(0.05)
        pipe.hold.set()
        for f in (held, other_steps, other_size, other_schedule):
            f.result(10)
    assert batcher.calls == 4 and all(len(seeds) == 4 for _, seeds in pipe.calls)


def test_requests_with_other_noise_sources_share_a_call():
    """The RNG is drawn per image (JAX's or PyTorch's CPU generator from its own seed): requests
    that differ only in it are one call."""
    pipe, batcher = held_batcher(images_per_call=8, max_wait=0.02)
    with ThreadPoolExecutor(3) as pool:
        held = started(pool, batcher, pipe, infos(0))
        jax_noise, cpu_noise = (pool.submit(batcher.submit, infos(seed, rng=rng))
                                for seed, rng in ((10, "JAX"), (20, "CPU")))
        time.sleep(0.05)
        pipe.hold.set()
        results = [f.result(10) for f in (held, jax_noise, cpu_noise)]
    assert batcher.calls == 2 and sorted(len(seeds) for _, seeds in pipe.calls) == [4, 8]
    assert [i.rng for i in results[2].infos] == ["CPU"] * 4 and [i.rng for i in results[1].infos] == ["JAX"] * 4


def test_img2img_requests_share_a_call_each_with_its_own_image():
    """Requests from an image at one strength share a call, each image in its images' slots; text to
    image, another strength and masked requests (inpainting, which share a call too, each with its
    own mask) are calls of their own."""
    pipe, batcher = held_batcher(images_per_call=8, max_wait=0.02)
    start = [np.full((64, 64, 3), value, np.uint8) for value in (10, 20, 30)]
    with ThreadPoolExecutor(1) as pool:
        held = started(pool, batcher, pipe, infos(0))  # (the others wait meanwhile)
        jobs = [batcher.enqueue(infos(10 * (k + 1), n=n, strength=strength), init_image=start[k])
                for k, (n, strength) in enumerate(((3, 0.5), (4, 0.5), (2, 0.25)))]
        masks = [np.full((64, 64), value, np.uint8) for value in (255, 128)]  # (one image each: room in the first)
        jobs += [batcher.enqueue(infos(50 + k, n=1, strength=0.5), init_image=start[k], mask=masks[k])
                 for k in range(2)]
        pipe.hold.set()
        held.result(10)
        for job in jobs:
            assert job.done.wait(10) and job.error is None
    assert batcher.calls == 4
    assert pipe.init_images[0] is None  # text to image: no images
    shared, alone, masked = pipe.init_images[1:]
    assert shared.shape == (7, 64, 64, 3) and alone.shape == (2, 64, 64, 3)
    assert [int(x[0, 0, 0]) for x in shared] == [10] * 3 + [20] * 4 and (alone == 30).all()
    assert pipe.masks[:3] == [None] * 3 and [int(m[0, 0]) for m in pipe.masks[3]] == [255, 128]
    assert [int(x[0, 0, 0]) for x in masked] == [10, 20]
    with pytest.raises(ValueError, match="need their denoising strength, and only they"):
        batcher.enqueue(infos(1, strength=0.5))


def test_an_abandoned_request_is_dropped_while_waiting_and_stopped_while_running():
    pipe, batcher = held_batcher(images_per_call=4, step_seconds=0.01)
    gone = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        running = started(pool, batcher, pipe, infos(0, steps=50), None, gone.is_set)
        waiting = pool.submit(batcher.submit, infos(10), None, gone.is_set)
        time.sleep(0.05)
        gone.set()
        pipe.hold.set()
        with pytest.raises(Cancelled):
            running.result(10)
        with pytest.raises(Cancelled):
            waiting.result(10)
    assert pipe.steps_run <= 2 and batcher.calls == 1  # stopped at the first step; the waiting one never ran
    assert batcher.submit(infos(20)).seeds[0] == 20  # and the batcher goes on


def test_a_call_goes_on_while_one_of_its_callers_remains():
    pipe, batcher = held_batcher(images_per_call=8, step_seconds=0.005)
    gone = threading.Event()
    with ThreadPoolExecutor(3) as pool:
        first = started(pool, batcher, pipe, infos(0))
        leaving = pool.submit(batcher.submit, infos(10, steps=20), None, gone.is_set)
        staying = pool.submit(batcher.submit, infos(20, steps=20))
        time.sleep(0.05)
        pipe.hold.set()
        first.result(10)
        gone.set()
        assert staying.result(10).seeds == [20, 21, 22, 23]
        with pytest.raises(Cancelled):
            leaving.result(10)
    assert pipe.steps_run == 2 + 20


def test_errors_reach_every_caller_and_closing_refuses_new_work():
    pipe = FakePipeline(images_per_call=8)
    pipe.fail = RuntimeError("device lost")
    pipe.hold.clear()
    batcher = Batcher(pipe)
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(batcher.submit, infos(s)) for s in (0, 10)]
        time.sleep(0.05)
        pipe.hold.set()
        for f in futures:
            with pytest.raises(RuntimeError, match="device lost"):
                f.result(10)
    pipe.fail = None
    assert len(batcher.submit(infos(5)).images) == 4
    with pytest.raises(ValueError, match="1 to 8 images"):
        batcher.submit(infos(0, n=9))
    batcher.close()
    assert batcher.join(5)
    with pytest.raises(RequestError, match=SHUTTING_DOWN):
        batcher.submit(infos(0))


def test_a_fault_after_the_call_fails_its_requests_and_the_batcher_goes_on():
    """A result the batcher cannot split (a bug on either side) reaches its callers as an error;
    the batcher's thread survives it and serves the next request."""
    pipe = FakePipeline(images_per_call=8)
    real = pipe.run_images
    pipe.run_images = lambda *args, **kwargs: object()  # no images, no infos
    batcher = Batcher(pipe)
    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(AttributeError):
            pool.submit(batcher.submit, infos(0)).result(10)
    pipe.run_images = real
    assert len(batcher.submit(infos(5)).images) == 4
    batcher.close()
    assert batcher.join(5)


def test_close_with_stop_running_cancels_the_call_in_flight():
    pipe = FakePipeline(images_per_call=4, step_seconds=0.01)
    batcher = Batcher(pipe)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(batcher.submit, infos(0, steps=500))
        wait_until(lambda: pipe.steps_run)
        batcher.close(stop_running=True)
        with pytest.raises(Cancelled):
            running.result(10)
    assert batcher.join(5) and pipe.steps_run < 50


def test_the_pipeline_stops_between_steps(tiny_pipeline):
    """The real stepwise loop: `stop` is asked after every step, with at most LOOKAHEAD steps
    dispatched beyond it, and the pipeline works normally afterwards."""
    request = Request.of("a cat", seed=1, steps=50, size=(64, 64))
    reported = []

    def stop() -> bool:
        return len(reported) >= 3

    programs = tiny_pipeline.compiled((64, 64))
    denoise, dispatched = programs["denoise"], []
    programs["denoise"] = lambda *args: (dispatched.append(1), denoise(*args))[1]
    try:
        with pytest.raises(Cancelled, match="after step 3 of 50"):
            tiny_pipeline.run(request, progress=lambda i, n: reported.append(i), stop=stop)
    finally:
        programs["denoise"] = denoise
    # Stop (the page's button) ends a run within two steps: the step under way when it is pressed,
    # and at most one more already queued on the device.
    assert reported == [1, 2, 3] and LOOKAHEAD == 1 and len(dispatched) == 3 + LOOKAHEAD
    # Fewer images than the compiled batch: the same pixels as in a full call.
    full = tiny_pipeline.run(Request.of("a cat", seed=7, steps=2, size=(64, 64)))
    part = tiny_pipeline.run_images(full.infos[1:3])
    assert part.seeds == [8, 9]
    for a, b in zip(part.images, full.images[1:3]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for other in (dict(steps=3), dict(steps=2, sampler="Euler a"),
                  dict(steps=2, strength=0.5, image=np.zeros((64, 64, 3), np.uint8))):
        with pytest.raises(ValueError, match="share their size, step count, sampler, schedule, denoising strength"):
            tiny_pipeline.run_images([full.infos[0], Request.of("x", seed=1, size=(64, 64), **other).images(1)[0]])
