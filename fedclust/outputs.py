"""Folders fedclust writes: atomic files, a manifest of what it wrote, exclusive folders.

- **Atomic files.** :func:`write_atomic` writes a hidden temporary file beside the target
  (``.<name>.<12 hex>.part``), flushes it to disk and renames it over the target
  (``os.replace``): a reader sees the old complete file or the new complete one, never half a
  file; an error on the way removes the temporary file.
- **Durable once per simulation.** A deployed node flushes every file to disk before the
  rename (``fsync``). A simulation writes every simulated client's files too, thousands of
  them, all on one machine: inside :func:`durable_at_exit` (a run in this process, server and
  in-process clients) and under a folder that :func:`flushed_by_run` named (a simulated node
  in another process writing into the server's run folder) a write skips its own flush, and
  the run makes everything durable with a single ``os.sync()`` at its end. Atomicity does
  not change: a file still appears complete or not at all.
- **Manifest.** A run's results folder holds ``.fedclust-manifest.json``, the relative name and
  kind (``"file"`` or ``"dir"``) of everything fedclust wrote there. Every write records its name
  (and the folders above it) in the manifest of the nearest folder above it that has one,
  *before* the file appears; a folder is recorded once it was created. :func:`clear_folder`
  (``overwrite=true``) removes exactly the recorded entries, and refuses a folder that holds
  anything else, before removing anything.
- **Exclusive folders.** :func:`claim_new_folder` creates a folder with ``os.mkdir``, which
  fails when the name exists: two writers (two nodes sharing an output folder) never share one.

Hidden entries (a name starting with ``.``) are never removed and never count as foreign; at
the top of a results folder neither do ``*.log`` files (a Hydra job folder holds ``.hydra/``
and ``<job>.log``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import stat
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from fedclust.errors import BadInputError

LOG = logging.getLogger("fedclust")

MANIFEST = ".fedclust-manifest.json"
FILE, DIR = "file", "dir"
_KINDS = (FILE, DIR)
_TEMP = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{12}\.part$")
_LOCK = threading.RLock()
_DEFERRED = [0]           # open durable_at_exit() contexts of this process
_PENDING: dict[str, dict[str, str]] = {}   # manifest folder -> entries written at the exit
_FLUSHED_BY_RUN: set[str] = set()   # folders whose writer's run flushes them at its end
_O_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class OutputDirError(BadInputError, ValueError):
    """An output folder cannot be used: it holds what fedclust did not write, another run is
    writing there, or it cannot be created."""


# ---------------------------------------------------------------------------- atomic writes

@contextlib.contextmanager
def durable_at_exit() -> Iterator[None]:
    """Within: this process's atomic writes skip their own ``fsync``, and their manifest
    entries are collected and written once per manifest; at the exit of the outermost such
    context (an error included), the manifests are written and one ``os.sync()`` flushes
    everything (a simulated run: its server's and its in-process clients' files, and those of
    simulated nodes in other processes of the same machine, :func:`flushed_by_run`)."""
    with _LOCK:
        _DEFERRED[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            last = _DEFERRED[0] == 1
            if last:
                _flush_pending()
                _ROOTS.clear()
            _DEFERRED[0] -= 1
        if last:
            sync()


def flushed_by_run(folder: str | Path) -> None:
    """Writes under ``folder`` skip their own flush from now on: ``folder`` is the run folder
    of a simulation on this machine, whose server flushes it once at the end of the run
    (a simulated node's owner results, written from another process)."""
    with _LOCK:
        _FLUSHED_BY_RUN.add(os.path.join(os.path.abspath(folder), ""))


def _deferred(path: str | Path) -> bool:
    if _DEFERRED[0]:
        return True
    if not _FLUSHED_BY_RUN:
        return False
    name = os.path.abspath(path)
    return any(name.startswith(root) for root in _FLUSHED_BY_RUN)


def file_identity(st: os.stat_result) -> tuple[int, ...]:
    """What tells a file from its next version: device and inode (a replaced file, a moved
    link), size, modification and change time (an edit in place)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def sync() -> None:
    """Flush every written file of this machine to disk (one ``os.sync()``)."""
    if hasattr(os, "sync"):
        os.sync()


def _flush(fh: IO[Any], durable: bool) -> None:
    """``fh`` to the disk now (``durable``), or at the end of the run."""
    fh.flush()
    if durable:
        os.fsync(fh.fileno())


def write_atomic(path: str | Path, write: Callable[[IO[bytes]], Any]) -> Path:
    """Write ``path`` atomically: ``write(fh)`` fills a temporary file beside it, which then
    replaces ``path``. The name is recorded in the nearest manifest first (:func:`record`).

    Parameters
    ----------
    path : path
        The file to (re)write; its folder must exist.
    write : callable
        Called with a binary file object open for writing.

    The file is flushed to disk before the rename, except in a simulation, whose run flushes
    every file once at its end (:func:`durable_at_exit`, :func:`flushed_by_run`).

    Returns
    -------
    Path
        ``path``.
    """
    name = os.fspath(path)
    if os.path.isdir(name):
        raise _a_folder(name)
    record(name, FILE)

    def fill(tmp: str) -> None:
        with open(tmp, "xb") as fh:     # "x": never reuses (or follows) an existing name
            write(fh)
            _flush(fh, not _deferred(name))

    _renamed_into_place(name, fill)
    return Path(name)


def _a_folder(name: str) -> OutputDirError:
    return OutputDirError(f"{name!r} is a folder, where fedclust writes a file. Fix: "
                          f"move or rename that folder, or write elsewhere")


def _renamed_into_place(name: str, fill: Callable[[str], Any]) -> None:
    """``fill(tmp)`` makes a new file under a temporary name beside ``name``, which is then
    renamed to ``name`` (atomic: ``name`` is whole or absent); the temporary file goes on any
    failure."""
    folder, base = os.path.split(name)
    tmp = os.path.join(folder, f".{base}.{secrets.token_hex(6)}.part")
    try:
        fill(tmp)
        os.replace(tmp, name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def deferred(path: str | Path) -> bool:
    """Whether a write to ``path`` now skips its own flush: a simulation's run makes it durable
    at its end (:func:`durable_at_exit`, :func:`flushed_by_run`)."""
    return _deferred(path)


def link_file(src: str | Path, path: str | Path) -> Path:
    """``path`` as a hard link of ``src`` (a file fedclust wrote, on the same file system): the
    file :func:`write_atomic` would write with ``src``'s bytes, without writing them again.
    Atomic like it (the name appears complete or not at all, an existing ``path`` is
    replaced), recorded in the nearest manifest first. Only for a simulation's files, which
    its run makes durable once at its end (:func:`deferred`).

    Raises
    ------
    OSError
        The file system refuses the link (another device, no hard links): write the bytes.
    """
    name = os.fspath(path)
    record(name, FILE)
    try:
        os.link(src, name)
    except FileExistsError:
        if os.path.isdir(name):
            raise _a_folder(name) from None
        _renamed_into_place(name, lambda tmp: os.link(src, tmp))
    return Path(name)


def write_text(path: str | Path, text: str) -> Path:
    """``path`` holds ``text`` (UTF-8), written atomically."""
    data = text.encode("utf-8")
    return write_atomic(path, lambda fh: fh.write(data))


def json_bytes(obj: Any, indent: int | None = 2) -> bytes:
    """The bytes :func:`write_json` writes for ``obj``."""
    return json.dumps(obj, indent=indent).encode("utf-8")


def write_json(path: str | Path, obj: Any, indent: int | None = 2) -> Path:
    """``obj`` as JSON, serialised in full before the file is touched, written atomically."""
    data = json_bytes(obj, indent)
    return write_atomic(path, lambda fh: fh.write(data))


def save_npy(path: str | Path, array: Any) -> Path:
    """``numpy.save`` (no pickled objects; C order), atomically, its header written once per
    dtype and shape (:func:`fedclust.npy.dumps`)."""
    import numpy as np

    from fedclust.npy import dumps

    data = dumps(np.asarray(array))
    return write_atomic(path, lambda fh: fh.write(data))


def save_figure(fig: Any, path: str | Path, **kwargs: Any) -> Path:
    """``fig.savefig`` atomically, in the format the file name's suffix names (PNG without)."""
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    return write_atomic(path, lambda fh: fig.savefig(fh, format=fmt, **kwargs))


def append_line(path: str | Path, line: str) -> None:
    """Append one line to an append-only log (``history.jsonl``) in a single ``write``."""
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | _O_NOFOLLOW)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def make_dirs(path: str | Path) -> Path:
    """``mkdir -p path``, recording every folder it creates in the nearest manifest."""
    name = os.path.abspath(os.path.expanduser(os.fspath(path)))
    missing = []
    p = name
    while not os.path.isdir(p):
        missing.append(p)
        up = os.path.dirname(p)
        if up == p:
            break
        p = up
    for p in reversed(missing):
        try:
            os.mkdir(p)
        except FileExistsError:
            if not os.path.isdir(p):
                raise OutputDirError(f"{p!r} is a file, where fedclust needs a folder. "
                                     f"Fix: choose another folder, or move that file") from None
            continue
        record(p, DIR)
    return Path(name)


