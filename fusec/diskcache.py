"""The persistent cache: lowered programs (kernels' WGSL, buffer plan, launch grids) on disk, so a
new process skips the pass pipeline and code generation for programs it has seen.

Entries live in ``FUSEC_CACHE_DIR`` (default: ``$XDG_CACHE_HOME/fusec`` or ``~/.cache/fusec``;
``off`` disables it). Each entry is one file named by its key: the hash of everything that
changes the result (the traced program, fusec's version and code, the adapter and backend, the
device limits codegen used, the pass options). A file starts with a checksum line: an entry that
is truncated or corrupt fails the check and is ignored and removed, never loaded. Writes go to a
temporary file renamed into place, so concurrent processes only ever see whole entries. The
directory is kept under ``FUSEC_CACHE_MAX_BYTES`` (default 256 MiB) by evicting the least
recently used entries.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Optional

from .config import env_int

MAGIC = "fusec-cache-v1"
SUFFIX = ".fcache"


def cache_dir() -> Optional[Path]:
    """The cache directory, or None when the persistent cache is off."""
    raw = os.environ.get("FUSEC_CACHE_DIR")
    if raw is not None and raw.strip().lower() in ("", "0", "off", "none", "false"):
        return None
    if raw:
        return Path(raw).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fusec"


def max_bytes() -> int:
    return env_int("FUSEC_CACHE_MAX_BYTES", 256 << 20)


def key_of(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _path(key: str) -> Optional[Path]:
    d = cache_dir()
    return None if d is None else d / f"{key}{SUFFIX}"


def load(key: str) -> Optional[dict[str, Any]]:
    """The entry for ``key``, or None (missing, unreadable, truncated or corrupt: then removed)."""
    path = _path(key)
    if path is None or not path.exists():
        return None
    try:
        raw = path.read_bytes()
        head, _, body = raw.partition(b"\n")
        magic, _, digest = head.decode().partition(" ")
        if magic != MAGIC or hashlib.sha256(body).hexdigest() != digest:
            raise ValueError("checksum mismatch")
        data: dict[str, Any] = json.loads(body)
        os.utime(path)  # most recently used
        return data
    except PermissionError:
        return None  # someone else's entry: not ours to judge or remove
    except (OSError, ValueError, UnicodeDecodeError):
        try:
            path.unlink()
        except OSError:
            pass
        return None


def store(key: str, data: dict[str, Any]) -> None:
    """Write an entry atomically (temporary file, then rename), then evict to the size bound."""
    path = _path(key)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps(data, separators=(",", ":")).encode()
        head = f"{MAGIC} {hashlib.sha256(body).hexdigest()}\n".encode()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=SUFFIX)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(head + body)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a shared cache must be readable
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        evict()
    except OSError:
        pass  # a read-only or full disk must never break a computation


def entries() -> list[Path]:
    d = cache_dir()
    if d is None or not d.is_dir():
        return []
    return [p for p in d.iterdir() if p.suffix == SUFFIX and not p.name.startswith(".tmp-")]


def evict(limit: Optional[int] = None) -> int:
    """Remove least recently used entries until the directory fits ``limit`` bytes."""
    limit = max_bytes() if limit is None else limit
    files = []
    for p in entries():
        try:
            st = p.stat()
            files.append((st.st_mtime, st.st_size, p))
        except OSError:
            continue
    total = sum(s for _, s, _ in files)
    removed = 0
    for _, size, p in sorted(files, key=lambda f: f[0]):
        if total <= limit:
            break
        try:
            p.unlink()
            total -= size
            removed += 1
        except OSError:
            pass
    return removed


def info() -> dict[str, Any]:
    sizes = []
    for p in entries():
        try:
            sizes.append(p.stat().st_size)
        except OSError:  # evicted by another process meanwhile
            continue
    return {"directory": str(cache_dir()) if cache_dir() else "off",
            "entries": len(sizes), "bytes": sum(sizes), "max_bytes": max_bytes()}


def clear() -> int:
    n = 0
    for p in entries():
        try:
            p.unlink()
            n += 1
        except OSError:
            pass
    return n
