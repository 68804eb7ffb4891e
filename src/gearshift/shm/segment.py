"""A mapped POSIX shared-memory segment with a checked header.

Every segment starts with one 64-byte line:

    offset  size  field      written by
    0       8     magic      creator, last: nonzero magic means "initialised"
    8       8     layout     creator, before magic
    16      48    constants  creator, before magic (capacity, sizes: the structure's own)

Segments are created exclusively (O_CREAT|O_EXCL) with mode 0600. Attaching checks magic and
layout version: a wrong magic (another structure, garbage) or another layout version is a
LayoutError, never a misread. Nothing is unlinked implicitly (no resource tracker, no atexit):
`unlink` is an explicit act of the segment's owner, which is its creator or, once the creator is
provably dead, the controller (`Registry.reclaim`) or `cleanup`.

All cross-process publishing goes through `words[i] = v`: memoryview(mm).cast('Q') stores are
one aligned 8-byte memcpy, not torn on x86-64; struct.pack_into is not. The
stores are in program order on x86-64 (TSO); `fence()` orders them on weakly ordered CPUs.
"""

from __future__ import annotations

import errno
import mmap
import platform
import threading
from collections.abc import Sequence

import posix_ipc

from gearshift.clock import Clock, MonotonicClock
from gearshift.errors import LayoutError, NamespaceBusy

LINE = 64  # cache line: words written by different processes live on different lines
SHM_DIR = "/dev/shm"  # where Linux keeps POSIX shared memory and semaphores

MAGIC, LAYOUT, CONSTANTS = 0, 1, 2  # word indices of the common header

WEAK_ORDERING = platform.machine().lower() not in {"x86_64", "amd64", "i386", "i686"}
_fence_lock = threading.Lock()


def fence() -> None:
    """Full memory barrier on weakly ordered CPUs (a lock acquire/release pair); free on x86."""
    if WEAK_ORDERING:
        with _fence_lock:
            pass


class Segment:
    """One mapped segment. Views of `mm` made by its user must be dropped before `close`."""

    def __init__(self, name: str, mm: mmap.mmap) -> None:
        self.name = name
        self.mm = mm
        self.words = memoryview(mm).cast("Q")

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        """Create `name` (0600, exclusive, zeroed, unsealed); NamespaceBusy if it exists."""
        assert size % LINE == 0
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
        except posix_ipc.ExistentialError:
            raise NamespaceBusy(f"shared-memory object {name} already exists") from None
        return cls(name, _map(shm))

    def seal(self, magic: int, layout: int, constants: Sequence[int]) -> Segment:
        """Write the header, magic last: from then on `attach` accepts the segment."""
        assert len(constants) <= LINE // 8 - CONSTANTS
        for index, value in enumerate(constants, CONSTANTS):
            self.words[index] = value
        self.words[LAYOUT] = layout
        fence()
        self.words[MAGIC] = magic
        return self

    @classmethod
    def attach(
        cls,
        name: str,
        magic: int,
        layout: int,
        clock: Clock | None = None,
        timeout: float = 1.0,
    ) -> Segment:
        """Map an existing segment after checking its header.

        Waits up to `timeout` for a creator that is still initialising it; FileNotFoundError if
        it does not exist, LayoutError if its magic or layout version is not `magic`/`layout`.
        """
        clock = clock or MonotonicClock()
        deadline = clock.now() + timeout
        while True:
            try:
                shm = posix_ipc.SharedMemory(name)
            except posix_ipc.ExistentialError:
                raise FileNotFoundError(errno.ENOENT, "no shared-memory object", name) from None
            except posix_ipc.PermissionsError:
                raise PermissionError(errno.EACCES, "shared-memory object not ours", name) from None
            if shm.size >= LINE:
                segment = cls(name, _map(shm))
                found = segment.words[MAGIC]
                if found:
                    break
                segment.close()
            else:
                shm.close_fd()
            if clock.now() >= deadline:
                raise LayoutError(f"{name}: not initialised by its creator within {timeout} s")
            clock.sleep(0.001)
        found_layout = segment.words[LAYOUT]
        if found != magic or found_layout != layout:
            segment.close()
            if found != magic:
                raise LayoutError(f"{name}: magic {found:#x}, expected {magic:#x}")
            raise LayoutError(f"{name}: layout version {found_layout}, gearshift reads {layout}")
        return segment

    def require(self, valid: bool, size: int) -> Segment:
        """Self, if its header constants are `valid` and describe at most its real size;
        otherwise unmap and raise LayoutError (attach checks these before trusting them)."""
        if valid and size <= len(self.mm):
            return self
        found = list(self.words[CONSTANTS : LINE // 8])
        self.close()
        raise LayoutError(f"{self.name}: header constants {found} do not fit its layout or size")

    def close(self) -> None:
        """Unmap (the object stays; see `unlink`)."""
        self.words.release()
        self.mm.close()

    def unlink(self) -> bool:
        return unlink(self.name)


def unlink(name: str) -> bool:
    """Remove shared-memory object `name`; False if it was already gone."""
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        return False
    return True


def exists(name: str) -> bool:
    try:
        posix_ipc.SharedMemory(name).close_fd()
    except posix_ipc.ExistentialError:
        return False
    return True


def _map(shm: posix_ipc.SharedMemory) -> mmap.mmap:
    try:
        return mmap.mmap(shm.fd, shm.size)
    finally:
        shm.close_fd()
