"""How results read wherever they are shown (model cards, the Space): one wording for a missing number, one way to
write a size in bytes."""

NOT_MEASURED = "not measured"


def measured(value, pattern: str = "{:.3f}") -> str:
    """A result as text; "not measured" where there is none (never a filled-in number)."""
    return NOT_MEASURED if value is None else pattern.format(value)


def format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n:,} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
