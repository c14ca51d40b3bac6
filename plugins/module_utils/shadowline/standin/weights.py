"""Model weights the CPU way: read safetensors, cut a tensor-parallel shard, hold it in a sealed memfd.

A shard is what one GPU of a TP-``T`` engine holds: for every tensor of two or more dimensions, a
contiguous range of rows (dim 0 split in ``T`` near-equal parts); 1-D tensors are replicated. It
lives in a memfd sealed against writes, so every process that maps it (the GMS server's clients)
shares the same pages read-only, and the pages live while any descriptor or mapping remains.

The safetensors container is parsed with the stdlib (8-byte little-endian header length, JSON
header, raw data), so loading needs neither torch nor the safetensors package.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import mmap
import os
import struct
import time
from dataclasses import dataclass
from typing import Any

ALIGN = 64
DTYPE_SIZES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
    "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8,
}
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL


class WeightsError(RuntimeError):
    pass


def model_files(model_dir: str) -> list[str]:
    """The safetensors files of a model dir (from its index when there is one)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
    else:
        names = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))
    if not names:
        raise WeightsError(f"no safetensors weights in {model_dir}")
    return [os.path.join(model_dir, n) for n in names]


def read_header(fd: int) -> tuple[dict[str, Any], int]:
    """(tensor table, byte offset of the data section) of an open safetensors file."""
    (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
    header = json.loads(os.pread(fd, n, 8))
    header.pop("__metadata__", None)
    return header, 8 + n


def row_range(rows: int, tp_size: int, tp_rank: int) -> tuple[int, int]:
    base, extra = divmod(rows, tp_size)
    start = tp_rank * base + min(tp_rank, extra)
    return start, start + base + (1 if tp_rank < extra else 0)


@dataclass
class Shard:
    """A shard in a sealed memfd, with the header a GMS publication carries."""

    fd: int
    header: dict[str, Any]

    @property
    def size(self) -> int:
        return int(self.header["size"])


def build_shard(model_dir: str, tp_size: int, tp_rank: int, gpu: str, identity: dict[str, Any]) -> Shard:
    """Read this rank's rows of every tensor from disk into a new sealed memfd."""
    started = time.monotonic()
    plan: list[tuple[str, int, int, int, dict[str, Any]]] = []  # (file, src offset, nbytes, dst, entry)
    offset = 0
    for path in model_files(model_dir):
        fd = os.open(path, os.O_RDONLY)
        try:
            table, data_start = read_header(fd)
        finally:
            os.close(fd)
        for name in sorted(table, key=lambda k: table[k]["data_offsets"][0]):
            t = table[name]
            shape = list(t["shape"])
            begin, end = t["data_offsets"]
            if len(shape) >= 2:
                row_bytes = (end - begin) // shape[0]
                r0, r1 = row_range(shape[0], tp_size, tp_rank)
                src, nbytes, shape = data_start + begin + r0 * row_bytes, (r1 - r0) * row_bytes, [r1 - r0, *shape[1:]]
            else:
                src, nbytes = data_start + begin, end - begin
            entry = {"name": name, "dtype": t["dtype"], "shape": shape, "offset": offset, "nbytes": nbytes}
            plan.append((path, src, nbytes, offset, entry))
            offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN
    size = max(offset, 1)

    memfd = os.memfd_create(f"shadowline-weights-{gpu}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(memfd, size)
        digest = hashlib.sha256()
        current_path, src_fd = None, -1
        for path, src, nbytes, dst, _entry in plan:
            if path != current_path:
                if src_fd >= 0:
                    os.close(src_fd)
                src_fd, current_path = os.open(path, os.O_RDONLY), path
            data = os.pread(src_fd, nbytes, src)
            if len(data) != nbytes:
                raise WeightsError(f"{path}: short read at {src}")
            os.pwrite(memfd, data, dst)
        if src_fd >= 0:
            os.close(src_fd)
        with mmap.mmap(memfd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as mm:
            digest.update(mm)
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, SEALS)
    except BaseException:
        os.close(memfd)
        raise
    header = {
        **identity,
        "gpu": gpu,
        "tp_size": tp_size,
        "tp_rank": tp_rank,
        "size": size,
        "digest": "sha256:" + digest.hexdigest(),
        "tensors": [entry for *_rest, entry in plan],
        "load_seconds": round(time.monotonic() - started, 4),
    }
    return Shard(memfd, header)


@dataclass
class MappedShard:
    """A shard mapped read-only into this process; the mapping keeps the pages alive."""

    header: dict[str, Any]
    view: mmap.mmap

    def tensor_bytes(self, name: str) -> memoryview:
        for t in self.header["tensors"]:
            if t["name"] == name:
                return memoryview(self.view)[t["offset"]: t["offset"] + t["nbytes"]]
        raise KeyError(name)


def map_shard(fd: int, header: dict[str, Any], verify: bool = True) -> MappedShard:
    """Map a shard's memfd read-only (then the descriptor may be closed) and check its digest."""
    size = int(header["size"])
    if os.fstat(fd).st_size < size:
        raise WeightsError(f"shard for {header.get('gpu')} is {os.fstat(fd).st_size} bytes, header says {size}")
    view = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    if verify:
        got = "sha256:" + hashlib.sha256(view).hexdigest()
        if got != header["digest"]:
            view.close()
            raise WeightsError(f"shard for {header.get('gpu')}: digest {got} != published {header['digest']}")
    return MappedShard(header, view)
