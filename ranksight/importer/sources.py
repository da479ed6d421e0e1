"""Finding the artifacts in what was given (files, folders, archives) and telling each
one's kind from its content, not its name: the first format of ``formats.FORMATS``
(Flight Recorder dumps, Kineto traces, What-if Analysis traces, py-spy dumps, and text
logs as the fallback) that recognizes a file's first 64 KiB takes it.

Archives (tar of any compression, zip) are told by content too, and unpacked. Anything
else in a folder is skipped and listed; a file named on the command line that is no
artifact is an error for that file.
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import lzma
import os
import stat
import tarfile
import tempfile
import zipfile
import zlib
from dataclasses import dataclass

from ranksight.store.fit import fit_text

HEAD = 1 << 16
SIDE_FILES = ("meta",)


@dataclass(frozen=True, slots=True)
class Artifact:
    """One input file and its kind (None: not an artifact; ``why`` says what it is)."""

    path: str
    kind: str | None
    why: str = ""
    named: bool = False
    """Given on the command line by name (not found in a folder)."""
    shown: str = ""
    """How messages name it, where ``path`` is not that: ``archive.tar.gz:member``."""

    @property
    def name(self) -> str:
        """The name messages (and stored rows) give the file: valid UTF-8, a name's
        undecodable bytes shown as U+FFFD."""
        return printable(self.shown or self.path)


def head_of(path: str) -> bytes:
    """The first 64 KiB of ``path``, decompressed if gzip (what a damaged stream gives)."""
    with open(path, "rb") as f:
        data = f.read(HEAD)
    if data[:2] == b"\x1f\x8b":
        try:
            with gzip.open(path, "rb") as g:
                return g.read(HEAD)
        except (OSError, EOFError):
            try:
                return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, HEAD)
            except zlib.error:
                return b""
    return data


def sniff(path: str) -> tuple[str | None, str]:
    """(kind, reason) for the file at ``path``: the first registered format that
    recognizes its first 64 KiB (``formats.FORMATS``), else (None, why it is none)."""
    from .formats import FORMATS
    from .formats.base import json_prefix

    try:
        head = head_of(path)
    except OSError as exc:
        return None, f"cannot read: {exc.strerror or exc}"
    if not head.strip():
        with open(path, "rb") as f:
            packed = f.read(2) == b"\x1f\x8b"
        return (
            None,
            "a gzip that ends before its first line (damaged or cut short)"
            if packed
            else "empty file",
        )
    text = head.decode("utf-8", errors="replace")
    for fmt in FORMATS:
        got = fmt.recognize(head, text)
        if got == "":
            return fmt.kind, ""
        if got:
            return None, got
    if json_prefix(text):
        return None, "JSON, but neither a Kineto trace nor a Flight Recorder dump"
    return None, "binary data of no known kind"


def is_archive(path: str) -> bool:
    """A tar (plain, gzip, bzip2 or xz) or zip archive, by content whatever its name, told
    from the file's first 64 KiB and, for a zip, its end record: a tar's first header says
    ``ustar`` (POSIX and GNU tar; a pre-POSIX v7 tar is read as no archive); a zip written
    by ``torch.save`` (a checkpoint: ``*/data.pkl``) is none. A file of zeros is no
    archive (tarfile would read it as an empty one, and read all of it)."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                return not any(n.endswith("/data.pkl") or n == "data.pkl" for n in z.namelist())
        with open(path, "rb") as f:
            data = f.read(HEAD)
    except (OSError, EOFError, zipfile.BadZipFile):
        return False
    return _first_block(path, data)[257:262] == b"ustar"


def _first_block(path: str, data: bytes) -> bytes:
    """The first 512 bytes of the tar inside ``data`` (a file's first 64 KiB), inflated
    if it starts as gzip, bzip2 or xz."""
    try:
        if data[:2] == b"\x1f\x8b":
            return head_of(path)[:512]
        if data[:3] == b"BZh":
            return bz2.BZ2Decompressor().decompress(data, max_length=512)
        if data[:6] == b"\xfd7zXZ\x00":
            return lzma.LZMADecompressor().decompress(data, max_length=512)
    except (OSError, EOFError, ValueError, lzma.LZMAError):
        return b""
    return data[:512]


