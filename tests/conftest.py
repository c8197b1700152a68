import os
import sys
from pathlib import Path

# Tests run on the CPU; a TPU plugin (jax[tpu]) would otherwise log an init error first.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA's CPU backend compiles at LLVM -O1 here, in this process and every server and tool it starts
# (they inherit the environment): on the tiny model compiling is most of a test's time, and -O1
# takes 29% less of it than the default while the compiled programs run as fast (measured
# 2026-12-03: two sizes of the tiny pipeline, 36.9 s -> 26.1 s; 60 steps 2.5 s -> 2.4 s; -O0 took
# 19.6 s but ran 3x slower). Code generation only: the same arithmetic, so every parity holds.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=1"
if os.environ["JAX_PLATFORMS"] == "cpu":  # (on a TPU chip, test_tpu.py: the chip's own compiler)
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

# raw_http's Http and AppLog make a test's checks (each response, each log line) as they come: their
# asserts are rewritten as a test module's are, so a failure shows the values it compared.
pytest.register_assert_rewrite("raw_http")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    from sdxl_tpu.weights.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "sdxl-tiny")


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory):
    """One JAX compilation cache (and the stored programs beside it) for the whole run, shared by
    the workers and the servers and tools they start: a program one compiles, the others read
    (most tests compile the same tiny programs). Stored programs are written whole, then renamed; a
    JAX cache entry read while another process writes it is a warned miss, compiled again."""
    root = tmp_path_factory.getbasetemp()
    # Under xdist each worker's base is a folder of the run's; without xdist (the chip's machine)
    # there are no workers, and no `worker_id` fixture.
    path = (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "jax-compile-cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session", autouse=True)
def temporary_folder(tmp_path_factory):
    """This process's temporary files under the run's own folder, which pytest prunes: gradio_client
    makes a folder in the system's for every file it downloads and leaves it there, empty
    (2026-12-07: 136 a run of test_app.py, 4,400 left in /tmp over a day)."""
    import tempfile

    before, tempfile.tempdir = tempfile.tempdir, str(tmp_path_factory.mktemp("tempfile"))
    yield
    tempfile.tempdir = before


@pytest.fixture(autouse=True)
def session_compile_cache(compile_cache):
    """JAX's persistent cache is one setting for the whole process: a test that points it at a cold
    cache of its own (the bench's, a restart's) hands the session's back afterwards, or every later
    compile in that worker would miss what the others compiled (2026-12-07: one test's 68 s)."""
    yield
    if "jax" in sys.modules and sys.modules["jax"].config.jax_compilation_cache_dir not in (None, str(compile_cache)):
        from sdxl_tpu.generate.compiling.compilation import enable_compile_cache

        enable_compile_cache(compile_cache)


TINY_SIZES = ((64, 64), (96, 64), (96, 96))  # (96x96: 64x64's hires fix, 1.5x)


@pytest.fixture(scope="session")
def tiny_pipeline(tiny_checkpoint, compile_cache):
    """The tiny checkpoint compiled in float32 for three sizes, four images per call, one device."""
    from sdxl_tpu import load_pipeline

    return load_pipeline(tiny_checkpoint, dtype="float32", sizes=TINY_SIZES, compile_cache=compile_cache)


@pytest.fixture(scope="session")
def tiny_inpainting_checkpoint(tmp_path_factory):
    """The tiny checkpoint with an inpainting UNet: 9 input channels (latents, mask, masked image)."""
    from sdxl_tpu.weights.tiny import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("tiny") / "sdxl-tiny-inpainting",
                            overrides={"unet": {"in_channels": 9}})


@pytest.fixture(scope="session")
def tiny_inpainting_pipeline(tiny_inpainting_checkpoint, compile_cache):
    """The inpainting checkpoint compiled in float32 at 64x64, four images per call."""
    from sdxl_tpu import load_pipeline

    return load_pipeline(tiny_inpainting_checkpoint, dtype="float32", sizes=((64, 64),), compile_cache=compile_cache)


@pytest.fixture(scope="session")
def tiny_controlnet(tmp_path_factory, tiny_checkpoint):
    """A random ControlNet of the tiny UNet's shape, "edges", in diffusers' format (reference.write_controlnet)."""
    from diffusers import UNet2DConditionModel
    from reference import write_controlnet

    path = tmp_path_factory.mktemp("controlnets") / "edges"
    write_controlnet(UNet2DConditionModel.from_pretrained(tiny_checkpoint / "unet"), path, seed=0)
    return path


@pytest.fixture(scope="session")
def tiny_ip_adapter(tmp_path_factory, tiny_checkpoint):
    """A random plain IP-Adapter for the tiny UNet, "ip-adapter_sdxl" (.safetensors, as published),
    and its random image encoder's folder (ip_adapter_files.py): (adapter, encoder)."""
    from diffusers import UNet2DConditionModel
    from ip_adapter_files import VISION, adapter_state, write_adapter, write_image_encoder

    root = tmp_path_factory.mktemp("ip_adapter")
    write_image_encoder(root / "image_encoder", image_size=224)
    state = adapter_state(UNet2DConditionModel.from_pretrained(tiny_checkpoint / "unet"), False,
                          VISION["projection_dim"])
    return write_adapter(state, root / "ip-adapter_sdxl.safetensors"), root / "image_encoder"


