"""Shared test set-up.

- ``FUSEC_VERIFY=1``: the IR verifier runs after every pass in every test (set before fusec is
  imported, so nothing can read the setting earlier).
- ``FUSEC_BACKEND=gpu`` unless the environment sets it: on a machine whose only adapter is a
  software one (CI's lavapipe) fusec's default is the numpy interpreter, and the tests are there to
  run the WGSL. Tests of the interpreter as the backend run it in a subprocess with
  ``FUSEC_BACKEND=cpu``; ``FUSEC_BACKEND=cpu pytest`` runs the whole suite on it on purpose.
- GPU tests must really run on wgpu: if fusec fell back to the numpy interpreter (backend "cpu")
  without ``FUSEC_BACKEND=cpu`` having been asked for explicitly, every test fails loudly instead of
  silently checking the interpreter against numpy.
- ``rng``: a fresh, logged seed per test. Re-run a failure with ``FUSEC_TEST_SEED=<seed>``.
"""

from __future__ import annotations

import os

os.environ["FUSEC_VERIFY"] = "1"
if not os.environ.get("FUSEC_BACKEND", "").strip():
    os.environ["FUSEC_BACKEND"] = "gpu"  # a software adapter too (see above)
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # quiets Mesa/lavapipe on headless Linux
# The persistent cache would make compile counts depend on earlier runs: off unless a test turns
# it on (with its own directory).
os.environ["FUSEC_CACHE_DIR"] = "off"

import secrets  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402


def _cpu_fallback_requested() -> bool:
    return os.environ.get("FUSEC_BACKEND", "").strip().lower() == "cpu"


def pytest_report_header(config: pytest.Config) -> list[str]:
    try:
        import fusec

        dev = fusec.default_device()
        lines = [f"fusec device: {dev.adapter} (type {dev.adapter_type}, backend {dev.backend})"]
        if dev.limits:
            lines.append("fusec limits: max-storage-buffer-binding-size="
                         f"{dev.limits.get('max-storage-buffer-binding-size')}, "
                         "max-storage-buffers-per-shader-stage="
                         f"{dev.limits.get('max-storage-buffers-per-shader-stage')}")
    except Exception as exc:  # the session fixture below turns this into failing tests
        lines = [f"fusec device: unavailable ({type(exc).__name__}: {exc})"]
    lines.append(f"FUSEC_VERIFY={os.environ.get('FUSEC_VERIFY')} "
                 f"FUSEC_BACKEND={os.environ.get('FUSEC_BACKEND', '') or '(auto)'}")
    return lines


@pytest.fixture(scope="session", autouse=True)
def gpu_device() -> object:
    """The device every test runs on; refuses the silent numpy fallback."""
    import fusec

    dev = fusec.default_device()
    if dev.backend == "cpu" and not _cpu_fallback_requested():
        pytest.fail(
            "fusec fell back to the numpy interpreter (backend 'cpu'): no wgpu adapter was found, "
            "so these tests would only check the interpreter against numpy. Install a Vulkan "
            "driver (apt-get install mesa-vulkan-drivers gives the lavapipe software adapter), "
            "or set FUSEC_BACKEND=cpu to run on the interpreter on purpose.",
            pytrace=False,
        )
    return dev


@pytest.fixture
def cpu_target() -> Iterator[None]:
    """Code generation for the ``cpu`` target (software adapters) whatever the adapter."""
    from helpers import forced_target

    with forced_target("cpu"):
        yield


@pytest.fixture
def gpu_target() -> Iterator[None]:
    """Code generation for the ``gpu`` target whatever the adapter, reset afterwards."""
    from helpers import forced_target  # imports fusec: not before FUSEC_VERIFY is set above

    with forced_target("gpu"):
        yield


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A numpy Generator with a fresh seed per test; the seed is printed (shown on failure) and
    recorded as a user property. ``FUSEC_TEST_SEED`` pins it to reproduce a failure."""
    pinned = os.environ.get("FUSEC_TEST_SEED")
    seed = int(pinned) if pinned else secrets.randbits(63)
    request.node.user_properties.append(("seed", seed))
    print(f"rng seed for {request.node.nodeid}: {seed} (re-run with FUSEC_TEST_SEED={seed})")
    return np.random.default_rng(seed)