def claim_new_folder(parent: str | Path, name: str, tries: int = 100) -> Path:
    """Create ``parent/name`` exclusively (``os.mkdir``); when it exists, ``name-2``, ``name-3``,
    … with a warning. Nobody else writes in the folder returned.

    Raises
    ------
    OutputDirError
        ``tries`` names are taken.
    """
    parent = make_dirs(parent)
    for i in range(tries):
        candidate = os.path.join(parent, name if i == 0 else f"{name}-{i + 1}")
        try:
            os.mkdir(candidate)
        except FileExistsError:
            continue
        record(candidate, DIR)
        if i:
            LOG.warning("%s already exists (written by another node or run with the same "
                        "name): this node's results go to %s instead", parent / name,
                        os.path.basename(candidate))
        return Path(candidate)
    raise OutputDirError(f"the results folder already holds {name!r} and {tries - 1} "
                         f"suffixed copies of it. Allowed: a name no other writer uses. Fix: "
                         f"point this node's output-dir at a folder of its own")


def safe_name(text: str, limit: int = 64) -> str:
    """``text`` as a portable file name (letters, digits, ``._-``), or ``""``."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("._-")
    return name[:limit].rstrip("._-")


# ---------------------------------------------------------------------------- the manifest

@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Exclusive access to ``folder``'s manifest: across threads, and across processes where
    ``flock`` exists (simulated clients write into the run folder from other processes)."""
    try:
        import fcntl
    except ImportError:     # pragma: no cover - not POSIX
        fcntl = None
    with _LOCK:
        fd = os.open(folder, _O_DIR)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _clean_rel(rel: Any) -> bool:
    """A manifest name: relative, ``/``-separated, no empty, ``.`` or ``..`` part."""
    return (isinstance(rel, str) and bool(rel) and not rel.startswith("/") and "\\" not in rel
            and all(part not in ("", ".", "..") for part in rel.split("/")))


