"""The fleet store: one `fsspec` URL that every node of a fleet publishes into and reads.

Layout under the URL (a plain directory, local or a shared mount, needs nothing beyond
gearshift's dependencies; `s3://` needs `s3fs`, the `s3` extra, and takes the usual AWS
credentials and `FSSPEC_S3_ENDPOINT_URL`; any other protocol its fsspec package):

    nodes/<node>/gen-<seq>-<token>.msgpack   a generation: immutable, written once
    nodes/<node>/pointer.msgpack             names the node's newest generation, written last

A publish writes the generation, then the pointer (on a local directory through a temporary
file renamed over it; an object store's PUT replaces an object whole), then removes the node's
generations but the newest KEEP: a reader that follows a pointer reads a whole generation, or
(one removed since) nothing. A node's objects expire `ttl` seconds after its last publish: a
reader ignores them (they stay until removed by hand or by the bucket's lifecycle rule).

Every read is bounded and checked (`fleetcodec`): at most MAX_NODES nodes listed, a node's
name checked, a symlink refused, a pointer over MAX_POINTER_BYTES or a generation over
MAX_OBJECT_BYTES or of another size than its pointer says refused without being read whole. A
bad node is left out with its reason (`Read.bad`), never the others. Store errors (OSError and
whatever the filesystem raises) propagate to the caller (`controller/fleet.py`), which runs
alone and retries. `redact` strips credentials from a URL before it is logged or shown,
`Store.scrub` from an error's message.
"""

from __future__ import annotations

import secrets
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from gearshift.controller.fleetcodec import (
    GENERATION,
    MAX_OBJECT_BYTES,
    MAX_POINTER_BYTES,
    NODE,
    Generation,
    decode,
    read_pointer,
)
from gearshift.errors import ConfigError, PayloadError

MAX_NODES = 1024
KEEP = 2  # a node's newest generations kept (a reader may follow the previous pointer)
POINTER = "pointer.msgpack"


def redact(url: str) -> str:
    """`url` without what may carry a secret: a user and password, a query, a fragment."""
    parts = urllib.parse.urlsplit(url)
    if not parts.scheme or parts.scheme == "file":
        return url.split("?", 1)[0]
    host = parts.hostname or ""
    if parts.port is not None:
        host += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


@dataclass
class Read:
    """One read of the store: the live generations, the nodes expired (name, publish time)
    and those left out (name, why)."""

    generations: list[Generation] = field(default_factory=list)
    expired: list[tuple[str, float]] = field(default_factory=list)
    bad: list[tuple[str, str]] = field(default_factory=list)


class Store:
    """A fleet store at `url` (module docstring); ConfigError if no filesystem serves it."""

    def __init__(self, url: str, **options: Any) -> None:
        import fsspec

        self.url = redact(url)
        parts = urllib.parse.urlsplit(url)
        values = [v for _, v in urllib.parse.parse_qsl(parts.query)]
        self._secrets = sorted({p for p in (url, parts.password, parts.username, parts.query,
                                            parts.fragment, *values) if p and p not in self.url},
                               key=len, reverse=True)
        try:
            self.fs, root = fsspec.core.url_to_fs(url, **options)
        except (ImportError, ValueError) as e:
            raise ConfigError("fleet_url", f"{self.url}: {e}") from None
        self.root = root.rstrip("/")
        self.local = "file" in _protocols(self.fs)
        self._seq = 0

    def scrub(self, text: str) -> str:
        """`text` (an error's message) with what the URL held of a secret masked."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _node_dir(self, node: str) -> str:
        return f"{self.root}/nodes/{node}"

    def publish(self, node: str, blob: bytes, published: float) -> str:
        """Write one generation of `node`, then its pointer; remove its older generations.
        Returns the generation's name."""
        from gearshift.controller.fleetcodec import pointer

        self._seq += 1
        name = f"gen-{int(published * 1000):d}{self._seq:04d}-{secrets.token_hex(8)}.msgpack"
        where = self._node_dir(node)
        if self.local:
            self.fs.makedirs(where, exist_ok=True)
        self.fs.pipe_file(f"{where}/{name}", blob)
        self._replace(f"{where}/{POINTER}", pointer(name, len(blob), published))
        self._prune(where, name)
        return name

    def _replace(self, path: str, blob: bytes) -> None:
        if not self.local:
            self.fs.pipe_file(path, blob)
            return
        temp = f"{path}.{secrets.token_hex(6)}.tmp"
        self.fs.pipe_file(temp, blob)
        self.fs.mv(temp, path)  # a rename on one filesystem: atomic

    def _prune(self, where: str, newest: str) -> None:
        names = sorted((p.rsplit("/", 1)[-1] for p in self.fs.ls(where, detail=False)),
                       key=_generation_order)
        old = [n for n in names if GENERATION.match(n) and n != newest][:-(KEEP - 1) or None]
        for n in old:
            self.fs.rm_file(f"{where}/{n}")

    def read(self, wall: float, ttl: float, skip: str | None = None) -> Read:
        """Every node's newest generation but `skip`'s, at the reader's `wall` clock; nodes
        whose last publish is over `ttl` seconds old are expired."""
        out = Read()
        self.fs.invalidate_cache()  # an object store's listings are cached: list anew
        try:
            listed = self.fs.ls(f"{self.root}/nodes", detail=False)
        except FileNotFoundError:
            return out
        names = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in listed)
        if len(names) > MAX_NODES:
            out.bad.append((f"{len(names) - MAX_NODES} more", f"over {MAX_NODES} nodes"))
        for node in names[:MAX_NODES]:
            if node == skip:
                continue
            if not NODE.match(node):
                out.bad.append((node[:60], "not a node's name"))
                continue
            try:
                where = self._node_dir(node)
                generation, size, published = read_pointer(
                    self._bounded(f"{where}/{POINTER}", MAX_POINTER_BYTES), wall)
                if wall - published > ttl:
                    out.expired.append((node, published))
                    continue
                blob = self._bounded(f"{where}/{generation}", MAX_OBJECT_BYTES, size)
                gen = decode(blob, wall)
                if gen.node != node:
                    raise PayloadError(f"a generation of {gen.node!r} under {node!r}")
                out.generations.append(gen)
            except (PayloadError, FileNotFoundError) as e:
                out.bad.append((node, f"{type(e).__name__}: {str(e)[:200]}"))
        return out

    def _bounded(self, path: str, limit: int, size: int | None = None) -> bytes:
        """The object at `path`: PayloadError for a symlink, one over `limit` bytes or of
        another size than `size`."""
        info = self.fs.info(path)
        if info.get("islink") or info.get("type") not in ("file", None):
            raise PayloadError(f"{path.rsplit('/', 1)[-1]} is not a regular object")
        got = int(info.get("size") or 0)
        if got > limit or (size is not None and got != size):
            raise PayloadError(f"{path.rsplit('/', 1)[-1]} holds {got} bytes, not "
                               f"{size if size is not None else f'at most {limit}'}")
        blob = self.fs.cat_file(path, start=0, end=limit + 1)
        if len(blob) > limit or (size is not None and len(blob) != size):
            raise PayloadError(f"{path.rsplit('/', 1)[-1]} changed size while read")
        return bytes(blob)


def _generation_order(name: str) -> tuple[int, str]:
    digits = name[4:].split("-", 1)[0] if GENERATION.match(name) else ""
    return (int(digits) if digits.isdigit() else -1, name)


def _protocols(fs: Any) -> tuple[str, ...]:
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)
