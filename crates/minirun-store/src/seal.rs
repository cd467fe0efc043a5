//! The per-user key that seals evidence and checkpoints. Anyone who can write an artifact
//! folder can write `.minirun/evidence.json`; only someone who can read this key (kept outside
//! every artifact folder, owned by the user, mode 0600) can write one that a reader accepts.
//! Specified in `docs/formats/evidence.md` ("The seal").

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Names the key file explicitly (a path), overriding the default location.
pub const KEY_ENV: &str = "MINIRUN_EVIDENCE_KEY";
const KEY_FILE: &str = "evidence.key";
const KEY_BYTES: usize = 32;
/// Hex digits and an optional newline: anything longer is not a key file.
const MAX_KEY_FILE: u64 = 2 * KEY_BYTES as u64 + 1;

/// Why the key could not be loaded or made.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(
        "no place for the evidence key: set {KEY_ENV}=FILE, or XDG_CONFIG_HOME or HOME (the key lives in $XDG_CONFIG_HOME/minirun/{KEY_FILE})"
    )]
    NoHome,
    #[error("evidence key {path}: {error} (set {KEY_ENV}=FILE to keep the key elsewhere)")]
    Io { path: String, error: std::io::Error },
    #[error(
        "evidence key {path} is readable or writable by others (mode {mode:o}): whoever can read it can forge evidence. Run `chmod 600 {path}`, or remove it to make a new one (existing evidence must then be verified again)"
    )]
    Exposed { path: String, mode: u32 },
    #[error(
        "evidence key {path} belongs to user {owner}, not to this user ({me}): use your own key (set {KEY_ENV}=FILE or remove it)"
    )]
    NotOwned { path: String, owner: u32, me: u32 },
    #[error(
        "evidence key {path} is not a key ({reason}): remove it to make a new one (existing evidence must then be verified again)"
    )]
    Malformed { path: String, reason: String },
    #[error(
        "the evidence key's folder {path} {reason}: whoever can write there can swap the key and forge evidence. Make it yours and closed to others (`chmod go-w {path}`), or set {KEY_ENV}=FILE to keep the key in a private folder"
    )]
    FolderOpen { path: String, reason: String },
    #[error(
        "no verification evidence can be checked: there is no evidence key at {path} (evidence is sealed with the key that verified it). `minirun verify` makes the key and the evidence; or run with --unverified. If the key was moved, set {KEY_ENV}=FILE"
    )]
    Missing { path: String },
}

/// The user's HMAC-SHA256 key for sealing evidence.
#[derive(Clone)]
pub struct SealKey {
    key: [u8; KEY_BYTES],
    path: PathBuf,
}

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealKey")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SealKey {
    /// The user's key: `$MINIRUN_EVIDENCE_KEY`, else `$XDG_CONFIG_HOME/minirun/evidence.key`,
    /// else `$HOME/.config/minirun/evidence.key`; made (random, 0600) the first time.
    pub fn for_user() -> Result<SealKey, KeyError> {
        SealKey::load_or_create(&default_path()?)
    }

    /// The user's existing key, for reading evidence: a missing one is refused
    /// ([`KeyError::Missing`]) rather than made, since evidence sealed with another key could
    /// never open under a new one.
    pub fn existing_for_user() -> Result<SealKey, KeyError> {
        SealKey::existing(&default_path()?)
    }

    /// The key at `path`, refused when there is none.
    pub fn existing(path: &Path) -> Result<SealKey, KeyError> {
        match load(path) {
            Err(KeyError::Io { error, .. }) if error.kind() == std::io::ErrorKind::NotFound => {
                Err(KeyError::Missing {
                    path: path.display().to_string(),
                })
            }
            other => other,
        }
    }

    /// The key at `path`, made there first if there is none. The file must be regular (not a
    /// link), owned by this user and closed to everyone else.
    pub fn load_or_create(path: &Path) -> Result<SealKey, KeyError> {
        match load(path) {
            Err(KeyError::Io { error, .. }) if error.kind() == std::io::ErrorKind::NotFound => {
                create(path)?;
                load(path)
            }
            other => other,
        }
    }

    /// Where the key lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The seal of `bytes` under `domain` (lowercase hex of the HMAC-SHA256).
    pub fn seal(&self, domain: &str, bytes: &[u8]) -> String {
        minirun_format::tile::hex(&self.mac(domain, bytes).finalize().into_bytes())
    }

    /// Whether `seal` is the seal of `bytes` under `domain` (compared in constant time).
    pub fn opens(&self, domain: &str, bytes: &[u8], seal: &str) -> bool {
        let Some(tag) = unhex(seal) else {
            return false;
        };
        self.mac(domain, bytes).verify_slice(&tag).is_ok()
    }

    fn mac(&self, domain: &str, bytes: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .expect("HMAC takes a key of any length");
        mac.update(domain.as_bytes());
        mac.update(b"\n");
        mac.update(bytes);
        mac
    }
}

