//! Downloading a pinned tree: several files at once, each resumable (HTTP Range from a
//! partial file), hashed while it is written, and renamed into place only when its size and
//! digest match the tree. A mismatch deletes the partial file and says so.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use url::Url;

use crate::client::Hub;
use crate::error::HubError;
use minirun_format::tree::{RepoFile, StreamHasher, Tree};

/// Where partial files wait, inside the destination.
pub const PARTIAL_DIR: &str = ".minirun-partial";
const CHUNK: usize = 1 << 20;

/// How to download.
#[derive(Debug, Clone, Copy)]
pub struct DownloadOptions {
    /// Files fetched at once.
    pub parallel: usize,
    /// Reconnections per file after a dropped connection (each resumes where it stopped).
    pub retries: usize,
}

impl Default for DownloadOptions {
    fn default() -> Self {
        DownloadOptions {
            parallel: 4,
            retries: 3,
        }
    }
}

/// What a download did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DownloadReport {
    /// Files fetched (whole or resumed), by path.
    pub fetched: Vec<String>,
    /// Files already in place with the right digest.
    pub already_present: Vec<String>,
    /// Files that continued a partial file from an earlier run.
    pub resumed: Vec<String>,
    /// Bytes received over the network.
    pub bytes_received: u64,
}

enum Outcome {
    Present,
    Fetched { resumed: bool, received: u64 },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HubError + '_ {
    move |error| HubError::Io {
        path: path.to_path_buf(),
        error,
    }
}

impl Hub {
    /// Downloads every file of `tree` into `dest`. `progress` is called with byte counts as
    /// they are received or found already in place (their sum ends at the tree's size).
    pub fn download(
        &self,
        tree: &Tree,
        dest: &Path,
        options: &DownloadOptions,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<DownloadReport, HubError> {
        fs::create_dir_all(dest).map_err(io(dest))?;
        let mut queue: Vec<&RepoFile> = tree.files.values().collect();
        queue.sort_by_key(|f| f.size);
        let queue = Mutex::new(queue);
        let report = Mutex::new(DownloadReport::default());
        let failed = AtomicBool::new(false);
        let first_error = Mutex::new(None);
        std::thread::scope(|scope| {
            for _ in 0..options.parallel.max(1) {
                scope.spawn(|| {
                    while !failed.load(Ordering::Relaxed) {
                        let Some(file) = queue.lock().ok().and_then(|mut q| q.pop()) else {
                            return;
                        };
                        match self.fetch(tree, file, dest, options.retries, progress) {
                            Ok(outcome) => record(&report, file, outcome),
                            Err(e) => {
                                failed.store(true, Ordering::Relaxed);
                                if let Ok(mut slot) = first_error.lock() {
                                    slot.get_or_insert(e);
                                }
                            }
                        }
                    }
                });
            }
        });
        if let Some(e) = first_error.into_inner().ok().flatten() {
            return Err(e);
        }
        let _ = fs::remove_dir_all(dest.join(PARTIAL_DIR));
        let mut report = report.into_inner().unwrap_or_default();
        report.fetched.sort();
        report.already_present.sort();
        report.resumed.sort();
        Ok(report)
    }

    fn resolve_url(&self, tree: &Tree, path: &str) -> Result<Url, HubError> {
        let mut url = self.url("/")?;
        {
            let mut segments = url
                .path_segments_mut()
                .map_err(|()| HubError::BadEndpoint {
                    endpoint: self.endpoint().to_string(),
                    reason: "cannot hold a path".into(),
                })?;
            segments.clear();
            segments.extend(tree.repo.split('/'));
            segments.push("resolve");
            segments.push(&tree.revision);
            segments.extend(path.split('/'));
        }
        Ok(url)
    }

    fn fetch(
        &self,
        tree: &Tree,
        file: &RepoFile,
        dest: &Path,
        retries: usize,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<Outcome, HubError> {
        let target = dest.join(&file.path);
        if already_in_place(&target, file)? {
            progress(file.size);
            return Ok(Outcome::Present);
        }
        let relative = Path::new(PARTIAL_DIR).join(format!("{}.part", file.path));
        let partial = dest.join(&relative);
        // Every folder on the way is made here or checked: a link planted in the output
        // folder would send the download somewhere else.
        let folders = relative.parent().unwrap_or(Path::new(""));
        atomic_file::create_dirs_beneath(dest, folders).map_err(io(&partial))?;
        let (mut hasher, mut have) = resume_partial(&partial, file)?;
        let resumed = have > 0;
        progress(have);
        let mut out = OpenOptions::new()
            .create(true)
            .append(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&partial)
            .map_err(io(&partial))?;
        let url = self.resolve_url(tree, &file.path)?;
        let mut received = 0;
        let mut failures = 0;
        while have < file.size {
            let (response, commit) = self.get(&url, (have > 0).then_some(have), true)?;
            if commit.as_deref() != Some(tree.revision.as_str()) {
                let _ = fs::remove_file(&partial);
                return Err(HubError::CommitMismatch {
                    path: file.path.clone(),
                    expected: tree.revision.clone(),
                    found: commit,
                });
            }
            if have > 0 && !range_honoured(&response, have) {
                // The server sent the whole file: start over.
                out.set_len(0).map_err(io(&partial))?;
                hasher = StreamHasher::new(&file.digest, file.size);
                have = 0;
            }
            let outcome =
                match copy_body(response, &mut out, &mut hasher, &mut have, file, progress) {
                    // A body that ends before the file does is a dropped connection too.
                    Ok(n) if have < file.size => Err(CopyError::Read(
                        std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "the body ended early",
                        ),
                        n,
                    )),
                    other => other,
                };
            match outcome {
                Ok(n) => received += n,
                Err(CopyError::TooLong) => {
                    let _ = fs::remove_file(&partial);
                    return Err(HubError::WrongSize {
                        path: file.path.clone(),
                        expected: file.size,
                        got: have,
                    });
                }
                Err(CopyError::Write(e)) => return Err(io(&partial)(e)),
                Err(CopyError::Read(e, n)) => {
                    received += n;
                    failures += 1;
                    if failures > retries {
                        return Err(HubError::Transport {
                            url: url.to_string(),
                            error: format!(
                                "{e} ({failures} dropped connections; {have} of {} bytes kept in {} for the next run)",
                                file.size,
                                partial.display()
                            ),
                        });
                    }
                }
            }
        }
        out.sync_all().map_err(io(&partial))?;
        drop(out);
        let got = hasher.finish();
        if got != file.digest {
            let _ = fs::remove_file(&partial);
            return Err(HubError::WrongDigest {
                path: file.path.clone(),
                expected: file.digest.to_string(),
                got: got.to_string(),
            });
        }
        place(&partial, dest, &file.path)?;
        Ok(Outcome::Fetched { resumed, received })
    }
}

fn record(report: &Mutex<DownloadReport>, file: &RepoFile, outcome: Outcome) {
    let Ok(mut r) = report.lock() else { return };
    match outcome {
        Outcome::Present => r.already_present.push(file.path.clone()),
        Outcome::Fetched { resumed, received } => {
            r.fetched.push(file.path.clone());
            r.bytes_received += received;
            if resumed {
                r.resumed.push(file.path.clone());
            }
        }
    }
}

/// Whether `target` already holds exactly `file` (size, then digest).
fn already_in_place(target: &Path, file: &RepoFile) -> Result<bool, HubError> {
    let Ok(meta) = fs::symlink_metadata(target) else {
        return Ok(false);
    };
    if !meta.is_file() || meta.len() != file.size {
        return Ok(false);
    }
    let mut hasher = StreamHasher::new(&file.digest, file.size);
    hash_file(target, &mut hasher)?;
    Ok(hasher.finish() == file.digest)
}

/// The hasher and length of a partial file from an earlier run (hashed again: it is only
/// trusted once the whole file's digest matches).
fn resume_partial(partial: &Path, file: &RepoFile) -> Result<(StreamHasher, u64), HubError> {
    let mut hasher = StreamHasher::new(&file.digest, file.size);
    let len = fs::symlink_metadata(partial).map_or(0, |m| if m.is_file() { m.len() } else { 0 });
    if len == 0 || len > file.size {
        let _ = fs::remove_file(partial);
        return Ok((hasher, 0));
    }
    hash_file(partial, &mut hasher)?;
    Ok((hasher, len))
}

fn hash_file(path: &Path, hasher: &mut StreamHasher) -> Result<u64, HubError> {
    let mut f = regular_file::open(path).map_err(io(path))?;
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0;
    loop {
        let n = f.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            return Ok(total);
        }
        hasher.update(&buf[..n]);
        total += n as u64;
    }
}

