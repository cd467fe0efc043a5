//! A held artifact root and opens beneath it that never follow a symbolic link.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};

use crate::identity::FileIdentity;
use crate::sole_writer;

/// Why a file beneath the root cannot be opened as evidence-grade.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error(
        "{path}: a component is a symbolic link (links are never followed beneath an artifact root)"
    )]
    SymbolicLink { path: String },
    #[error("{path}: not a regular file")]
    NotARegularFile { path: String },
    #[error("{path}: has {links} hard links; an artifact file must be its only name")]
    HardLinked { path: String, links: u64 },
    #[error("{path}: on another device than the artifact root")]
    OtherDevice { path: String },
    #[error(
        "{path} can be written by {who}: evidence cannot vouch for it, since a writer can change its bytes without changing its size or times; make it yours alone (`chown` it to yourself, `chmod go-w` it) and run `minirun verify` again"
    )]
    WritableByOthers { path: String, who: String },
}

/// Every non-directory entry beneath `root` (symbolic links included, never followed), as
/// `/`-separated relative paths, leaving out the folder `left_out` (the evidence folder).
pub fn files_beneath(
    root: &Path,
    left_out: &str,
) -> Result<std::collections::BTreeSet<String>, OpenError> {
    let mut present = std::collections::BTreeSet::new();
    let mut stack = vec![String::new()];
    while let Some(relative) = stack.pop() {
        let dir = root.join(&relative);
        let entries = std::fs::read_dir(&dir).map_err(|error| OpenError::Io {
            path: dir.display().to_string(),
            error,
        })?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = match relative.is_empty() {
                true => name.clone(),
                false => format!("{relative}/{name}"),
            };
            if path == left_out {
                continue;
            }
            match entry.file_type() {
                Ok(t) if t.is_symlink() => return Err(OpenError::SymbolicLink { path }),
                Ok(t) if t.is_dir() => stack.push(path),
                _ => {
                    present.insert(path);
                }
            }
        }
    }
    Ok(present)
}

/// What an entry beneath the root is, its final component not followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Absent,
    File,
    Directory,
    SymbolicLink,
    /// A FIFO, socket or device node.
    Other,
}

const BY_UUID: &str = "/dev/disk/by-uuid";
/// `statfs.f_type` of filesystems whose `f_fsid` is derived from the superblock UUID: ext2/3/4,
/// XFS, Btrfs.
const UUID_DERIVED_FSID: [u64; 3] = [0xEF53, 0x5846_5342, 0x9123_683E];

/// The name of the `by_uuid` entry (a link to a block device node) whose device is `device`.
pub(crate) fn volume_by_uuid(by_uuid: &Path, device: u64) -> Option<String> {
    std::fs::read_dir(by_uuid)
        .ok()?
        .flatten()
        .find_map(|entry| {
            let meta = std::fs::metadata(entry.path()).ok()?;
            let name = entry.file_name().into_string().ok()?;
            (meta.file_type().is_block_device() && meta.rdev() == device).then_some(name)
        })
}

/// An artifact directory held open; every file is opened relative to it.
#[derive(Debug)]
pub struct Root {
    dir: OwnedFd,
    path: PathBuf,
    device: u64,
    inode: u64,
    fsid: u64,
}