fn default_path() -> Result<PathBuf, KeyError> {
    default_path_in(|name| std::env::var_os(name))
}

/// [`default_path`] with the environment read through `var` (an empty value counts as unset).
fn default_path_in(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<PathBuf, KeyError> {
    let set = |name: &str| var(name).filter(|v| !v.is_empty());
    if let Some(path) = set(KEY_ENV) {
        return Ok(PathBuf::from(path));
    }
    let config = set("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| set("HOME").map(|home| PathBuf::from(home).join(".config")))
        .ok_or(KeyError::NoHome)?;
    Ok(config.join("minirun").join(KEY_FILE))
}

fn io_error(path: &Path) -> impl Fn(std::io::Error) -> KeyError + '_ {
    move |error| KeyError::Io {
        path: path.display().to_string(),
        error,
    }
}

/// Refuses a key folder someone else could write in (another owner, or group/other write
/// bits): they could replace the key with one they know.
fn check_folder(path: &Path) -> Result<(), KeyError> {
    let dir = atomic_file::parent_dir(path);
    let open = |reason: String| KeyError::FolderOpen {
        path: dir.display().to_string(),
        reason,
    };
    let meta = match std::fs::symlink_metadata(&dir) {
        Ok(meta) => meta,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(io_error(&dir)(error)),
    };
    if !meta.is_dir() {
        return Err(open(format!(
            "is {}, not a folder",
            regular_file::describe(meta.file_type())
        )));
    }
    let me = rustix::process::geteuid().as_raw();
    if !may_own_the_key_folder(meta.uid(), me) {
        return Err(open(format!(
            "belongs to user {}, not to this user ({me})",
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(open(format!(
            "is writable by others (mode {:o})",
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

/// The user and root may own the key's folder (a root-owned folder is as safe as the user's own:
/// root can read the key anyway); anyone else could swap the key.
fn may_own_the_key_folder(owner: u32, me: u32) -> bool {
    owner == me || owner == 0
}

fn load(path: &Path) -> Result<SealKey, KeyError> {
    check_folder(path)?;
    let shown = path.display().to_string();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(path)
        .map_err(io_error(path))?;
    let meta = file.metadata().map_err(io_error(path))?;
    if !meta.file_type().is_file() {
        return Err(KeyError::Malformed {
            path: shown,
            reason: regular_file::describe(meta.file_type()).to_string(),
        });
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(KeyError::NotOwned {
            path: shown,
            owner: meta.uid(),
            me,
        });
    }
    if meta.mode() & 0o077 != 0 {
        return Err(KeyError::Exposed {
            path: shown,
            mode: meta.mode() & 0o7777,
        });
    }
    let malformed = |reason: &str| KeyError::Malformed {
        path: shown.clone(),
        reason: reason.to_string(),
    };
    let bytes = regular_file::read_at_most(file, MAX_KEY_FILE)
        .map_err(io_error(path))?
        .ok_or_else(|| malformed("longer than a key"))?;
    let text = String::from_utf8(bytes).map_err(|_| malformed("not text"))?;
    let hex = text.strip_suffix('\n').unwrap_or(&text);
    let bytes = unhex(hex).ok_or_else(|| malformed("not lowercase hex"))?;
    let key: [u8; KEY_BYTES] = bytes
        .try_into()
        .map_err(|_| malformed("not 64 hex digits"))?;
    Ok(SealKey {
        key,
        path: path.to_path_buf(),
    })
}

/// Writes a new random key and moves it into place only if no key is there: two processes (or
/// threads) making the first key at once end up sharing one of them.
fn create(path: &Path) -> Result<(), KeyError> {
    let dir = atomic_file::parent_dir(path);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(io_error(&dir))?;
    let mut key = [0u8; KEY_BYTES];
    getrandom::fill(&mut key).map_err(|e| KeyError::Io {
        path: path.display().to_string(),
        error: std::io::Error::other(format!("no randomness for a key: {e}")),
    })?;
    let written = atomic_file::write_new_with(path, atomic_file::Options::private(), |mut file| {
        writeln!(file, "{}", minirun_format::tile::hex(&key)).map_err(|source| {
            atomic_file::AtomicWriteError {
                path: path.to_path_buf(),
                source,
            }
        })
    });
    // Placed::AlreadyThere: another maker's key landed first, and is the one every maker loads.
    written.map(|_| ()).map_err(|e| KeyError::Io {
        path: e.path.display().to_string(),
        error: e.source,
    })
}

fn unhex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// The test vector of `docs/formats/evidence.md`, computed with Python's `hmac` module.
    #[test]
    fn the_seal_is_hmac_sha256_over_domain_newline_body() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        std::fs::write(
            &path,
            "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n",
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let key = SealKey::load_or_create(&path).unwrap();
        assert_eq!(
            key.seal("minirun-evidence-seal/2", br#"{"schema":"example"}"#),
            "61aecfbaed27ab372ab1af0edfc3d70c873a9ce401cf8817dd3893369717dccb"
        );
    }

    #[test]
    fn the_key_lives_where_the_environment_says_in_order() {
        let env = |vars: &[(&'static str, &'static str)]| {
            default_path_in(move |name| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            })
        };
        let home = [("HOME", "/home/u")];
        assert_eq!(
            env(&home).unwrap(),
            Path::new("/home/u/.config/minirun/evidence.key")
        );
        let xdg = [("HOME", "/home/u"), ("XDG_CONFIG_HOME", "/cfg")];
        assert_eq!(env(&xdg).unwrap(), Path::new("/cfg/minirun/evidence.key"));
        let set = [("HOME", "/home/u"), ("MINIRUN_EVIDENCE_KEY", "/keys/k")];
        assert_eq!(env(&set).unwrap(), Path::new("/keys/k"));
        let empty = [
            ("HOME", "/home/u"),
            ("MINIRUN_EVIDENCE_KEY", ""),
            ("XDG_CONFIG_HOME", ""),
        ];
        assert_eq!(
            env(&empty).unwrap(),
            Path::new("/home/u/.config/minirun/evidence.key")
        );
        assert!(matches!(env(&[]), Err(KeyError::NoHome)));
    }

    #[test]
    fn only_the_user_or_root_may_own_the_key_folder() {
        assert!(may_own_the_key_folder(1000, 1000));
        assert!(may_own_the_key_folder(0, 1000));
        assert!(may_own_the_key_folder(0, 0));
        assert!(!may_own_the_key_folder(1001, 1000));
        assert!(!may_own_the_key_folder(1001, 0));
    }

    #[test]
    fn a_missing_key_folder_is_fine_and_an_unreadable_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        assert!(check_folder(&dir.path().join("not-yet/k")).is_ok());
        std::fs::write(dir.path().join("file"), b"").unwrap();
        let below_a_file = dir.path().join("file/sub/k");
        match check_folder(&below_a_file) {
            Err(KeyError::Io { path, .. }) => {
                assert_eq!(path, dir.path().join("file/sub").display().to_string())
            }
            other => panic!("{other:?}"),
        }
        // A missing key is Missing only when nothing is there; a link is an error of its own.
        std::os::unix::fs::symlink("elsewhere", dir.path().join("link")).unwrap();
        assert!(matches!(
            SealKey::existing(&dir.path().join("link")),
            Err(KeyError::Io { .. })
        ));
    }

    #[test]
    fn a_key_shows_its_path_and_never_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let key = SealKey::load_or_create(&path).unwrap();
        let shown = format!("{key:?}");
        assert!(shown.starts_with("SealKey"), "{shown}");
        assert!(shown.contains(&path.display().to_string()), "{shown}");
        let hex = std::fs::read_to_string(&path).unwrap();
        assert!(!shown.contains(hex.trim()), "{shown}");
        assert!(!shown.contains(&hex.trim()[..8]), "{shown}");
    }

    #[test]
    fn unhex_takes_even_length_lowercase_hex_only() {
        assert_eq!(unhex("0aff"), Some(vec![0x0a, 0xff]));
        assert_eq!(unhex(""), Some(vec![]));
        for bad in ["abc", "0AFF", "zz", "0g", " 0a"] {
            assert_eq!(unhex(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_key_is_made_once_and_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/evidence.key");
        let first = SealKey::load_or_create(&path).unwrap();
        let again = SealKey::load_or_create(&path).unwrap();
        assert_eq!(first.key, again.key);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let dir_mode = std::fs::metadata(path.parent().unwrap()).unwrap().mode();
        assert_eq!(dir_mode & 0o777, 0o700);
    }

    #[test]
    fn threads_making_the_first_key_at_once_all_get_the_one_that_landed() {
        for _ in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("evidence.key");
            let keys: Vec<[u8; KEY_BYTES]> = std::thread::scope(|scope| {
                let makers: Vec<_> = (0..8)
                    .map(|_| scope.spawn(|| SealKey::load_or_create(&path).map(|k| k.key)))
                    .collect();
                makers
                    .into_iter()
                    .map(|m| m.join().unwrap().unwrap())
                    .collect()
            });
            assert!(keys.iter().all(|k| *k == keys[0]));
            let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
            assert_eq!(left.len(), 1, "temp files left beside the key");
        }
    }

    #[test]
    fn seals_open_only_under_the_same_key_domain_and_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let a = SealKey::load_or_create(&dir.path().join("a")).unwrap();
        let b = SealKey::load_or_create(&dir.path().join("b")).unwrap();
        let seal = a.seal("d", b"bytes");
        assert!(a.opens("d", b"bytes", &seal));
        assert!(!b.opens("d", b"bytes", &seal));
        assert!(!a.opens("e", b"bytes", &seal));
        assert!(!a.opens("d", b"bytez", &seal));
        assert!(!a.opens("d", b"bytes", "not hex"));
    }

    #[test]
    fn a_key_in_a_folder_others_can_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        SealKey::load_or_create(&path).unwrap();
        for mode in [0o770, 0o707] {
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).unwrap();
            let err = SealKey::load_or_create(&path).unwrap_err();
            assert!(matches!(err, KeyError::FolderOpen { .. }), "{err}");
            assert!(err.to_string().contains("writable by others"), "{err}");
        }
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(SealKey::existing(&path).is_ok());
    }

    #[test]
    fn reading_evidence_never_makes_a_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let err = SealKey::existing(&path).unwrap_err();
        assert!(matches!(err, KeyError::Missing { .. }), "{err}");
        assert!(!path.exists(), "no key was made");
        let made = SealKey::load_or_create(&path).unwrap();
        let read = SealKey::existing(&path).unwrap();
        assert_eq!(made.seal("d", b"x"), read.seal("d", b"x"));
    }

    #[test]
    fn an_exposed_linked_or_malformed_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        SealKey::load_or_create(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(
            SealKey::load_or_create(&path),
            Err(KeyError::Exposed { mode: 0o640, .. })
        ));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(matches!(
            SealKey::load_or_create(&link),
            Err(KeyError::Io { .. })
        ));
        let short = dir.path().join("short");
        std::fs::write(&short, "abcd\n").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            SealKey::load_or_create(&short),
            Err(KeyError::Malformed { .. })
        ));
    }
}
