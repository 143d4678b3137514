"""File sizes."""

_DECIMAL = ("B", "kB", "MB", "GB", "TB", "PB")
_BINARY = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def naturalsize(size: int, binary: bool = False) -> str:
    """``1500`` -> ``"1.5 kB"``; with ``binary=True`` powers of 1024 are used (``1536`` -> ``"1.5 KiB"``)."""
    base = 1024 if binary else 1000
    units = _BINARY if binary else _DECIMAL
    value = float(size)
    index = 0
    while abs(value) >= base and index < len(units) - 1:
        value /= base
        index += 1
    if index == 0:
        return f"{size} B"
    return f"{value:.1f} {units[index]}"
