"""The state directory's checks (`controller.statedir`): a directory, lock file or state file
that another user could write (world- or group-writable) is refused naming it and its mode;
one only its owner writes is used. (A state directory others control, end to end:
tests/controller/test_state_faults.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gearshift.controller import statedir
from gearshift.errors import UnsafeStateDir

WRITABLE_BY_OTHERS = [0o777, 0o775, 0o770, 0o730, 0o702]  # 0o775, 0o770, 0o730: by the group
OWNERS_ONLY = [0o700, 0o750, 0o755, 0o711]


def opened(directory: Path) -> None:
    with statedir.opened(directory):
        pass


@pytest.mark.parametrize("mode", WRITABLE_BY_OTHERS)
def test_a_directory_others_may_write_is_refused_naming_its_mode(tmp_path: Path,
                                                                 mode: int) -> None:
    tmp_path.chmod(mode)
    with pytest.raises(UnsafeStateDir, match=f"{tmp_path} belongs to uid .* mode {mode:04o}"):
        opened(tmp_path)


@pytest.mark.parametrize("mode", OWNERS_ONLY)
def test_a_directory_only_its_owner_writes_is_used(tmp_path: Path, mode: int) -> None:
    tmp_path.chmod(mode)
    with statedir.opened(tmp_path) as fd:
        assert statedir.read(tmp_path, fd, "absent") is None


@pytest.mark.parametrize("mode", [0o666, 0o662, 0o660, 0o620, 0o602])  # 0o660, 0o620: group
def test_a_state_or_lock_file_others_may_write_is_refused(tmp_path: Path, mode: int) -> None:
    for name in ("state", "lock"):
        (tmp_path / name).write_bytes(b"x")
        (tmp_path / name).chmod(mode)
    with statedir.opened(tmp_path) as fd:
        with pytest.raises(UnsafeStateDir, match=f"state file .* mode {mode:04o}"):
            statedir.read(tmp_path, fd, "state")
        with pytest.raises(UnsafeStateDir, match=f"lock file .* mode {mode:04o}"):
            statedir.open_lock(tmp_path, fd, "lock")


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644, 0o400])
def test_a_state_file_only_its_owner_writes_is_read(tmp_path: Path, mode: int) -> None:
    (tmp_path / "state").write_bytes(b"saved")
    (tmp_path / "state").chmod(mode)
    with statedir.opened(tmp_path) as fd:
        assert statedir.read(tmp_path, fd, "state") == b"saved"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")
def test_a_directory_or_file_of_another_user_is_refused(tmp_path: Path) -> None:
    (tmp_path / "state").write_bytes(b"x")
    (tmp_path / "state").chmod(0o600)
    os.chown(tmp_path / "state", 65534, 65534)
    with statedir.opened(tmp_path) as fd, pytest.raises(
            UnsafeStateDir, match=r"state file .* belongs to uid 65534"):
        statedir.read(tmp_path, fd, "state")
    os.chown(tmp_path, 65534, 65534)
    with pytest.raises(UnsafeStateDir, match="belongs to uid 65534"):
        opened(tmp_path)
