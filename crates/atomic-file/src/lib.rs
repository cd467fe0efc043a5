//! Atomic, durable file writes: every writer in the workspace goes through here.
//!
//! A file is written to a temporary sibling (`.<name>.<pid>-<random>.tmp`, same directory, so
//! the rename cannot cross a filesystem), flushed to disk with `fsync`, renamed over the target,
//! and the directory is `fsync`ed so the rename itself survives a power cut. A failure or a
//! kill before the rename leaves the old file (or no file) in place; the temporary file is
//! removed on failure and on drop. A `kill -9` cannot run that removal, so the next write of
//! the same file removes the temporary files of writers that are no longer running (their
//! process id is in the name).
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("hello.txt");
//! atomic_file::write_bytes(&path, b"hello\n").unwrap();
//! assert_eq!(std::fs::read(&path).unwrap(), b"hello\n");
//! ```

use std::fs::File;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Every temporary file this crate creates ends with this, after a leading `.` and the target's
/// name: a crashed writer's leftovers are recognisable.
pub const TEMP_SUFFIX: &str = ".tmp";

/// An I/O failure, with the path it happened on (the target, its temporary file or its
/// directory).
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct AtomicWriteError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

impl AtomicWriteError {
    fn at(path: &Path) -> impl FnOnce(io::Error) -> AtomicWriteError + '_ {
        move |source| AtomicWriteError {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// How the new file is created.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Permission bits of the new file (the process umask still applies).
    pub mode: u32,
}

impl Default for Options {
    /// `0o644`: files made to be handed on are readable by others, like any file `cp` makes.
    fn default() -> Self {
        Options { mode: 0o644 }
    }
}

impl Options {
    /// Files only their owner may read or write (`0o600`).
    pub fn private() -> Self {
        Options { mode: 0o600 }
    }
}

/// The directory `path` lives in (`.` for a bare file name).
pub fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Writes `path` atomically: `fill` writes the content into the temporary file, which is then
/// fsynced, renamed over `path`, and the directory fsynced. `fill`'s own error type is kept, so a
/// writer's typed errors (an encoder's, a container writer's) pass through unchanged.
pub fn write_with<T, E>(
    path: &Path,
    options: Options,
    fill: impl FnOnce(&File) -> Result<T, E>,
) -> Result<T, E>
where
    E: From<AtomicWriteError>,
{
    let (temp, value) = filled_temp(path, options, fill)?;
    temp.as_file()
        .sync_all()
        .map_err(AtomicWriteError::at(temp.path()))?;
    temp.persist(path)
        .map_err(|e| AtomicWriteError::at(path)(e.error))?;
    sync_dir(&parent_dir(path))?;
    Ok(value)
}

/// A temporary sibling of `path` (stale ones of dead writers removed first) that `fill` has
/// written.
fn filled_temp<T, E>(
    path: &Path,
    options: Options,
    fill: impl FnOnce(&File) -> Result<T, E>,
) -> Result<(tempfile::NamedTempFile, T), E>
where
    E: From<AtomicWriteError>,
{
    let dir = parent_dir(path);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    remove_stale_temps(&dir, &name);
    let temp = tempfile::Builder::new()
        .prefix(&format!(".{name}.{}-", std::process::id()))
        .suffix(TEMP_SUFFIX)
        .permissions(std::fs::Permissions::from_mode(options.mode))
        .tempfile_in(&dir)
        .map_err(AtomicWriteError::at(&dir))?;
    let value = fill(temp.as_file())?;
    Ok((temp, value))
}

/// What [`write_new_with`] found at the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placed {
    /// The new file is there, durable.
    Written,
    /// Another writer's file was already there and is kept; the new content was dropped.
    AlreadyThere,
}

