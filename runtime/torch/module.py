"""Minimal device module (torch.npu) when runtime.torch is used without torch_npu."""
NPUSIM = True


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    import runtime
    return runtime.device_count()


def current_device() -> int:
    from .device import current
    return current()


def manual_seed_all(seed) -> None:
    pass
