"""The /dev/shm part of the headroom check: need per instance, margin, and the message."""

from __future__ import annotations

from controlplane.domain.headroom import ShmNeed, check, shm_need

MIB = 1024**2


def need(
    backend: str = "python", instances: int = 2, free: int | None = 40 * MIB
) -> ShmNeed | None:
    return shm_need(
        backend, instances, per_instance=MIB, backends=("python",), free=free, margin=32 * MIB
    )


def test_a_python_model_needs_a_region_per_instance() -> None:
    found = need(instances=3)
    assert found is not None
    assert found.need == 3 * MIB
    assert found.basis == "3 instances of the python backend x 1.0 MiB"


def test_a_load_that_would_leave_less_than_the_margin_is_refused_with_the_figures() -> None:
    found = check(MIB, "size", gpu_free=None, host_available=None, shm=need(instances=9))
    assert not found.ok
    assert found.describe() == (
        "the load needs about 9.0 MiB of /dev/shm (9 instances of the python backend x 1.0 MiB) "
        "but /dev/shm has 40.0 MiB free, which would leave 31.0 MiB, under the 32.0 MiB margin "
        "(memory.shm_margin_bytes)"
    )


def test_a_load_that_leaves_exactly_the_margin_passes() -> None:
    assert check(MIB, "size", gpu_free=None, host_available=None, shm=need(instances=8)).ok


def test_a_backend_without_shared_memory_or_an_unreadable_shm_is_not_checked() -> None:
    assert need(backend="onnxruntime") is None
    assert need(free=None) is None
    assert check(MIB, "size", gpu_free=None, host_available=None, shm=None).ok


def test_the_message_names_the_mount_that_was_read() -> None:
    """memory.shm_path may point elsewhere (where a pod mounts Triton's /dev/shm)."""
    found = shm_need(
        "python",
        9,
        per_instance=MIB,
        backends=("python",),
        free=40 * MIB,
        margin=32 * MIB,
        where="/triton-shm",
    )
    assert found is not None
    assert "of /triton-shm (9 instances" in found.problem()
    assert "but /triton-shm has 40.0 MiB free" in found.problem()
