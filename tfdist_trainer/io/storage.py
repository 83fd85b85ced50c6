"""Everything read or written under model_dir, through TensorFlow's file systems.

model_dir may be a local path or a URI that only `tf.io.gfile` understands:
``gs://`` (built into TensorFlow), ``s3://`` and ``hdfs://`` (with the
tensorflow-io package, imported here when such a path is used), ``file://``
or the in-memory, per-process ``ram://``. Python's
`open`, `os` and `shutil` would treat such a URI as a relative path (a folder
named ``gs:`` in the working directory), so this module is the one place in
the package that touches model_dir; everything else goes through it.

Object stores have no append and no reliable modification time: callers
rewrite whole (small) files, and never compare clocks. TensorFlow is imported
inside the functions, so that importing this module starts nothing (the CLI
checks its flags, and the launcher plans its tasks, before TF starts).
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import threading
import time
import uuid

from tfdist_trainer.errors import StorageError

#: Schemes whose rename is a copy and a delete; an object written in one request is already atomic.
_OBJECT_STORES = ("gs://", "s3://")


#: Schemes that TensorFlow itself lacks and the tensorflow-io package registers when it is imported.
_TENSORFLOW_IO_SCHEMES = ("s3://", "hdfs://", "az://")
_tensorflow_io_tried = False


def _gfile(path: str):
    """tf.io.gfile, after importing tensorflow-io (when installed) for a scheme only it provides."""
    global _tensorflow_io_tried
    import tensorflow as tf

    if path.startswith(_TENSORFLOW_IO_SCHEMES) and not _tensorflow_io_tried:
        _tensorflow_io_tried = True
        try:
            import tensorflow_io  # noqa: F401  (registers s3://, hdfs://, az:// for the whole process)
        except Exception:  # noqa: BLE001  not installed, or built for another TF: the error names the package
            pass
    return tf.io.gfile


def _errors():
    import tensorflow as tf

    return tf.errors


def write_errors() -> tuple[type[BaseException], ...]:
    """What a failed write under model_dir raises: OSError, or TensorFlow's OpError from tf.io.gfile.

    For `except storage.write_errors() as e:` (evaluated only when something was raised), so
    a caller that writes through gfile needs no TensorFlow import of its own.
    """
    return (OSError, _errors().OpError)


def join(path: str, *parts: str) -> str:
    """Joins with '/' for a URI (``gs://b/run`` + ``logs``), with os.path.join for a local path."""
    return posixpath.join(path, *parts) if "://" in path else os.path.join(path, *parts)


def dirname(path: str) -> str:
    return posixpath.dirname(path) if "://" in path else os.path.dirname(path)


def local_path(path: str) -> str | None:
    """The path on this machine's disk for a plain path or a ``file://`` URI; None for any other URI."""
    if path.startswith("file://"):
        return path[len("file://") :]
    return None if "://" in path else path


@contextlib.contextmanager
def _one_line(path: str):
    """Turns TensorFlow's file system errors into a one-line StorageError."""
    try:
        yield
    except _errors().OpError as e:
        message = (e.message or type(e).__name__).strip().splitlines()[0]
        if isinstance(e, _errors().UnimplementedError) and "://" in path:
            scheme = path.split("://", 1)[0]
            message += (
                f"; {scheme}:// needs the tensorflow-io package, in a release built for this TensorFlow"
                if f"{scheme}://" in _TENSORFLOW_IO_SCHEMES
                else f"; TensorFlow has no {scheme}:// file system"
            )
        raise StorageError(message) from None


def exists(path: str) -> bool:
    """Whether `path` exists; StorageError when its file system cannot be reached."""
    with _one_line(path):
        return _gfile(path).exists(path)


def isdir(path: str) -> bool:
    with _one_line(path):
        return _gfile(path).isdir(path)


def makedirs(path: str, *, private: bool = False) -> None:
    """Creates `path` and missing parents; `private` makes it readable by this user only (0o700) if it
    is local and was created here (a directory the user already had keeps its mode).

    Raises StorageError (an OSError, one line) when it cannot: a file by that
    name, no permission, an unknown scheme, no credentials.
    """
    local = local_path(path)
    created = private and local is not None and not os.path.isdir(local)
    with _one_line(path):
        _gfile(path).makedirs(path)
    if created:
        os.chmod(local, 0o700)


def make_private_dir(path: str) -> None:
    """Creates `path` (and missing parents); a local one is made (or tightened to) user-only, 0o700.

    For directories that only this package writes, such as the launcher's logs:
    logs may hold paths, hostnames and anything a Trainer prints.
    """
    makedirs(path)
    local = local_path(path)
    if local is not None:
        os.chmod(local, 0o700)


def listdir(path: str) -> list[str]:
    """Entry names in `path` (directories without a trailing slash); [] when it does not exist."""
    try:
        return sorted(name.rstrip("/") for name in _gfile(path).listdir(path))
    except _errors().NotFoundError:
        return []


def glob(pattern: str) -> list[str]:
    return _gfile(pattern).glob(pattern)


def read_text(path: str) -> str | None:
    """The file's text, or None when it does not exist."""
    try:
        with _gfile(path).GFile(path, "r") as f:
            return f.read()
    except _errors().NotFoundError:
        return None


def write_text(path: str, text: str) -> None:
    """Replaces `path` with `text` so that a reader sees the old or the new content, never a part.

    Where the file system renames atomically (local disk, ``file://``,
    ``hdfs://``, ``ram://``) the text goes to a uniquely named temporary file
    renamed over `path`; on an object store (``gs://``, ``s3://``) an object
    written in one request is already atomic and a rename would be a copy and
    a delete, so it is written in place.
    """
    gfile = _gfile(path)
    target = f"{path}.tmp-{uuid.uuid4().hex[:12]}" if _has_atomic_move(path) else path
    try:
        with gfile.GFile(target, "w") as f:
            f.write(text)
        if target != path:
            gfile.rename(target, path, overwrite=True)
    except BaseException:
        if target != path:
            remove(target)
        raise


def _has_atomic_move(path: str) -> bool:
    # Not tensorflow's file_io.has_atomic_move: on TF 2.21 it answers True for gs:// too.
    return not path.startswith(_OBJECT_STORES)


def rename(src: str, dst: str, *, overwrite: bool = False) -> None:
    """Renames a file or a directory (atomic where the file system renames atomically)."""
    with _one_line(src):
        _gfile(src).rename(src, dst, overwrite=overwrite)


def has_atomic_rename(path: str) -> bool:
    """Whether a rename under `path` is atomic (local disk, ``file://``, ``hdfs://``, ``ram://``),
    not a copy and a delete (``gs://``, ``s3://``)."""
    return _has_atomic_move(path)


@contextlib.contextmanager
def atomic_directory(path: str):
    """Yields a directory to fill; when the block ends without an error its content is at `path`.

    Where renames are atomic the content is written into a uniquely named
    ``.tmp-*`` sibling that is renamed to `path` at the end (an existing
    `path` is replaced), so a reader sees the whole directory or none of it.
    On an object store a directory rename would copy every object, so the
    block writes into `path` itself: the caller then writes a small file last
    as the commit mark, and readers skip a directory without it. A block that
    fails leaves nothing behind.
    """
    atomic = _has_atomic_move(path)
    target = (
        join(dirname(path), f".tmp-{posixpath.basename(path)}-{uuid.uuid4().hex[:12]}")
        if atomic
        else path
    )
    if not atomic:
        rmtree(path)
    makedirs(target)
    try:
        yield target
        if atomic:
            if exists(path):
                rmtree(path)
            rename(target, path)
    except BaseException:
        rmtree(target)
        raise


def read_json(path: str):
    """The JSON value stored at `path`, or None when the file is missing or torn."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def write_json(path: str, value) -> None:
    """Replaces `path` with `value` as JSON, atomically (see write_text)."""
    write_text(path, json.dumps(value, indent=1, sort_keys=True) + "\n")


def remove(path: str) -> None:
    """Deletes a file; a missing one is fine."""
    try:
        _gfile(path).remove(path)
    except _errors().NotFoundError:
        pass


def rmtree(path: str) -> None:
    """Deletes a directory and everything under it; a missing one is fine."""
    try:
        _gfile(path).rmtree(path)
    except _errors().NotFoundError:
        pass


class LogCopy:
    """A copy of one task's output under model_dir/logs: a plain file on a local disk (so that a
    process without TensorFlow, tfdist-train's console, can keep one), `tf.io.gfile` elsewhere.

    One writer per task stays open for the whole job (a restarted task writes
    on into the same log). Why not reopen and append per line: object stores
    have no append, and TensorFlow's GCS writer uploads the whole object on
    every flush. So the writer flushes after every line on a local disk (a
    `tail -f` sees it at once and a killed launcher loses nothing), and at most
    every `remote_flush_s` seconds elsewhere, plus when the log is closed at
    the end of the job. A local log is appended to (a launcher run again on the
    same model_dir keeps the earlier output) and readable by this user only; a
    remote one is replaced, since objects cannot be appended to.
    """

    def __init__(self, path: str, *, remote_flush_s: float = 10.0):
        self.path = path
        local = local_path(path)
        self._flush_every_s = 0.0 if local is not None else remote_flush_s
        self._lock = threading.Lock()
        self._last_flush = time.monotonic()
        if local is not None:
            # created user-only before any output: logs hold paths, hosts and what a Trainer prints
            descriptor = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.chmod(local, 0o600)  # a log an older run left with a wider mode
            self._file = os.fdopen(descriptor, "ab")
        else:
            self._file = _gfile(path).GFile(path, "wb")

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._file is None:
                return
            self._file.write(data)
            now = time.monotonic()
            if now - self._last_flush >= self._flush_every_s:
                self._file.flush()
                self._last_flush = now

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
