//! What names one filesystem object at one moment: device, inode, birth time, size and both
//! nanosecond timestamps. A replaced, appended-to, truncated or touched file changes at least
//! one.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;

/// One file's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileIdentity {
    pub device: u64,
    pub inode: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
    /// When the inode was made (`statx` birth time), where the filesystem records one: tells a
    /// file apart from a later one that reuses its inode number (the inode generation would
    /// too, but Linux exposes it only through an ioctl).
    pub birth_ns: Option<i128>,
}

impl FileIdentity {
    pub fn of(meta: &Metadata) -> FileIdentity {
        FileIdentity {
            device: meta.dev(),
            inode: meta.ino(),
            size: meta.size(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
            birth_ns: meta.created().ok().map(nanos_since_epoch),
        }
    }

    /// The fields that differ from `recorded`, the device number aside: what a file on a
    /// remounted volume (see [`crate::Root::volume`]) must still match.
    pub fn changes_on_remounted_volume(&self, recorded: &FileIdentity) -> Vec<&'static str> {
        FileIdentity {
            device: recorded.device,
            ..*self
        }
        .changes_from(recorded)
    }

    /// The fields that differ from `recorded`, for a message ("inode, size").
    pub fn changes_from(&self, recorded: &FileIdentity) -> Vec<&'static str> {
        let mut changed = Vec::new();
        if self.device != recorded.device {
            changed.push("device");
        }
        if self.inode != recorded.inode {
            changed.push("inode (the file was replaced)");
        }
        if self.birth_ns != recorded.birth_ns {
            changed.push("birth time (another file under the same inode number)");
        }
        if self.size != recorded.size {
            changed.push("size");
        }
        if self.mtime_ns != recorded.mtime_ns {
            changed.push("modification time");
        }
        if self.ctime_ns != recorded.ctime_ns {
            changed.push("status-change time (written or touched, even with its mtime restored)");
        }
        changed
    }
}

fn nanos_since_epoch(time: std::time::SystemTime) -> i128 {
    match time.duration_since(std::time::UNIX_EPOCH) {
        Ok(after) => after.as_nanos() as i128,
        Err(before) => -(before.duration().as_nanos() as i128),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    #[test]
    fn times_are_whole_nanoseconds_since_the_epoch_on_either_side_of_it() {
        let after = UNIX_EPOCH + Duration::new(2, 250_000_000);
        let before = UNIX_EPOCH - Duration::new(1, 500_000_000);
        assert_eq!(nanos_since_epoch(after), 2_250_000_000);
        assert_eq!(nanos_since_epoch(before), -1_500_000_000);
        assert_eq!(nanos_since_epoch(UNIX_EPOCH), 0);
    }

    #[test]
    fn a_files_identity_carries_its_times_to_the_nanosecond() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let made_after = SystemTime::now() - Duration::from_secs(1);
        std::fs::write(&path, b"12345").unwrap();
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        let mtime = UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
        file.set_modified(mtime).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let id = FileIdentity::of(&meta);
        assert_eq!(id.mtime_ns, 1_700_000_000_123_456_789);
        assert_eq!((id.device, id.inode, id.size), (meta.dev(), meta.ino(), 5));
        // The status-change time is the kernel's clock when the mtime was set: now, give or
        // take a second, and split into the seconds and nanoseconds stat reports.
        let now = nanos_since_epoch(SystemTime::now() + Duration::from_secs(1));
        assert!(
            (nanos_since_epoch(made_after)..now).contains(&id.ctime_ns),
            "{id:?}"
        );
        assert_eq!(
            (
                id.ctime_ns.div_euclid(1_000_000_000),
                id.ctime_ns.rem_euclid(1_000_000_000)
            ),
            (i128::from(meta.ctime()), i128::from(meta.ctime_nsec()))
        );
        if let Some(birth) = id.birth_ns {
            assert!(
                (nanos_since_epoch(made_after)..now).contains(&birth),
                "{id:?}"
            );
        }
    }
}
