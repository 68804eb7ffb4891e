"""A mapped POSIX shared-memory segment with a checked header.

Every segment starts with one 64-byte line:

    offset  size  field      written by
    0       8     magic      creator, last: nonzero magic means "initialised"
    8       8     layout     creator, before magic
    16      48    constants  creator, before magic (capacity, sizes: the structure's own)

Segments are created exclusively (O_CREAT|O_EXCL) with mode 0600. Creating or attaching checks
the object's owner first (`owned`): another user's object, or one with group or other mode bits,
is a NotOwned refusal naming it and its owner, never mapped. Attaching then checks magic and
layout version: a wrong magic (another structure, garbage) or another layout version is a
LayoutError, never a misread.

Every segment is backed whole from its creation: tmpfs gives a sparse object a page when it is
first touched, and a touch that finds /dev/shm full is SIGBUS, so `create` reserves every page
(`posix_fallocate`) before it seals the header; no room is a SpaceError naming the segment and
the bytes it needs, and the half-made object is removed. `attach` reads the magic with `pread`
before mapping (a hole reads as zero there, unallocated), so waiting on an unsealed segment
touches no page; once sealed, the creator has reserved it all.

Nothing is unlinked implicitly (no resource tracker, no atexit): `unlink` is an explicit act of
the segment's owner, which is its creator or, once the creator is provably dead, the controller
(`Registry.reclaim`) or `cleanup`, and it removes the name only
while it still names the object this process mapped (same inode).

All cross-process publishing goes through `words[i] = v`: memoryview(mm).cast('Q') stores are
one aligned 8-byte memcpy, not torn on x86-64; struct.pack_into is not. The
stores are in program order on x86-64 (TSO); `fence()` orders them on weakly ordered CPUs,
where it is a sequentially consistent thread fence (`atomicshm.fence`, a `dmb ish` on aarch64:
every access before it is ordered before every access after it). A lock acquire/release pair
would not do: an acquire keeps later accesses after it and a release earlier ones before it,
but a store after the release (a ring's head) may still pass stores before the acquire (its
record). Without atomicshm (not installed on a weakly ordered host) the lock pair stays, with
a warning.
"""

from __future__ import annotations

import errno
import functools
import logging
import mmap
import os
import platform
import stat
import sys
import threading
from collections.abc import Callable, Sequence

import posix_ipc

from gearshift.clock import Clock, MonotonicClock
from gearshift.errors import LayoutError, NamespaceBusy, NotOwned, SpaceError, Unsealed

LINE = 64  # cache line: words written by different processes live on different lines
SHM_DIR = "/dev/shm"  # where Linux keeps POSIX shared memory and semaphores

MAGIC, LAYOUT, CONSTANTS = 0, 1, 2  # word indices of the common header
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # what a full tmpfs answers

WEAK_ORDERING = platform.machine().lower() not in {"x86_64", "amd64", "i386", "i686"}
_fence_lock = threading.Lock()


def full_fence(weak: bool) -> Callable[[], None]:
    """The fence of a CPU that orders stores (`weak` False: nothing to do) or does not."""
    if not weak:
        return lambda: None
    try:
        import atomicshm
    except ImportError:
        logging.getLogger(__name__).warning(
            "atomicshm is not installed: shared-memory fences are a lock acquire/release "
            "pair, not a full barrier, on this %s host", platform.machine())

        def locked() -> None:
            with _fence_lock:
                pass

        return locked
    return functools.partial(atomicshm.fence, atomicshm.SEQ_CST)


fence = full_fence(WEAK_ORDERING)
fence.__doc__ = "Full memory barrier on weakly ordered CPUs; free on x86 (module docstring)."


Inode = tuple[int, int]  # (st_dev, st_ino): which object a name stands for


def path(name: str) -> str:
    """The file of shared-memory object `name` (`/x` -> /dev/shm/x)."""
    return os.path.join(SHM_DIR, name.lstrip("/"))


def owned(name: str, info: os.stat_result) -> Inode:
    """The object's inode if this user owns it alone (our euid, no group or other mode bits);
    else NotOwned naming it, its owner and its mode."""
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid == os.geteuid() and not mode & 0o077:
        return info.st_dev, info.st_ino
    raise NotOwned(
        f"shared-memory object {name} belongs to uid {info.st_uid} with mode {mode:04o}; "
        f"gearshift uses only objects of its own user (uid {os.geteuid()}) with mode 0600"
    )


def is_ours(name: str, info: os.stat_result) -> bool:
    """`owned` as a question."""
    try:
        owned(name, info)
    except NotOwned:
        return False
    return True


def stat_of(name: str) -> os.stat_result | None:
    """The object's stat, None if it does not exist."""
    try:
        return os.stat(path(name))
    except FileNotFoundError:
        return None


