//! Opening a file to read it, refusing anything that is not a regular file before a read can
//! block on it. Opening a FIFO for reading waits for a writer and a device node can read
//! forever, so a plain `File::open` of an untrusted path can hang a program. The file is opened
//! with `O_NONBLOCK` (which makes that open return at once), its type is checked on the open
//! descriptor (no race with a rename), and the flag is cleared again before it is handed back.

use std::fs::{File, FileType, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use rustix::fs::OFlags;

/// Opens `path` for reading if it is a regular file (after following links, as `File::open`
/// does); anything else is an `InvalidInput` error that says what the path is.
pub fn open(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags((OFlags::NONBLOCK | OFlags::NOCTTY).bits() as i32)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is {}, not a regular file",
                path.display(),
                describe(kind)
            ),
        ));
    }
    let flags = rustix::fs::fcntl_getfl(&file)?;
    rustix::fs::fcntl_setfl(&file, flags - OFlags::NONBLOCK)?;
    Ok(file)
}

/// Everything `reader` holds if that is at most `limit` bytes; `None`, after reading one byte
/// past the bound and no more, if it holds more. For files and answers whose size the reader
/// does not trust.
pub fn read_at_most(reader: impl io::Read, limit: u64) -> io::Result<Option<Vec<u8>>> {
    let mut bytes = Vec::new();
    io::Read::read_to_end(
        &mut io::Read::take(reader, limit.saturating_add(1)),
        &mut bytes,
    )?;
    Ok((bytes.len() as u64 <= limit).then_some(bytes))
}

/// What a file that is not regular is, in words.
pub fn describe(kind: FileType) -> &'static str {
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_file() {
        "a regular file"
    } else {
        "a special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn a_bounded_read_takes_up_to_the_limit_and_refuses_one_byte_more() {
        assert_eq!(
            read_at_most(&b"four"[..], 4).unwrap(),
            Some(b"four".to_vec())
        );
        assert_eq!(read_at_most(&b"four"[..], 3).unwrap(), None);
        assert_eq!(read_at_most(&b""[..], 0).unwrap(), Some(Vec::new()));
        assert_eq!(
            read_at_most(&b"x"[..], u64::MAX).unwrap(),
            Some(b"x".to_vec())
        );
    }

    #[test]
    fn a_regular_file_opens_and_reads_blocking_as_usual() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"bytes").unwrap();
        let mut file = open(&path).unwrap();
        let flags = rustix::fs::fcntl_getfl(&file).unwrap();
        assert!(!flags.contains(OFlags::NONBLOCK));
        let mut text = String::new();
        file.read_to_string(&mut text).unwrap();
        assert_eq!(text, "bytes");
    }

    #[test]
    fn a_fifo_a_directory_and_a_device_are_refused_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        for (path, what) in [
            (fifo.as_path(), "a FIFO (named pipe)"),
            (dir.path(), "a directory"),
            (Path::new("/dev/zero"), "a character device"),
        ] {
            let err = open_within(path, std::time::Duration::from_secs(5)).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
            assert!(err.to_string().contains(what), "{err}");
        }
        assert!(open(&dir.path().join("absent")).is_err());
    }

    /// [`open`] on another thread, failing the test (instead of hanging it) if the open has
    /// not returned within `limit`: an open that waits for a FIFO's writer is the bug.
    fn open_within(path: &Path, limit: std::time::Duration) -> io::Result<File> {
        let (sent, opened) = std::sync::mpsc::channel();
        let path = path.to_path_buf();
        std::thread::spawn(move || sent.send(open(&path)));
        opened
            .recv_timeout(limit)
            .unwrap_or_else(|_| panic!("opening took more than {limit:?}: it waited on the file"))
    }
}