impl Root {
    /// Opens the directory `path` (the path itself may be reached through links; nothing
    /// beneath it will be).
    pub fn open(path: &Path) -> std::io::Result<Root> {
        let dir = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let meta = File::from(dir.try_clone()?).metadata()?;
        let fsid = rustix::fs::fstatvfs(&dir)?.f_fsid;
        Ok(Root {
            dir,
            path: path.to_path_buf(),
            device: meta.dev(),
            inode: meta.ino(),
            fsid,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn device(&self) -> u64 {
        self.device
    }

    pub fn inode(&self) -> u64 {
        self.inode
    }

    /// The filesystem id (`statvfs.f_fsid`) the root lives on.
    pub fn fsid(&self) -> u64 {
        self.fsid
    }

    /// The identity of the volume the root lives on, where it survives an unmount and a
    /// remount (the device number does not: a replugged disk can come back as another one):
    /// `uuid:<UUID>` when a `/dev/disk/by-uuid` link names the root's block device; otherwise
    /// `fsid:<type>:<fsid>` on ext2/3/4, XFS and Btrfs, whose `f_fsid` is derived from the
    /// superblock's UUID; `None` on any other filesystem (tmpfs, overlays, network mounts),
    /// whose evidence then stays bound to the device number.
    pub fn volume(&self) -> Option<String> {
        volume_by_uuid(Path::new(BY_UUID), self.device)
            .map(|uuid| format!("uuid:{uuid}"))
            .or_else(|| {
                let kind = rustix::fs::fstatfs(&self.dir).ok()?.f_type as u64;
                UUID_DERIVED_FSID
                    .contains(&kind)
                    .then(|| format!("fsid:{kind:x}:{:016x}", self.fsid))
            })
    }

    /// Opens the regular file `relative` beneath the root: no component may be a symbolic link
    /// or leave the root (`openat2` with `RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH`, or component
    /// by component with `O_NOFOLLOW` where the kernel lacks it); the file must be regular, on
    /// the root's device and its only name. Returns it with its identity.
    pub fn open_file(&self, relative: &str) -> Result<(File, FileIdentity), OpenError> {
        let (file, meta) = self.open_regular(relative)?;
        Ok((file, FileIdentity::of(&meta)))
    }

    /// [`Root::open_file`]'s open and checks, with the file's whole metadata.
    fn open_regular(&self, relative: &str) -> Result<(File, std::fs::Metadata), OpenError> {
        let fd = self.open_beneath(relative)?;
        let file = File::from(fd);
        let meta = file.metadata().map_err(|error| OpenError::Io {
            path: relative.to_string(),
            error,
        })?;
        if !meta.file_type().is_file() {
            return Err(OpenError::NotARegularFile {
                path: relative.to_string(),
            });
        }
        if meta.nlink() != 1 {
            return Err(OpenError::HardLinked {
                path: relative.to_string(),
                links: meta.nlink(),
            });
        }
        if meta.dev() != self.device {
            return Err(OpenError::OtherDevice {
                path: relative.to_string(),
            });
        }
        Ok((file, meta))
    }

    /// [`Root::open_file`] for a file evidence vouches for: nobody but the caller may be able
    /// to write it, nor any directory from the root down to it (`sole_writer`).
    pub fn open_sole_written(&self, relative: &str) -> Result<(File, FileIdentity), OpenError> {
        let (file, meta) = self.open_regular(relative)?;
        let caller = sole_writer::caller();
        let refuse = |path: String, who: String| OpenError::WritableByOthers { path, who };
        let io = |path: &str, error: std::io::Error| OpenError::Io {
            path: path.to_string(),
            error,
        };
        if let Some(who) = sole_writer::other_writers(meta.uid(), meta.mode(), caller) {
            return Err(refuse(relative.to_string(), who));
        }
        let root_stat = rustix::fs::fstat(&self.dir).map_err(|e| io(".", e.into()))?;
        if let Some(who) = sole_writer::other_writers(root_stat.st_uid, root_stat.st_mode, caller) {
            let path = format!("the artifact directory {}", self.path.display());
            return Err(refuse(path, who));
        }
        let mut directory = String::new();
        for component in Path::new(relative)
            .parent()
            .into_iter()
            .flat_map(Path::iter)
        {
            if !directory.is_empty() {
                directory.push('/');
            }
            directory.push_str(&component.to_string_lossy());
            let stat = rustix::fs::statat(&self.dir, directory.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| io(&directory, e.into()))?;
            if let Some(who) = sole_writer::other_writers(stat.st_uid, stat.st_mode, caller) {
                return Err(refuse(format!("{directory}/"), who));
            }
        }
        Ok((file, FileIdentity::of(&meta)))
    }

    /// The names of the root's entries that are directories themselves (a symbolic link to a
    /// directory is not one), sorted.
    pub fn subdirectories(&self) -> Result<Vec<String>, OpenError> {
        self.entries_of_kind(EntryKind::Directory)
    }

    /// The names of the root's entries that are regular files (a link to one is not), sorted.
    pub fn files_at_top(&self) -> Result<Vec<String>, OpenError> {
        self.entries_of_kind(EntryKind::File)
    }

    fn entries_of_kind(&self, kind: EntryKind) -> Result<Vec<String>, OpenError> {
        let io = |error: rustix::io::Errno| OpenError::Io {
            path: self.path.display().to_string(),
            error: error.into(),
        };
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(&self.dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." {
                continue;
            }
            if self.entry_kind(&name)? == kind {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// What `relative` is, without following a link at its end (a link in a directory on the
    /// way is refused by the opens, not here).
    pub fn entry_kind(&self, relative: &str) -> Result<EntryKind, OpenError> {
        match rustix::fs::statat(&self.dir, relative, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => Ok(
                match rustix::fs::FileType::from_raw_mode(stat.st_mode as rustix::fs::RawMode) {
                    rustix::fs::FileType::RegularFile => EntryKind::File,
                    rustix::fs::FileType::Directory => EntryKind::Directory,
                    rustix::fs::FileType::Symlink => EntryKind::SymbolicLink,
                    _ => EntryKind::Other,
                },
            ),
            Err(rustix::io::Errno::NOENT) => Ok(EntryKind::Absent),
            Err(e) => Err(classify(relative, e)),
        }
    }

    /// Opens `relative` a second time with `O_DIRECT` (reads bypass the page cache), beneath
    /// the root without following links, when the filesystem supports it; `None` where it does
    /// not (tmpfs, some overlays) or the kernel lacks `openat2`. The caller compares the
    /// identity with its first open's.
    pub fn open_direct(&self, relative: &str) -> Option<(File, FileIdentity)> {
        // No O_NOFOLLOW: RESOLVE_NO_SYMLINKS refuses a link in every component, the last included.
        let flags =
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK | OFlags::DIRECT;
        let resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::BENEATH;
        let fd = rustix::fs::openat2(&self.dir, relative, flags, Mode::empty(), resolve).ok()?;
        let file = File::from(fd);
        let identity = FileIdentity::of(&file.metadata().ok()?);
        Some((file, identity))
    }

    /// With `O_NONBLOCK`, so that a FIFO planted in the artifact is refused as not regular
    /// instead of blocking the open (regular files ignore the flag).
    fn open_beneath(&self, relative: &str) -> Result<OwnedFd, OpenError> {
        // No O_NOFOLLOW: RESOLVE_NO_SYMLINKS refuses a link in every component, the last included.
        let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
        let resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::BENEATH;
        match rustix::fs::openat2(&self.dir, relative, flags, Mode::empty(), resolve) {
            Ok(fd) => Ok(fd),
            Err(rustix::io::Errno::NOSYS) => self.open_component_wise(relative),
            Err(e) => Err(classify(relative, e)),
        }
    }

    /// The fallback for kernels without `openat2`: each directory with `O_NOFOLLOW |
    /// O_DIRECTORY`, the file with `O_NOFOLLOW`; `..` and empty components refused.
    fn open_component_wise(&self, relative: &str) -> Result<OwnedFd, OpenError> {
        let parts: Vec<&str> = relative.split('/').collect();
        if parts
            .iter()
            .any(|p| p.is_empty() || *p == "." || *p == "..")
        {
            return Err(OpenError::Io {
                path: relative.to_string(),
                error: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "not a plain relative path",
                ),
            });
        }
        let mut dir: Option<OwnedFd> = None;
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            let flags = OFlags::RDONLY
                | OFlags::CLOEXEC
                | OFlags::NOFOLLOW
                | if last {
                    OFlags::NOCTTY | OFlags::NONBLOCK
                } else {
                    OFlags::DIRECTORY
                };
            let parent = dir.as_ref().unwrap_or(&self.dir);
            let next = rustix::fs::openat(parent, *part, flags, Mode::empty())
                .map_err(|e| classify(relative, e))?;
            dir = Some(next);
        }
        dir.ok_or_else(|| OpenError::Io {
            path: relative.to_string(),
            error: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty path"),
        })
    }
}

fn classify(relative: &str, e: rustix::io::Errno) -> OpenError {
    // ELOOP: a symbolic link met with O_NOFOLLOW or RESOLVE_NO_SYMLINKS; ENOTDIR: a link
    // where a directory was required with O_NOFOLLOW | O_DIRECTORY.
    if e == rustix::io::Errno::LOOP || e == rustix::io::Errno::NOTDIR {
        return OpenError::SymbolicLink {
            path: relative.to_string(),
        };
    }
    OpenError::Io {
        path: relative.to_string(),
        error: e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fallback for kernels without openat2 refuses the same links openat2 does.
    #[test]
    fn the_component_wise_fallback_refuses_links_too() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::fs::write(dir.path().join("real/f"), b"x").unwrap();
        std::os::unix::fs::symlink("real", dir.path().join("linked")).unwrap();
        std::os::unix::fs::symlink("f", dir.path().join("real/g")).unwrap();
        let root = Root::open(dir.path()).unwrap();
        assert!(root.open_component_wise("real/f").is_ok());
        for bad in ["linked/f", "real/g"] {
            assert!(
                matches!(
                    root.open_component_wise(bad),
                    Err(OpenError::SymbolicLink { .. })
                ),
                "{bad}"
            );
        }
        assert!(root.open_component_wise("../x").is_err());
        assert!(root.open_component_wise("real//f").is_err());
    }

    /// (close-on-exec, the file status flags) of an open descriptor.
    fn flags_of(fd: impl rustix::fd::AsFd) -> (bool, OFlags) {
        let cloexec = rustix::io::fcntl_getfd(&fd)
            .unwrap()
            .contains(rustix::io::FdFlags::CLOEXEC);
        (cloexec, rustix::fs::fcntl_getfl(&fd).unwrap())
    }

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::fs::write(dir.path().join("real/f"), b"0123456789").unwrap();
        std::fs::write(dir.path().join("top"), b"t").unwrap();
        std::os::unix::fs::symlink("real", dir.path().join("linked")).unwrap();
        std::os::unix::fs::symlink("top", dir.path().join("top-link")).unwrap();
        std::os::unix::fs::symlink("f", dir.path().join("real/g")).unwrap();
        dir
    }

    /// No descriptor the root opens leaks into a child process, and files are opened without
    /// blocking (a FIFO planted in the artifact cannot hang an open).
    #[test]
    fn every_descriptor_is_close_on_exec_and_files_open_without_blocking() {
        let dir = tree();
        let root = Root::open(dir.path()).unwrap();
        assert!(flags_of(&root.dir).0, "the root directory");
        let (file, _) = root.open_file("real/f").unwrap();
        let fallback = root.open_component_wise("real/f").unwrap();
        for (what, (cloexec, status)) in [
            ("openat2", flags_of(&file)),
            ("component-wise", flags_of(&fallback)),
        ] {
            assert!(cloexec, "{what}");
            assert!(status.contains(OFlags::NONBLOCK), "{what}: {status:?}");
        }
    }

    #[test]
    fn the_root_must_be_a_directory_and_knows_its_device_inode_and_filesystem() {
        let dir = tree();
        assert!(Root::open(&dir.path().join("top")).is_err());
        let root = Root::open(dir.path()).unwrap();
        let meta = std::fs::metadata(dir.path()).unwrap();
        assert_eq!((root.device(), root.inode()), (meta.dev(), meta.ino()));
        assert_eq!(root.fsid(), rustix::fs::statvfs(dir.path()).unwrap().f_fsid);
        assert_eq!(root.path(), dir.path());
    }

    /// Where the filesystem derives its id from the superblock's UUID, the root has a volume
    /// identity; elsewhere it may have none.
    #[test]
    fn a_root_on_a_uuid_filesystem_names_its_volume() {
        let dir = tree();
        let root = Root::open(dir.path()).unwrap();
        let kind = rustix::fs::statfs(dir.path()).unwrap().f_type as u64;
        let volume = root.volume();
        if UUID_DERIVED_FSID.contains(&kind) {
            let volume = volume.expect("a volume identity on ext4, XFS or Btrfs");
            let fsid = format!("fsid:{kind:x}:{:016x}", root.fsid());
            assert!(
                volume.starts_with("uuid:") && volume.len() > "uuid:".len() || volume == fsid,
                "{volume}"
            );
        }
    }

    /// A block device node in /dev, if this machine shows one.
    fn some_block_device() -> Option<(PathBuf, u64)> {
        std::fs::read_dir("/dev").ok()?.flatten().find_map(|entry| {
            let meta = std::fs::metadata(entry.path()).ok()?;
            meta.file_type()
                .is_block_device()
                .then(|| (entry.path(), meta.rdev()))
        })
    }

    #[test]
    fn a_volume_is_named_by_the_link_to_its_block_device_only() {
        let Some((device, rdev)) = some_block_device() else {
            eprintln!("no block device node in /dev: nothing to name a volume by");
            return;
        };
        let by_uuid = tempfile::tempdir().unwrap();
        let null_rdev = std::fs::metadata("/dev/null").unwrap().rdev();
        std::os::unix::fs::symlink("/dev/null", by_uuid.path().join("a-char-device")).unwrap();
        std::os::unix::fs::symlink(&device, by_uuid.path().join("the-volume")).unwrap();
        std::fs::write(by_uuid.path().join("a-file"), b"").unwrap();
        assert_eq!(
            volume_by_uuid(by_uuid.path(), rdev).as_deref(),
            Some("the-volume")
        );
        assert_eq!(volume_by_uuid(by_uuid.path(), null_rdev), None);
        assert_eq!(volume_by_uuid(by_uuid.path(), rdev ^ 0xFFFF_0000), None);
        assert_eq!(volume_by_uuid(&by_uuid.path().join("missing"), rdev), None);
    }

    #[test]
    fn entries_are_listed_by_what_they_are_not_by_what_they_point_to() {
        let dir = tree();
        let root = Root::open(dir.path()).unwrap();
        assert_eq!(root.subdirectories().unwrap(), ["real"]);
        assert_eq!(root.files_at_top().unwrap(), ["top"]);
        assert_eq!(root.entry_kind("linked").unwrap(), EntryKind::SymbolicLink);
        assert_eq!(root.entry_kind("real/g").unwrap(), EntryKind::SymbolicLink);
        assert_eq!(root.entry_kind("real").unwrap(), EntryKind::Directory);
        assert_eq!(root.entry_kind("top").unwrap(), EntryKind::File);
        assert_eq!(root.entry_kind("nothing").unwrap(), EntryKind::Absent);
    }

    #[test]
    fn the_component_wise_fallback_refuses_dot_components_before_opening_anything() {
        let dir = tree();
        std::fs::create_dir(dir.path().join("inner")).unwrap();
        std::fs::write(dir.path().join("outside"), b"o").unwrap();
        let root = Root::open(&dir.path().join("inner")).unwrap();
        std::fs::create_dir(dir.path().join("inner/d")).unwrap();
        std::fs::write(dir.path().join("inner/d/f"), b"f").unwrap();
        assert!(root.open_component_wise("d/f").is_ok());
        for bad in ["../outside", "./d/f", "d/./f", "d/../d/f", "d//f", "", "."] {
            match root.open_component_wise(bad) {
                Err(OpenError::Io { error, .. }) => {
                    assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput, "{bad:?}")
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    /// `O_DIRECT` where the filesystem takes it (the same open the caller would get with the
    /// flag by hand), never through a link, and always close-on-exec and non-blocking.
    #[test]
    fn a_direct_open_bypasses_the_cache_where_the_filesystem_allows_and_follows_no_link() {
        let dir = tree();
        let root = Root::open(dir.path()).unwrap();
        let supported = rustix::fs::open(
            dir.path().join("real/f"),
            OFlags::RDONLY | OFlags::DIRECT,
            Mode::empty(),
        )
        .is_ok();
        let direct = root.open_direct("real/f");
        assert_eq!(direct.is_some(), supported);
        if let Some((file, identity)) = direct {
            let (cloexec, status) = flags_of(&file);
            assert!(cloexec);
            assert!(
                status.contains(OFlags::DIRECT | OFlags::NONBLOCK),
                "{status:?}"
            );
            assert_eq!(identity, root.open_file("real/f").unwrap().1);
        }
        assert!(root.open_direct("linked/f").is_none());
        assert!(root.open_direct("real/g").is_none());
        assert!(root.open_direct("../x").is_none());
    }
}
