//! Evidence vouches for a file's bytes through its identity (inode, size, times). A process that
//! holds the file open for writing, or mapped writable and shared, changes the bytes without
//! changing any of those; so evidence is recorded for, and opened through, only files that
//! nobody but the caller could have opened for writing: owned by the caller, with no group or
//! other write bit, beneath directories of the artifact that are the caller's alone too (a
//! directory another can write lets them swap names around, and holds files they made).

/// The write bits of the group and of others.
const GROUP_OR_OTHER_WRITE: u32 = 0o022;

/// Who besides `caller` can write an object of owner `uid` and permission bits `mode`, in
/// words; `None` when nobody.
pub(crate) fn other_writers(uid: u32, mode: u32, caller: u32) -> Option<String> {
    let mode = mode & 0o7777;
    if uid != caller {
        return Some(format!("its owner (uid {uid}; you are uid {caller})"));
    }
    (mode & GROUP_OR_OTHER_WRITE != 0).then(|| {
        let whom = match (mode & 0o020 != 0, mode & 0o002 != 0) {
            (true, true) => "its group and everyone",
            (true, false) => "its group",
            _ => "everyone",
        };
        format!("{whom} (mode {mode:04o})")
    })
}

/// The caller's effective user id: the one the kernel checks writes against.
pub(crate) fn caller() -> u32 {
    rustix::process::geteuid().as_raw()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_callers_own_objects_without_group_or_other_write_bits_are_sole_written() {
        let me = 1000;
        for mode in [0o100644, 0o600, 0o444, 0o40755, 0o4755] {
            assert_eq!(other_writers(me, mode, me), None, "{mode:o}");
        }
        let group = other_writers(me, 0o100664, me).unwrap();
        assert_eq!(group, "its group (mode 0664)");
        assert_eq!(
            other_writers(me, 0o646, me).unwrap(),
            "everyone (mode 0646)"
        );
        let both = other_writers(me, 0o40777, me).unwrap();
        assert_eq!(both, "its group and everyone (mode 0777)");
        let owner = other_writers(0, 0o600, me).unwrap();
        assert_eq!(owner, "its owner (uid 0; you are uid 1000)");
    }

    /// A file the process makes is owned by the user the kernel checks its writes against.
    #[test]
    fn the_caller_is_the_owner_of_what_it_makes() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("mine"), b"").unwrap();
        let owner = std::fs::metadata(dir.path().join("mine")).unwrap().uid();
        assert_eq!(caller(), owner);
    }
}