def extract(path: str, into: str) -> str:
    """Unpack the archive at ``path`` under ``into`` (members leaving the folder, links and
    devices refused); returns the folder. Raises ValueError naming the archive."""
    dest = os.path.join(into, os.path.basename(path) + ".d")
    os.makedirs(dest, exist_ok=True)
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                for member in z.namelist():
                    target = os.path.realpath(os.path.join(dest, member))
                    if not target.startswith(os.path.realpath(dest) + os.sep):
                        raise ValueError(f"member {member!r} leaves the archive's folder")
                z.extractall(dest)
        else:
            with tarfile.open(path) as t:
                t.extractall(dest, filter="data")
    except (
        OSError,
        EOFError,
        zlib.error,
        lzma.LZMAError,
        tarfile.TarError,
        zipfile.BadZipFile,
        ValueError,
    ) as exc:  # EOFError: a truncated .tar.gz/.tar.bz2 (the CLI would say only "Aborted.")
        raise ValueError(f"{path}: cannot unpack the archive: {exc}") from None
    return dest


def is_store_folder(path: str) -> bool:
    """A ranksight chdb store's folder (its ``runs`` and ``schema_version`` table folders),
    whose Parquet segments are no artifacts."""
    return os.path.isdir(os.path.join(path, "runs")) and os.path.isdir(
        os.path.join(path, "schema_version")
    )


def find(
    paths: list[str], workdir: str | None = None, skip: tuple[str, ...] | list[str] = ()
) -> list[Artifact]:
    """Every file under ``paths`` (folders walked, archives unpacked into ``workdir``,
    a temporary folder by default) with its kind. Walking a folder passes over hidden
    files and folders (``.name``), the folders in ``skip`` (the store being imported
    into) and any other ranksight store folder (:func:`is_store_folder`), each such
    folder listed once as skipped. Raises FileNotFoundError naming a path that does not
    exist."""
    out: list[Artifact] = []
    workdir = workdir or tempfile.mkdtemp(prefix="ranksight-import-")
    skipped = {os.path.realpath(p) for p in skip}
    for p in paths:
        if not os.path.exists(p):
            raise FileNotFoundError(f"{p}: no such file or folder")
        own = _own_folder(os.path.realpath(p), skipped)
        if own:
            out.append(Artifact(p, None, own, named=True))
        elif os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                keep = []
                for d in sorted(dirs):
                    full = os.path.join(root, d)
                    why = _own_folder(os.path.realpath(full), skipped)
                    if why:
                        out.append(Artifact(full, None, why))
                    elif not d.startswith("."):
                        keep.append(d)
                dirs[:] = keep
                for name in sorted(files):
                    if not name.startswith("."):
                        out.extend(_one(os.path.join(root, name), workdir, named=False))
        else:
            out.extend(_one(p, workdir, named=True))
    return out


def _own_folder(real: str, skipped: set[str]) -> str:
    """Why ``real`` (a resolved path) is ranksight's own and not read, or ""."""
    for s in skipped:
        if real == s or real.startswith(s + os.sep):
            return "the store being imported into"
    if os.path.isdir(real) and is_store_folder(real):
        return "a ranksight store, not an artifact"
    return ""


def printable(name: str) -> str:
    """``name`` (a path as the OS gave it, undecodable bytes as surrogates) as valid
    UTF-8 text (:func:`~ranksight.store.fit.fit_text`)."""
    return fit_text(name)


def _one(path: str, workdir: str, named: bool) -> list[Artifact]:
    try:
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except OSError as exc:
        return [Artifact(path, None, f"cannot read: {exc.strerror or exc}", named)]
    if not regular:  # a FIFO or a device: reading it could block forever
        return [Artifact(path, None, "not a regular file (a FIFO, a socket or a device)", named)]
    if is_archive(path):
        try:
            dest = extract(path, workdir)
        except ValueError as exc:
            return [Artifact(path, None, str(exc).split(": ", 1)[-1], named=True)]
        return [
            dataclasses.replace(a, shown=f"{path}:{os.path.relpath(a.path, dest)}")
            for a in find([dest], workdir)
        ]
    kind, why = sniff(path)
    return [Artifact(path, kind, why, named)]
