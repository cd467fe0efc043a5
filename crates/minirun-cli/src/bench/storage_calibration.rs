//! What `minirun bench storage` measured on a device, kept per device, so that a run of an
//! artifact stored there can project its read time per token: the plan's bytes read per token
//! at the measured rate. Only measurements that bypassed the page cache are kept (through the
//! cache the figure would describe memory); a device with none gets no projection rather than
//! a guess.
//!
//! The store is one small JSON file: `$XDG_STATE_HOME/minirun/storage-calibration.json`, else
//! `$HOME/.local/state/minirun/storage-calibration.json`, written atomically.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

const FILE_NAME: &str = "storage-calibration.json";
/// A store is a few hundred bytes a device; anything much larger is not one this build wrote.
const MAX_STORE_BYTES: u64 = 1 << 20;

/// The best rate one measurement found on a device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub read_size: u64,
    pub queue_depth: usize,
    pub bytes_per_second: f64,
    /// Seconds since the Unix epoch.
    pub measured_at: u64,
}

/// A calibration as `minirun bench storage` kept it: for which device, in which store.
#[derive(Debug, Clone, Serialize)]
pub struct Kept {
    pub device: String,
    pub store: String,
    #[serde(flatten)]
    pub calibration: Calibration,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Store {
    version: u32,
    devices: BTreeMap<String, Calibration>,
}

/// Where the store lives, from the environment; `None` where neither variable is set.
pub fn store_path() -> Option<PathBuf> {
    let set = |key: &str| {
        std::env::var_os(key)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let dir = set("XDG_STATE_HOME").or_else(|| set("HOME").map(|h| h.join(".local/state")))?;
    Some(dir.join("minirun").join(FILE_NAME))
}

/// The device holding `path`: `MAJOR:MINOR`, with the block device's name and model where sysfs
/// gives them (`253:0 vda`, `259:1 nvme0n1p1 Samsung SSD 990 PRO 2TB`).
pub fn device_of(path: &Path) -> Result<String> {
    let dev = std::fs::metadata(path)
        .with_context(|| format!("cannot stat {}", path.display()))?
        .dev();
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let mut key = format!("{major}:{minor}");
    if let Some(name) = std::fs::read_link(&sys)
        .ok()
        .and_then(|target| target.file_name().map(|n| n.to_string_lossy().into_owned()))
    {
        key = format!("{key} {name}");
    }
    // A partition's model is its disk's.
    let model = ["device/model", "../device/model"]
        .iter()
        .find_map(|m| std::fs::read_to_string(sys.join(m)).ok())
        .map(|m| m.trim().to_string())
        .filter(|m| !m.is_empty());
    if let Some(model) = model {
        key = format!("{key} {model}");
    }
    Ok(key)
}

fn load(path: &Path) -> Result<Store> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Store::default()),
        Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.display())),
    };
    let len = file.metadata()?.len();
    if len > MAX_STORE_BYTES {
        bail!(
            "{} is {len} bytes, not a storage calibration this build wrote: remove it and run `minirun bench storage DIR` again",
            path.display()
        );
    }
    let store: Store = serde_json::from_reader(std::io::BufReader::new(file)).with_context(|| {
        format!(
            "{} is not a storage calibration: remove it and run `minirun bench storage DIR` again",
            path.display()
        )
    })?;
    if store.version != 1 {
        bail!(
            "{} is a version {} storage calibration; this build reads version 1",
            path.display(),
            store.version
        );
    }
    Ok(store)
}

/// Records `calibration` for `device` in the store at `path` (replacing that device's last one).
pub fn save(path: &Path, device: &str, calibration: Calibration) -> Result<()> {
    let mut store = load(path)?;
    store.version = 1;
    store.devices.insert(device.to_string(), calibration);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    atomic_file::write_bytes(path, &serde_json::to_vec_pretty(&store)?)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Every device's calibration in the store at `path`.
pub fn all(path: &Path) -> Result<BTreeMap<String, Calibration>> {
    Ok(load(path)?.devices)
}

/// The calibration of the device holding `artifact`, if the store has one; a store that cannot
/// be read gives none (the run says so) rather than failing the run.
pub fn for_artifact(artifact: &Path) -> std::result::Result<Option<Calibration>, String> {
    let path = store_path().ok_or("neither XDG_STATE_HOME nor HOME is set")?;
    let device = device_of(artifact).map_err(|e| e.to_string())?;
    let store = load(&path).map_err(|e| format!("{e:#}"))?;
    Ok(store.devices.get(&device).cloned())
}

/// Seconds a token's reads take at the calibrated rate.
pub fn projected_read_seconds(bytes_per_token: u64, calibration: &Calibration) -> f64 {
    bytes_per_token as f64 / calibration.bytes_per_second
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(rate: f64) -> Calibration {
        Calibration {
            read_size: 4 << 20,
            queue_depth: 2,
            bytes_per_second: rate,
            measured_at: 1_800_000_000,
        }
    }

    #[test]
    fn a_device_keeps_its_last_calibration_and_others_stay() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/minirun").join(FILE_NAME);
        assert!(all(&path).unwrap().is_empty(), "no store: no calibration");
        save(&path, "253:0 vda", measured(2e9)).unwrap();
        save(&path, "259:1 nvme0n1", measured(6e9)).unwrap();
        save(&path, "253:0 vda", measured(1.5e9)).unwrap();
        let devices = all(&path).unwrap();
        assert_eq!(devices.len(), 2);
        assert_eq!(devices["253:0 vda"], measured(1.5e9));
        assert_eq!(devices["259:1 nvme0n1"].bytes_per_second, 6e9);
    }

    #[test]
    fn a_store_this_build_did_not_write_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        std::fs::write(&path, b"{\"version\": 2, \"devices\": {}}").unwrap();
        assert!(format!("{:#}", all(&path).unwrap_err()).contains("version 2"));
        std::fs::write(&path, b"not json").unwrap();
        let err = format!("{:#}", all(&path).unwrap_err());
        assert!(err.contains("minirun bench storage DIR"), "{err}");
        assert!(
            save(&path, "253:0 vda", measured(1e9)).is_err(),
            "not overwritten"
        );
    }

    #[test]
    fn a_projection_is_the_bytes_at_the_measured_rate() {
        assert_eq!(projected_read_seconds(3_000_000_000, &measured(2e9)), 1.5);
    }

    #[test]
    fn a_folder_s_device_is_named_by_its_number() {
        let key = device_of(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
        let number = key.split(' ').next().unwrap();
        let (major, minor) = number.split_once(':').unwrap();
        assert!(
            major.parse::<u32>().is_ok() && minor.parse::<u32>().is_ok(),
            "{key}"
        );
    }
}