@pytest.fixture(scope="session")
def tiny_refiner(tmp_path_factory):
    """A random refiner for the tiny model, "sdxl-tiny-refiner" (weights/tiny.py's write_refiner)."""
    from sdxl_tpu.weights.tiny import write_refiner

    return write_refiner(tmp_path_factory.mktemp("refiner") / "sdxl-tiny-refiner")


@pytest.fixture(scope="session")
def wildcards_folder(tmp_path_factory):
    """A folder of wildcard files, as people bring them (one option a line, # comments, a subfolder)."""
    folder = tmp_path_factory.mktemp("wildcards")
    (folder / "color.txt").write_text("# colours\nred\nblue\n{light|dark} green\n")
    (folder / "animals").mkdir()
    (folder / "animals" / "cat.txt").write_text("tabby\nsiamese\n")
    return folder


@pytest.fixture(scope="session")
def embeddings_folder(tmp_path_factory, tiny_checkpoint):
    """Textual inversion embeddings for the tiny model (embedding_files.py: two that load, files
    that do not)."""
    from embedding_files import write_embeddings_folder

    return write_embeddings_folder(tmp_path_factory.mktemp("embeddings"), tiny_checkpoint)


@pytest.fixture(scope="session")
def upscalers_folder(tmp_path_factory):
    """An upscaler model (upscaler_files.GENERAL: a small random Real-ESRGAN compact net) and a file that is not one."""
    from upscaler_files import write_upscalers_folder

    return write_upscalers_folder(tmp_path_factory.mktemp("upscalers"))


@pytest.fixture(scope="session")
def app_server(tmp_path_factory, compile_cache, tiny_controlnet, tiny_ip_adapter, tiny_refiner, wildcards_folder,
               embeddings_folder, upscalers_folder):
    """`python app.py --model tiny` on 127.0.0.1 (see served_app.py), shared by the HTTP tests: with
    its MCP server on, an API key (served_app.API_KEY) for the other tools' APIs, the ControlNet
    "edges" (tiny_controlnet), the IP-Adapter "ip-adapter_sdxl" (tiny_ip_adapter), the refiner
    (tiny_refiner), wildcards (wildcards_folder), embeddings (embeddings_folder) and an upscaler model
    (upscalers_folder). The networks' programs compile at start at 64x64 alone (--network-sizes), where
    the tests use them: at the other two sizes they would add some 35 s to its start."""
    from served_app import API_KEY, start_app

    adapter, encoder = tiny_ip_adapter
    yield from start_app(tmp_path_factory.mktemp("app"), compile_cache,
                         ("--mcp", "on", "--controlnet", str(tiny_controlnet), "--wildcards", str(wildcards_folder),
                          "--embeddings", str(embeddings_folder), "--upscalers", str(upscalers_folder),
                          "--ip-adapter", str(adapter), "--image-encoder", str(encoder), "--refiner",
                          str(tiny_refiner), "--network-sizes", "64x64"),
                         env_extra={"SDXL_API_KEY": API_KEY})


# The longest test files (2026-12-05, seconds in one process), started first: two workers take
# files in this order (pyproject.toml), so the short ones fill in at the end and both finish together.
LONGEST_FIRST = ("test_app", "test_compare_reference", "test_full_size", "test_a1111", "test_security", "test_cli",
                 "test_bench", "test_parity", "test_chain", "test_multidevice", "test_serving", "test_single_file")


# The files that share the session's app (app_server, a minute to start under the suite's load): one
# worker takes them together, so it starts once (each worker has its own session fixtures).
SHARE_THE_APP = ("test_app", "test_security", "test_tool_apis")


def pytest_collection_modifyitems(items):
    """The full-size checks first, while the session's process and machine hold the least: on a
    24 GiB machine the SDXL UNet's check (10 GB of float32 weights, briefly in two libraries) took
    46 s alone and 89-111 s late in the suite; then the longest files. (A stable sort: the rest
    keep their order.)"""
    def rank(item) -> tuple[bool, int]:
        module = item.path.stem
        return (item.get_closest_marker("full_size") is None,
                LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST))

    items.sort(key=rank)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: pytest without xdist (a TPU machine's) must not refuse it
def pytest_xdist_make_scheduler(config, log):
    """Each file is one unit of work for the two workers, the files that share the app one unit, so
    a file's module fixtures and the session's app start once. (xdist's own groups, `--dist
    loadgroup`, rename test ids, which pytest 9.2 no longer lets a plugin do: every test then went to
    whichever worker was free, and the app and the eight simulated devices started on both.)"""
    from xdist.scheduler import LoadScopeScheduling

    class FilesApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return "app_server" if Path(file).stem in SHARE_THE_APP else file

    return FilesApart(config, log)