/// [`write_with`] for a file that must be created only once: the rename never replaces a file
/// already at `path` (`renameat2(RENAME_NOREPLACE)` where the kernel has it). Two writers racing
/// to make the same file both succeed and both end up reading the one that landed first.
pub fn write_new_with<E>(
    path: &Path,
    options: Options,
    fill: impl FnOnce(&File) -> Result<(), E>,
) -> Result<Placed, E>
where
    E: From<AtomicWriteError>,
{
    let (temp, ()) = filled_temp(path, options, fill)?;
    temp.as_file()
        .sync_all()
        .map_err(AtomicWriteError::at(temp.path()))?;
    match temp.persist_noclobber(path) {
        Ok(_) => {}
        Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => {
            return Ok(Placed::AlreadyThere);
        }
        Err(e) => return Err(AtomicWriteError::at(path)(e.error).into()),
    }
    sync_dir(&parent_dir(path))?;
    Ok(Placed::Written)
}

/// [`write_with`] without the fsyncs: the content goes to a temporary file renamed over `path`,
/// so no reader ever sees it half-written, but it is not durable yet. For the files of a folder
/// whose completion a later mark commits (a pack's output, refused while it holds its
/// incomplete marker): the writer calls [`sync_filesystem`] once they are all written, before
/// writing that mark. One flush of many files costs far less than a flush of each.
pub fn write_unsynced_with<T, E>(
    path: &Path,
    options: Options,
    fill: impl FnOnce(&File) -> Result<T, E>,
) -> Result<T, E>
where
    E: From<AtomicWriteError>,
{
    let (temp, value) = filled_temp(path, options, fill)?;
    temp.persist(path)
        .map_err(|e| AtomicWriteError::at(path)(e.error))?;
    Ok(value)
}

/// Makes everything written to the filesystem that holds `dir` durable (`syncfs`): the files
/// [`write_unsynced_with`] wrote, and their renames.
pub fn sync_filesystem(dir: &Path) -> Result<(), AtomicWriteError> {
    let handle = File::open(dir).map_err(AtomicWriteError::at(dir))?;
    rustix::fs::syncfs(&handle).map_err(|e| AtomicWriteError::at(dir)(std::io::Error::from(e)))
}

/// Removes `.<name>.<pid>-<random>.tmp` siblings whose writer (`pid`) is no longer running: a
/// writer killed before its rename leaves one, as large as what it had written. Best effort: a
/// file that cannot be listed or removed is left for the next write.
fn remove_stale_temps(dir: &Path, name: &str) {
    let prefix = format!(".{name}.");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(middle) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|n| n.strip_suffix(TEMP_SUFFIX))
        else {
            continue;
        };
        let Some(pid) = middle
            .split_once('-')
            .and_then(|(p, _)| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// [`write_with`] for content already in memory, with the default permissions.
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<(), AtomicWriteError> {
    write_bytes_with(path, Options::default(), bytes)
}

/// [`write_with`] for content already in memory.
pub fn write_bytes_with(
    path: &Path,
    options: Options,
    bytes: &[u8],
) -> Result<(), AtomicWriteError> {
    write_with(path, options, |mut file| {
        io::Write::write_all(&mut file, bytes).map_err(AtomicWriteError::at(path))
    })
}

/// Moves a finished file that was written (and fsynced) under another name in the same
/// directory into place, and makes the rename durable. For writers whose temporary file must
/// outlive one process (a resumable download, a sidecar committed after its checkpoint).
pub fn place(from: &Path, to: &Path) -> Result<(), AtomicWriteError> {
    std::fs::rename(from, to).map_err(AtomicWriteError::at(to))?;
    sync_dir(&parent_dir(to))
}

/// Makes the entries of `dir` (a rename, a new file, a removal) durable.
pub fn sync_dir(dir: &Path) -> Result<(), AtomicWriteError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(AtomicWriteError::at(dir))
}

