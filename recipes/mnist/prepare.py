"""Finds or fetches MNIST once, before a cluster starts; no TensorFlow here.

The demo driver calls :func:`prepare_mnist` before it launches any task, and
hands the tasks exactly one source (gin bindings of ``MnistTrainer``):

1. the four IDX files in ``idx_dir``, when the user passed one and it holds them;
2. a TFDS data directory in which ``mnist`` was already prepared;
3. the IDX files in the cache directory, downloaded by an earlier run;
4. a fresh download of the four IDX files into the cache directory: one short
   attempt (a few seconds), so that an offline machine falls back at once;
5. else the labelled offline fallback (scikit-learn's 8x8 digits), exactly as
   ``recipes.mnist.data`` has always provided it.

The tasks never download: on a cluster node without internet a download would
only hang or fail obscurely. Everything here is plain Python (``urllib``), so
the driver starts no TensorFlow and prints none of its start-up lines.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

#: Where TFDS fetches MNIST from (a mirror of the original site).
MNIST_URL = "https://storage.googleapis.com/cvdf-datasets/mnist/"

#: The four IDX files per split, as published (``t10k`` is the test split).
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

#: The TFDS version of mnist that ``tfds.load('mnist')`` reads.
TFDS_MNIST_VERSION = "3.0.1"

TFDS_LABEL = "MNIST (TFDS)"
FALLBACK_LABEL = "OFFLINE FALLBACK: scikit-learn 8x8 digits upscaled to 28x28 (not MNIST)"

#: Seconds a download attempt may wait for the server (connection, then each read).
DEFAULT_TIMEOUT_S = 3.0


def idx_label(directory: str) -> str:
    return f"MNIST (IDX files in {directory})"


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/tfdist_trainer/mnist`` (``~/.cache/...`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tfdist_trainer", "mnist")


def default_tfds_data_dir() -> str:
    return os.environ.get("TFDS_DATA_DIR") or os.path.join(
        os.path.expanduser("~"), "tensorflow_datasets"
    )


def has_idx_files(directory: str | None) -> bool:
    """All four files (plain or .gz) are in ``directory``, a local path."""
    if not directory:
        return False
    names = [n for pair in IDX_FILES.values() for n in pair]
    return all(
        os.path.isfile(os.path.join(directory, n))
        or os.path.isfile(os.path.join(directory, n + ".gz"))
        for n in names
    )


def tfds_prepared(data_dir: str | None) -> bool:
    """TFDS has prepared mnist in ``data_dir`` (``None``: TFDS' default), as ``tfds.load`` reads it."""
    root = data_dir or default_tfds_data_dir()
    return os.path.isfile(os.path.join(root, "mnist", TFDS_MNIST_VERSION, "dataset_info.json"))


@dataclasses.dataclass(frozen=True)
class Prepared:
    """The one source the tasks read, and how it was found."""

    source: str  # 'idx', 'tfds' or 'digits' (MnistTrainer.data_source)
    label: str  # what every report says about the data
    how: str  # one phrase: where it was found, or why the fallback
    idx_dir: str | None = None
    tfds_data_dir: str | None = None
    seconds: float = 0.0  # time spent finding or downloading it

    @property
    def is_mnist(self) -> bool:
        return self.source != "digits"

    @property
    def short_label(self) -> str:
        """The data in a few words, for the console and the results table."""
        return {"idx": "MNIST (IDX)", "tfds": "MNIST (TFDS)"}.get(
            self.source, "OFFLINE FALLBACK (not MNIST)"
        )

    def gin_bindings(self) -> list[str]:
        """``--gin_bindings`` flags that make every task read exactly this source."""
        flags = [f"--gin_bindings=MnistTrainer.data_source='{self.source}'"]
        if self.idx_dir:
            flags.append(f"--gin_bindings=MnistTrainer.idx_dir='{self.idx_dir}'")
        if self.tfds_data_dir:
            flags.append(f"--gin_bindings=MnistTrainer.tfds_data_dir='{self.tfds_data_dir}'")
        return flags


class DownloadError(OSError):
    """MNIST could not be fetched; the message says why in a few words."""


def _known_sha256() -> dict[str, str]:
    """File name -> sha256 of the official files, from TFDS' checksum list (when TFDS is installed)."""
    spec = importlib.util.find_spec("tensorflow_datasets")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = os.path.join(spec.submodule_search_locations[0], "url_checksums", "mnist.txt")
    sums = {}
    try:
        with open(path) as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 3 and fields[0].startswith(MNIST_URL):
                    sums[fields[0][len(MNIST_URL) :]] = fields[2]
    except OSError:
        return {}
    return sums


def _fetch(url: str, dest: str, timeout_s: float, sha256: str | None) -> None:
    """Downloads ``url`` to ``dest`` (atomically: a partial file never takes its name)."""
    partial = f"{dest}.partial-{os.getpid()}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response, open(partial, "wb") as f:
            digest = hashlib.sha256()
            while chunk := response.read(1 << 16):
                digest.update(chunk)
                f.write(chunk)
        with open(partial, "rb") as f:
            if f.read(2) != b"\x1f\x8b":
                raise DownloadError(f"{url} is not a gzip file")
        if sha256 and digest.hexdigest() != sha256:
            raise DownloadError(f"{url} has sha256 {digest.hexdigest()}, expected {sha256}")
        os.replace(partial, dest)
    except urllib.error.HTTPError as e:
        raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:  # the host: unknown, unreachable, refused
        host = urllib.parse.urlsplit(url).netloc
        raise DownloadError(f"{host}: {getattr(e.reason, 'strerror', None) or e.reason}") from None
    except (OSError, ValueError) as e:  # timeouts, resets, HTTP errors (URLError above), bad URL
        if isinstance(e, DownloadError):
            raise
        raise DownloadError(f"{url}: {e}") from None
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def download_idx(
    cache_dir: str, *, base_url: str = MNIST_URL, timeout_s: float = DEFAULT_TIMEOUT_S
):
    """Fetches the four gzipped IDX files into ``cache_dir``; raises DownloadError quickly when offline.

    The smallest file goes first, in a thread that gets ``timeout_s`` in all
    (a resolver that hangs is cut short too); the others follow only once the
    server has answered.
    """
    os.makedirs(cache_dir, exist_ok=True)
    base_url = base_url if base_url.endswith("/") else base_url + "/"
    sums = _known_sha256() if base_url == MNIST_URL else {}
    # Smallest first: the test labels are 4.5 KB, the training images 9.9 MB.
    first, *rest = (
        f"{IDX_FILES['test'][1]}.gz",
        f"{IDX_FILES['train'][1]}.gz",
        f"{IDX_FILES['test'][0]}.gz",
        f"{IDX_FILES['train'][0]}.gz",
    )
    outcome: list[BaseException | None] = []

    def first_contact() -> None:
        try:
            _fetch(base_url + first, os.path.join(cache_dir, first), timeout_s, sums.get(first))
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001  (handed to the caller's thread)
            outcome.append(e)

    thread = threading.Thread(target=first_contact, daemon=True)
    thread.start()
    thread.join(timeout_s + 0.5)
    if not outcome:
        raise DownloadError(f"no answer from {base_url} within {timeout_s:g}s")
    if outcome[0] is not None:
        raise outcome[0]
    for name in rest:
        dest = os.path.join(cache_dir, name)
        if not os.path.isfile(dest):
            _fetch(base_url + name, dest, timeout_s, sums.get(name))


def prepare_mnist(
    *,
    idx_dir: str | None = None,
    tfds_data_dir: str | None = None,
    cache_dir: str | None = None,
    base_url: str = MNIST_URL,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    download: bool = True,
) -> Prepared:
    """Picks the one source every task will read (see the module docstring for the order)."""
    start = time.monotonic()
    cache_dir = cache_dir or default_cache_dir()

    def done(source: str, label: str, how: str, **dirs) -> Prepared:
        return Prepared(source, label, how, seconds=time.monotonic() - start, **dirs)

    if has_idx_files(idx_dir):
        return done("idx", idx_label(idx_dir), f"IDX files in {idx_dir}", idx_dir=idx_dir)
    if tfds_prepared(tfds_data_dir):
        where = tfds_data_dir or default_tfds_data_dir()
        return done("tfds", TFDS_LABEL, f"TFDS data in {where}", tfds_data_dir=tfds_data_dir)
    if has_idx_files(cache_dir):
        return done(
            "idx", idx_label(cache_dir), f"IDX files cached in {cache_dir}", idx_dir=cache_dir
        )
    if not download:
        return done("digits", FALLBACK_LABEL, "downloads are off")
    try:
        download_idx(cache_dir, base_url=base_url, timeout_s=timeout_s)
    except DownloadError as e:
        return done("digits", FALLBACK_LABEL, f"download failed: {e}")
    return done(
        "idx",
        idx_label(cache_dir),
        f"downloaded to {cache_dir} in {time.monotonic() - start:.1f}s",
        idx_dir=cache_dir,
    )