class Segment:
    """One mapped segment. Views of `mm` made by its user must be dropped before `close`;
    `inode` is the object mapped (see `unlink`)."""

    def __init__(self, name: str, mm: mmap.mmap, inode: Inode) -> None:
        self.name = name
        self.mm = mm
        self.inode = inode
        self.words = memoryview(mm).cast("Q")

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        """Create `name` (0600, exclusive, zeroed, unsealed, every page reserved); NamespaceBusy
        if it exists (NotOwned if it is another user's), SpaceError if /dev/shm has no room."""
        assert size % LINE == 0
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
        except posix_ipc.ExistentialError:
            info = stat_of(name)
            if info is not None:
                owned(name, info)
            raise NamespaceBusy(f"shared-memory object {name} already exists") from None
        except posix_ipc.PermissionsError:
            raise _foreign(name) from None
        except OSError as e:  # no inode left in the tmpfs
            raise no_room(e, name, size) from None
        try:
            os.posix_fallocate(shm.fd, 0, size)
        except OSError as e:
            error, info = no_room(e, name, size), os.fstat(shm.fd)  # the room before the unlink
            shm.close_fd()
            unlink(name, (info.st_dev, info.st_ino))
            raise error from None
        return cls(name, *_map(name, shm))

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
        """Map an existing segment after checking its owner and header.

        Waits up to `timeout` (0: not at all) for a creator that is still initialising it
        (then Unsealed); FileNotFoundError if it does not exist, NotOwned if it is not this
        user's alone, LayoutError if its magic or layout version is not `magic`/`layout`.
        """
        clock = clock or MonotonicClock()
        deadline = clock.now() + timeout
        while True:
            try:
                shm = posix_ipc.SharedMemory(name)
            except posix_ipc.ExistentialError:
                raise FileNotFoundError(errno.ENOENT, "no shared-memory object", name) from None
            except posix_ipc.PermissionsError:
                raise _foreign(name) from None
            try:
                inode = owned(name, os.fstat(shm.fd))
                found = _magic(shm.fd) if shm.size >= LINE else 0
                mm = mmap.mmap(shm.fd, shm.size) if found else None
            finally:
                shm.close_fd()
            if mm is not None:
                segment = cls(name, mm, inode)
                break
            if clock.now() >= deadline:
                raise Unsealed(f"{name}: not initialised by its creator within {timeout} s")
            clock.sleep(0.001)
        found_layout = segment.words[LAYOUT]
        if found != magic or found_layout != layout:
            segment.close()
            if found != magic:
                raise LayoutError(f"{name}: magic {found:#x}, expected {magic:#x}")
            raise LayoutError(
                f"{name}: layout version {found_layout}, gearshift reads {layout}: processes of "
                "another gearshift version use this namespace; run one version on the node (stop "
                "them, then `gearshift cleanup`), or use another namespace")
        return segment

    def require(self, valid: bool, size: int) -> Segment:
        """Self, if its header constants are `valid` and describe at most its real size;
        otherwise unmap and raise LayoutError (attach checks these before trusting them)."""
        if valid and size <= len(self.mm):
            return self
        found = list(self.words[CONSTANTS : LINE // 8])
        self.close()
        raise LayoutError(f"{self.name}: header constants {found} do not fit its layout or size")

    def displaced(self) -> bool:
        """Whether its name no longer stands for this segment (removed, or replaced)."""
        info = stat_of(self.name)
        return info is None or (info.st_dev, info.st_ino) != self.inode

    def close(self) -> None:
        """Unmap (the object stays; see `unlink`)."""
        self.words.release()
        self.mm.close()

    def unlink(self) -> bool:
        """Remove the name if it still names this segment; False if it is gone or names
        another object now."""
        return unlink(self.name, self.inode)


def unlink(name: str, inode: Inode | None = None) -> bool:
    """Remove shared-memory object `name` if it is this user's (and, given `inode`, still that
    object); False if it was already gone or is another object. NotOwned if it is foreign.

    /dev/shm is sticky: no other user can remove or replace the name between the check and
    the removal (a process of this user could, within those microseconds)."""
    info = stat_of(name)
    if info is None or (inode is not None and (info.st_dev, info.st_ino) != inode):
        return False
    owned(name, info)
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        return False
    return True


def exists(name: str) -> bool:
    """Whether an object of that name exists (whoever owns it)."""
    return stat_of(name) is not None


def no_space(name: str, size: int) -> SpaceError:
    """The refusal of a segment of `size` bytes that /dev/shm has no room for."""
    try:
        fs = os.statvfs(SHM_DIR)
        room = f"{fs.f_bavail * fs.f_frsize} bytes free of its {fs.f_blocks * fs.f_frsize}"
    except OSError:
        room = "its free space unknown"
    return SpaceError(
        f"{SHM_DIR} has no room for {name}: it needs {size} bytes, {room}; make {SHM_DIR} "
        "larger (docker run --shm-size, a Kubernetes emptyDir sizeLimit) or run fewer workers"
    )


def no_room(error: BaseException, name: str, size: int) -> BaseException:
    """`error`, or the SpaceError of `name` (`no_space`) if it says that /dev/shm is full."""
    if isinstance(error, OSError) and error.errno in NO_SPACE:
        return no_space(name, size)
    return error


def _magic(fd: int) -> int:
    """The magic word of an object, read without mapping it (an unallocated page reads 0)."""
    return int.from_bytes(os.pread(fd, 8, MAGIC * 8).ljust(8, b"\0"), sys.byteorder)


def _foreign(name: str) -> NotOwned:
    """The refusal of an object this user may not open."""
    info = stat_of(name)
    if info is None:  # gone meanwhile: name it all the same
        return NotOwned(f"shared-memory object {name} is not accessible to uid {os.geteuid()}")
    try:
        owned(name, info)
    except NotOwned as e:
        return e
    return NotOwned(f"shared-memory object {name} is not accessible to uid {os.geteuid()}")


def _map(name: str, shm: posix_ipc.SharedMemory) -> tuple[mmap.mmap, Inode]:
    """Map an opened object after checking its owner on the descriptor itself."""
    try:
        inode = owned(name, os.fstat(shm.fd))
        return mmap.mmap(shm.fd, shm.size), inode
    finally:
        shm.close_fd()