def read_manifest(folder: str | Path) -> dict[str, str] | None:
    """The entries of ``folder``'s manifest (``{relative name: kind}``), or ``None`` when the
    folder has none.

    Raises
    ------
    OutputDirError
        The manifest is not one fedclust wrote (unreadable, not JSON, bad names or kinds).
    """
    path = Path(folder) / MANIFEST
    if not path.is_file() or path.is_symlink():
        if path.is_symlink() or path.exists():
            raise OutputDirError(f"{MANIFEST} in {str(folder)!r} is not a plain file")
        return None
    pending = _PENDING.get(os.path.abspath(folder), {})
    return {**_read_entries(folder, path), **pending}


def _read_entries(folder: str | Path, path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise OutputDirError(f"{MANIFEST} in {str(folder)!r} cannot be read "
                             f"({type(exc).__name__})") from None
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or not all(
            _clean_rel(k) and v in _KINDS for k, v in entries.items()):
        raise OutputDirError(f"{MANIFEST} in {str(folder)!r} is damaged: it must map relative "
                             f"names to 'file' or 'dir'")
    return dict(entries)


def write_manifest(folder: str | Path, entries: Mapping[str, str]) -> None:
    """Replace ``folder``'s manifest (atomically)."""
    folder = Path(folder)
    _ROOTS.clear()
    text = json.dumps({"written-by": "fedclust", "version": 1,
                       "entries": dict(sorted(entries.items()))}, indent=1)
    tmp = folder / f".{MANIFEST}.{secrets.token_hex(6)}.part"
    try:
        with open(tmp, "x", encoding="utf-8") as fh:
            fh.write(text)
            _flush(fh, not _deferred(folder))
        os.replace(tmp, folder / MANIFEST)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _manifest_root(path: str | Path) -> Path | None:
    """The nearest folder above ``path`` (absolute) that holds a manifest."""
    root = _root_of(os.path.dirname(os.fspath(path)))
    return None if root is None else Path(root)


# folder -> the nearest folder at or above it with a manifest, while a durable_at_exit() context
# is open (a simulation records thousands of files in a few folders); cleared whenever
# fedclust writes a manifest and at the outermost exit
_ROOTS: dict[str, str | None] = {}


def _root_of(folder: str) -> str | None:
    """The nearest folder at or above ``folder`` (absolute) that holds a manifest."""
    cache = _DEFERRED[0] > 0
    if cache and folder in _ROOTS:
        return _ROOTS[folder]
    at = folder
    while True:
        if os.path.isfile(os.path.join(at, MANIFEST)):
            root: str | None = at
            break
        up = os.path.dirname(at)
        if up == at:
            root = None
            break
        at = up
    if cache:
        _ROOTS[folder] = root
    return root


def record(path: str | Path, kind: str) -> None:
    """Record ``path`` (and the folders between it and the manifest) in the manifest of the
    nearest folder above it that has one; nothing when there is none. A manifest that cannot
    be updated is logged and left: the entry is then not removed by a later overwrite (safe)."""
    name = os.path.abspath(os.path.expanduser(os.fspath(path)))
    root = _root_of(os.path.dirname(name))
    if root is not None:
        _record_entries(root, _entries(root, name, kind))


def _entries(root: str | Path, path: str | Path, kind: str) -> dict[str, str]:
    """The manifest entries of ``path`` (of ``kind``) and of the folders between it and
    ``root`` (both absolute)."""
    root, path = os.fspath(root), os.fspath(path)
    head = root if root.endswith(os.sep) else root + os.sep
    rel = path[len(head):] if path.startswith(head) else os.path.relpath(path, root)
    parts = rel.split(os.sep)
    wanted = {"/".join(parts[:i]): DIR for i in range(1, len(parts))}
    wanted["/".join(parts)] = kind
    return wanted


def _record_entries(root: str | Path, wanted: Mapping[str, str]) -> None:
    """Add ``wanted`` to ``root``'s manifest in one update (none when all are there); in a
    :func:`durable_at_exit` context, at its exit."""
    if _DEFERRED[0]:
        with _LOCK:
            if _DEFERRED[0]:
                _PENDING.setdefault(os.path.abspath(root), {}).update(wanted)
                return
    _write_entries(Path(root), wanted)


def _flush_pending() -> None:
    """Write the collected manifest entries, one update per manifest (under ``_LOCK``)."""
    while _PENDING:
        root, wanted = _PENDING.popitem()
        _write_entries(Path(root), wanted)


def _write_entries(root: Path, wanted: Mapping[str, str]) -> None:
    try:
        with _locked(root):
            entries = read_manifest(root) or {}
            if all(entries.get(k) == v for k, v in wanted.items()):
                return
            write_manifest(root, {**entries, **wanted})
    except (OSError, OutputDirError) as exc:
        LOG.warning("could not record %s in %s (%s): a later overwrite=true will leave it",
                    ", ".join(sorted(wanted)[:3]) + (" …" if len(wanted) > 3 else ""),
                    root / MANIFEST, exc)


def record_tree(*paths: str | Path) -> None:
    """Record folders fedclust filled elsewhere and moved here, and every plain file and
    folder in them (symbolic links are not recorded), each in the manifest of the nearest
    folder above it that has one, with one update per manifest."""
    wanted: dict[Path, dict[str, str]] = {}

    def add(item: Path, kind: str, root: Path | None) -> None:
        if root is not None:
            wanted.setdefault(root, {}).update(_entries(root, item, kind))

    for path in (Path(os.path.abspath(Path(p).expanduser())) for p in paths):
        add(path, DIR, _manifest_root(path))
        _walk_into(path, add)
    for root, entries in wanted.items():
        _record_entries(root, entries)


def _walk_into(path: Path, add: Callable[[Path, str, Path | None], None]) -> None:
    """``add(item, kind, manifest root)`` for every plain file and folder under ``path``."""
    roots: dict[str, Path | None] = {}
    for top, dirs, files in os.walk(path):
        up = os.path.dirname(top)
        parent = roots[up] if up in roots else _manifest_root(Path(top))
        # what lies in ``top`` goes to the nearest manifest at or above ``top``
        root = roots[top] = Path(top) if os.path.isfile(os.path.join(top, MANIFEST)) else parent
        for d in dirs:
            if not os.path.islink(os.path.join(top, d)):
                add(Path(top) / d, DIR, root)
        for f in files:
            if os.path.isfile(os.path.join(top, f)) and not os.path.islink(os.path.join(top, f)):
                add(Path(top) / f, FILE, root)


# ---------------------------------------------------------------------------- clearing

def _ignored(name: str, top: bool, is_file: bool) -> bool:
    """Entries that are left alone: hidden ones, and Hydra's ``*.log`` at the top."""
    return name.startswith(".") or (top and is_file and name.endswith(".log"))


def visible_entries(folder: Path, skip: tuple[str, ...] = ()) -> list[str]:
    """The names at the top of ``folder`` that count as content (sorted)."""
    names = []
    with os.scandir(folder) as it:
        for e in it:
            if e.name in skip or _ignored(e.name, True, e.is_file(follow_symlinks=False)):
                continue
            names.append(e.name)
    return sorted(names)


def _kind_of(entry: os.DirEntry) -> str:
    if entry.is_symlink():
        return "a symbolic link"
    if entry.is_dir(follow_symlinks=False):
        return "a folder"
    if entry.is_file(follow_symlinks=False):
        return "a file"
    return "a special file"


def _scan(folder: Path, entries: Mapping[str, str], skip: tuple[str, ...]
          ) -> tuple[list[str], list[str], tuple[str, str] | None]:
    """What :func:`clear_folder` removes (files, folders), or the first foreign entry
    ``(relative name, why)``; never follows a symbolic link."""
    files: list[str] = []
    dirs: list[str] = []

    def walk(current: Path, prefix: str) -> tuple[str, str] | None:
        with os.scandir(current) as it:
            items = sorted(it, key=lambda e: e.name)
        top = not prefix
        for e in items:
            rel = prefix + e.name
            if top and e.name in skip:
                continue
            regular = e.is_file(follow_symlinks=False) and not e.is_symlink()
            temp = _TEMP.match(e.name)
            if temp and regular and entries.get(prefix + temp.group("name")) == FILE:
                files.append(rel)       # a temporary file of a write that never finished
                continue
            if _ignored(e.name, top, regular):
                continue
            kind = entries.get(rel)
            if kind is None:
                return rel, (f"{_kind_of(e)} that fedclust did not write (the folder's "
                             f"{MANIFEST} does not list it)")
            if kind == FILE:
                if not regular:
                    return rel, f"now {_kind_of(e)}, where fedclust wrote a file"
                files.append(rel)
            else:
                if e.is_symlink() or not e.is_dir(follow_symlinks=False):
                    return rel, f"now {_kind_of(e)}, where fedclust made a folder"
                dirs.append(rel)
                found = walk(Path(e.path), rel + "/")
                if found:
                    return found
        return None

    return files, dirs, walk(folder, "")


def _open_dir(root_fd: int, parts: list[str]) -> int | None:
    """A descriptor of ``root/parts…``, every step without following a symbolic link."""
    fd = root_fd
    for part in parts:
        try:
            nxt = os.open(part, _O_DIR | _O_NOFOLLOW, dir_fd=fd)
        except OSError:
            nxt = None
        if fd != root_fd:
            os.close(fd)
        if nxt is None:
            return None
        fd = nxt
    return fd


def _remove(folder: Path, files: list[str], dirs: list[str]) -> set[str]:
    """Unlink ``files`` and remove the emptied ``dirs``, every step relative to a descriptor
    of its own folder (a folder swapped for a link meanwhile is not followed); returns the
    folders that are not empty (hidden entries left alone) and so stay."""
    kept: set[str] = set()
    root = os.open(folder, _O_DIR)
    try:
        for rel in files:
            *parents, name = rel.split("/")
            fd = _open_dir(root, parents)
            if fd is None:
                continue
            try:
                if stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            finally:
                if fd != root:
                    os.close(fd)
        for rel in sorted(dirs, key=lambda r: r.count("/"), reverse=True):
            *parents, name = rel.split("/")
            fd = _open_dir(root, parents)
            if fd is None:
                continue
            try:
                os.rmdir(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError:
                kept.add(rel)
            finally:
                if fd != root:
                    os.close(fd)
    finally:
        os.close(root)
    return kept


def clear_folder(folder: str | Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Remove what fedclust wrote in ``folder`` (its manifest's entries), after checking that
    the folder holds nothing else; returns the manifest entries that stay (folders left
    non-empty by hidden entries).

    Parameters
    ----------
    folder : path
        A results folder with a manifest.
    skip : tuple of str
        Top-level names to leave alone (the ``RUNNING`` marker of the run that clears).

    Raises
    ------
    OutputDirError
        No manifest, a damaged one, or an entry fedclust did not write; nothing was removed.
    """
    folder = Path(folder)
    files, dirs = check_clearable(folder, skip)
    kept = _remove(folder, files, dirs)
    return {rel: DIR for rel in kept}


def check_clearable(folder: str | Path, skip: tuple[str, ...] = ()
                    ) -> tuple[list[str], list[str]]:
    """:func:`clear_folder`'s verdict without removing anything: the files and folders it
    would remove, or its :class:`OutputDirError`."""
    folder = Path(folder)
    entries = read_manifest(folder)
    if entries is None:
        raise OutputDirError(f"output-dir {str(folder)!r} holds no {MANIFEST}")
    files, dirs, foreign = _scan(folder, entries, skip)
    if foreign is not None:
        rel, why = foreign
        raise OutputDirError(
            f"output-dir {str(folder)!r} holds {rel!r}, {why}. overwrite=true removes only "
            f"what an earlier fedclust run wrote there, so nothing was removed. Allowed: a "
            f"folder holding only an earlier run's results (hidden entries and top-level *.log "
            f"files are left alone). Fix: move {rel!r} out of the folder, or pass another "
            f"output-dir")
    return files, dirs