/// Creates the folders `relative` names beneath `root` (each one that is missing), refusing to
/// go through a component that exists as a symbolic link or as anything but a folder: a link
/// planted inside an output folder would otherwise send the writes that follow somewhere else.
/// `root` itself is the caller's choice and may be a link.
pub fn create_dirs_beneath(root: &Path, relative: &Path) -> std::io::Result<()> {
    let mut at = root.to_path_buf();
    for part in relative.components() {
        let std::path::Component::Normal(name) = part else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is not a plain relative folder", relative.display()),
            ));
        };
        at.push(name);
        match std::fs::symlink_metadata(&at) {
            Ok(meta) if meta.file_type().is_dir() => {}
            Ok(meta) => {
                let what = match meta.file_type().is_symlink() {
                    true => "a symbolic link",
                    false => "not a folder",
                };
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{} is {what}: refusing to write through it", at.display()),
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => create_missing_dir(&at)?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Creates the folder `at`, found missing a moment ago. Another writer may have made it
/// meanwhile: what is there then is checked as if it had been there before.
fn create_missing_dir(at: &Path) -> std::io::Result<()> {
    match std::fs::create_dir(at) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if std::fs::symlink_metadata(at)?.file_type().is_dir() {
                return Ok(());
            }
            Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{} is not a folder: refusing to write through it",
                    at.display()
                ),
            ))
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// An unsynced write still replaces the target whole and leaves no temporary file; a
    /// failed one leaves the old content; the filesystem flush then succeeds.
    #[test]
    fn an_unsynced_write_is_still_all_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("payload.bin");
        std::fs::write(&path, b"old").unwrap();
        write_unsynced_with(&path, Options::default(), |mut f| {
            f.write_all(b"new content")
                .map_err(AtomicWriteError::at(&path))
        })
        .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new content");
        let failed: Result<(), AtomicWriteError> =
            write_unsynced_with(&path, Options::default(), |mut f| {
                f.write_all(b"half").map_err(AtomicWriteError::at(&path))?;
                Err(AtomicWriteError::at(&path)(io::Error::other("killed")))
            });
        assert!(failed.is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"new content");
        assert_eq!(names(dir.path()), ["payload.bin"]);
        sync_filesystem(dir.path()).unwrap();
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_failed_fill_keeps_the_old_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.bin");
        write_bytes(&path, b"old").unwrap();
        let result: Result<(), AtomicWriteError> =
            write_with(&path, Options::default(), |mut f| {
                f.write_all(b"half of the new").unwrap();
                Err(AtomicWriteError::at(&path)(io::Error::other(
                    "disk on fire",
                )))
            });
        assert!(result.is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(names(dir.path()), ["model.bin"]);
    }

    #[test]
    fn the_new_content_replaces_the_old_with_the_asked_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("evidence.json");
        write_bytes(&path, b"old").unwrap();
        write_bytes_with(&path, Options::private(), b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(names(dir.path()), ["evidence.json"]);
    }

    #[test]
    fn the_fill_value_and_error_type_pass_through() {
        #[derive(Debug)]
        enum Mine {
            Io,
            Encoder(&'static str),
        }
        impl From<AtomicWriteError> for Mine {
            fn from(_: AtomicWriteError) -> Self {
                Mine::Io
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x");
        let n: Result<u32, Mine> = write_with(&path, Options::default(), |_| Ok(7));
        assert_eq!(n.unwrap(), 7);
        let e: Result<u32, Mine> =
            write_with(&path, Options::default(), |_| Err(Mine::Encoder("bad")));
        assert!(matches!(e, Err(Mine::Encoder("bad"))));
        let missing = dir.path().join("no/such/dir/x");
        assert!(matches!(
            write_bytes(&missing, b"").map_err(Mine::from),
            Err(Mine::Io)
        ));
    }

    #[test]
    fn a_new_file_never_replaces_one_already_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        let write = |bytes: &'static [u8]| {
            write_new_with(&path, Options::private(), |mut f| {
                io::Write::write_all(&mut f, bytes).map_err(AtomicWriteError::at(&path))
            })
            .unwrap()
        };
        assert_eq!(write(b"first"), Placed::Written);
        assert_eq!(write(b"second"), Placed::AlreadyThere);
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(names(dir.path()), ["key"], "no temporary file is left");
    }

    #[test]
    fn place_moves_a_finished_file_into_place() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("a.partial"), dir.path().join("a"));
        std::fs::write(&from, b"done").unwrap();
        place(&from, &to).unwrap();
        assert_eq!(names(dir.path()), ["a"]);
        assert_eq!(std::fs::read(&to).unwrap(), b"done");
    }

    #[test]
    fn folders_are_made_beneath_the_root_but_never_through_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("out");
        std::fs::create_dir(&root).unwrap();
        create_dirs_beneath(&root, Path::new("a/b/c")).unwrap();
        assert!(root.join("a/b/c").is_dir());
        create_dirs_beneath(&root, Path::new("a/b")).unwrap();

        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join("planted")).unwrap();
        let err = create_dirs_beneath(&root, Path::new("planted/x")).unwrap_err();
        assert!(err.to_string().contains("a symbolic link"), "{err}");
        assert!(!elsewhere.join("x").exists());
        std::fs::write(root.join("file"), b"").unwrap();
        assert!(create_dirs_beneath(&root, Path::new("file/x")).is_err());
        assert!(create_dirs_beneath(&root, Path::new("../x")).is_err());
    }

    #[test]
    fn a_killed_writers_temporary_file_is_removed_by_the_next_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.bin");
        // No process has this id (Linux ids stay below 2^22), so its writer is gone.
        let stale = dir.path().join(".big.bin.4294967294-abc123.tmp");
        let live = dir
            .path()
            .join(format!(".big.bin.{}-def456.tmp", std::process::id()));
        let other = dir.path().join(".other.bin.4294967294-abc123.tmp");
        for f in [&stale, &live, &other] {
            std::fs::write(f, b"half of something").unwrap();
        }
        write_bytes(&path, b"whole").unwrap();
        assert!(!stale.exists(), "a dead writer's temporary file is removed");
        assert!(live.exists(), "a running writer's is kept");
        assert!(
            other.exists(),
            "another file's is left to its own next write"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"whole");
    }

    #[test]
    fn a_bare_file_name_lives_in_the_current_folder() {
        assert_eq!(parent_dir(Path::new("name.bin")), PathBuf::from("."));
        assert_eq!(parent_dir(Path::new("a/name.bin")), PathBuf::from("a"));
    }

    #[test]
    fn a_folder_that_cannot_be_opened_is_an_error_not_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        assert!(sync_dir(&missing).is_err());
        assert!(sync_filesystem(&missing).is_err());
    }

    /// Only a target that is already there means "already there": a rename that fails for
    /// another reason (here the temporary file vanished) is an error.
    #[test]
    fn a_new_file_whose_rename_fails_otherwise_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.bin");
        let placed: Result<Placed, AtomicWriteError> =
            write_new_with(&path, Options::default(), |_| {
                for entry in std::fs::read_dir(dir.path()).unwrap().flatten() {
                    std::fs::remove_file(entry.path()).unwrap();
                }
                Ok(())
            });
        assert!(placed.is_err(), "{placed:?}");
        assert!(!path.exists());
    }

    /// A temporary file of a writer still running (any live process but this one) is its,
    /// not stale: the next write leaves it.
    #[test]
    fn a_running_writers_temporary_file_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("payload.bin");
        let live = format!(".payload.bin.1-abc{TEMP_SUFFIX}");
        std::fs::write(dir.path().join(&live), b"in progress").unwrap();
        write_bytes(&path, b"content").unwrap();
        assert!(dir.path().join(&live).exists(), "{:?}", names(dir.path()));
    }

    /// What another writer made between the check and the creation is checked in turn: a
    /// folder is used, anything else refused.
    #[test]
    fn a_folder_made_meanwhile_is_used_and_anything_else_refused() {
        let dir = tempfile::tempdir().unwrap();
        let made = dir.path().join("made");
        create_missing_dir(&made).unwrap();
        create_missing_dir(&made).unwrap();
        assert!(made.is_dir());
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(
            create_missing_dir(&file).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        std::os::unix::fs::symlink(&made, dir.path().join("link")).unwrap();
        assert_eq!(
            create_missing_dir(&dir.path().join("link"))
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput
        );
        let orphan = dir.path().join("no/such/parent");
        assert_eq!(
            create_missing_dir(&orphan).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}