/// A 206 whose Content-Range starts at `from`.
fn range_honoured(response: &ureq::Response, from: u64) -> bool {
    response.status() == 206
        && response
            .header("content-range")
            .is_some_and(|r| r.starts_with(&format!("bytes {from}-")))
}

enum CopyError {
    TooLong,
    Write(std::io::Error),
    Read(std::io::Error, u64),
}

fn copy_body(
    response: ureq::Response,
    out: &mut File,
    hasher: &mut StreamHasher,
    have: &mut u64,
    file: &RepoFile,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<u64, CopyError> {
    let mut reader = response.into_reader();
    let mut buf = vec![0u8; CHUNK];
    let mut received = 0;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(received),
            Ok(n) => n,
            Err(e) => return Err(CopyError::Read(e, received)),
        };
        if *have + n as u64 > file.size {
            return Err(CopyError::TooLong);
        }
        out.write_all(&buf[..n]).map_err(CopyError::Write)?;
        hasher.update(&buf[..n]);
        *have += n as u64;
        received += n as u64;
        progress(n as u64);
    }
}

/// Renames `partial` (written and fsynced) over `target`, creating its folders, and makes the
/// rename durable.
fn place(partial: &Path, dest: &Path, relative: &str) -> Result<(), HubError> {
    let target = dest.join(relative);
    let folders = Path::new(relative).parent().unwrap_or(Path::new(""));
    atomic_file::create_dirs_beneath(dest, folders).map_err(io(&target))?;
    atomic_file::place(partial, &target).map_err(|e| io(&e.path)(e.source))
}
