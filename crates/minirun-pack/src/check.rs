//! `minirun check`: compare every packed block, scale, bias and plain stream of an artifact
//! with the source checkpoint's bytes. A byte comparison, not a tolerance.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use minirun_format::tile::{HEADER_BYTES, TileContainer};
use rayon::prelude::*;

use crate::PackError;
use crate::checkpoint::Checkpoint;
use minirun_format::artifact::{
    FileEntry, INCOMPLETE_MARKER, INDEX_FILE, MANIFEST_FILE, Member, SourceRef, UnitManifest,
};
use minirun_store::ArtifactFiles;

/// Bytes compared per read.
const CHUNK: u64 = 8 << 20;

/// The first difference found.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Difference {
    pub unit: String,
    pub file: String,
    /// The tile, for a container.
    pub tile: Option<u64>,
    /// `packed`, `scales`, `biases`, `padding`, `member` or `header`.
    pub region: String,
    pub source_tensor: String,
    /// Byte offset of the first differing byte in the artifact file.
    pub file_offset: u64,
    pub detail: String,
}

/// Why a check failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Pack(#[from] PackError),
    #[error(
        "{}/{}{}: {} differs from source tensor {} at file offset {}: {}",
        .0.unit, .0.file, .0.tile.map(|t| format!(" tile {t}")).unwrap_or_default(),
        .0.region, .0.source_tensor, .0.file_offset, .0.detail
    )]
    Differs(Box<Difference>),
}

/// What a successful check covered.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckReport {
    pub units: Vec<String>,
    pub files: usize,
    pub bytes_compared: u64,
}

/// Compares `artifact` with the checkpoint at `source`; stops at the first difference.
pub fn check(
    artifact: &Path,
    source: &Path,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<CheckReport, CheckError> {
    let ckpt = Checkpoint::open(source)?;
    let mut report = CheckReport {
        units: Vec::new(),
        files: 0,
        bytes_compared: 0,
    };
    let units = manifests(artifact)?;
    if !units.is_empty() {
        check_complete(artifact, &units)?;
    }
    let jobs: Vec<(&Path, &str, &FileEntry)> = units
        .iter()
        .flat_map(|(dir, m)| {
            m.files
                .iter()
                .map(move |f| (dir.as_path(), m.unit.as_str(), f))
        })
        .collect();
    // Files are compared on every core; the first difference in manifest order is reported.
    let results: Vec<Result<u64, CheckError>> = jobs
        .par_iter()
        .map(|&(dir, unit, entry)| {
            let ctx = Ctx {
                ckpt: &ckpt,
                unit,
                dir,
                file: entry.name(),
                progress,
            };
            match entry {
                FileEntry::TileContainer { .. } => ctx.container(entry),
                FileEntry::Blob { members, bytes, .. } => ctx.blob(members, *bytes),
            }
        })
        .collect();
    for result in results {
        report.bytes_compared += result?;
        report.files += 1;
    }
    report.units = units.iter().map(|(_, m)| m.unit.clone()).collect();
    if report.units.is_empty() {
        return Err(PackError::Refused {
            what: artifact.display().to_string(),
            reason:
                "no unit manifest (*/manifest.json) found: not an artifact written by minirun pack"
                    .to_string(),
        }
        .into());
    }
    Ok(report)
}

fn incomplete(artifact: &Path, reason: String) -> CheckError {
    PackError::Refused {
        what: artifact.display().to_string(),
        reason,
    }
    .into()
}

/// The artifact must be a finished pack: no marker, an index.json whose units are exactly the
/// manifests found, and no file in a unit that its manifest does not list.
fn check_complete(artifact: &Path, units: &[(PathBuf, UnitManifest)]) -> Result<(), CheckError> {
    if artifact.join(INCOMPLETE_MARKER).exists() {
        return Err(incomplete(
            artifact,
            "an interrupted pack: run minirun pack again".to_string(),
        ));
    }
    let index_path = artifact.join(INDEX_FILE);
    let bytes = std::fs::read(&index_path).map_err(|e| PackError::io(&index_path, e))?;
    let index: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| incomplete(artifact, format!("index.json is not JSON: {e}")))?;
    let listed: Vec<(String, u64, u64)> = index
        .get("units")
        .and_then(serde_json::Value::as_array)
        .map(|a| {
            a.iter()
                .map(|u| {
                    let field = |k: &str| {
                        u.get(k)
                            .and_then(serde_json::Value::as_u64)
                            .unwrap_or(u64::MAX)
                    };
                    (
                        u.get("unit")
                            .and_then(serde_json::Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                        field("files"),
                        field("bytes"),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let found: Vec<(String, u64, u64)> = units
        .iter()
        .map(|(_, m)| {
            (
                m.unit.clone(),
                m.files.len() as u64,
                m.files.iter().map(FileEntry::bytes).sum(),
            )
        })
        .collect();
    if listed != found {
        return Err(incomplete(
            artifact,
            format!("index.json lists units {listed:?} but the manifests describe {found:?}"),
        ));
    }
    for (dir, m) in units {
        let on_disk = std::fs::read_dir(dir).map_err(|e| PackError::io(dir, e))?;
        for entry in on_disk.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name != MANIFEST_FILE && !m.files.iter().any(|f| f.name() == name) {
                return Err(incomplete(
                    artifact,
                    format!("{}/{name} is not in its unit's manifest", m.unit),
                ));
            }
        }
    }
    Ok(())
}

/// The unit manifests, read by the store's one reader of the layout (rooted, no-follow,
/// bounded), with each unit's directory.
fn manifests(artifact: &Path) -> Result<Vec<(PathBuf, UnitManifest)>, PackError> {
    let refused = |e: minirun_store::LayoutError| PackError::Refused {
        what: artifact.display().to_string(),
        reason: e.to_string(),
    };
    let manifests = ArtifactFiles::unverified(artifact)
        .and_then(|files| files.unit_manifests())
        .map_err(refused)?;
    Ok(manifests
        .into_iter()
        .map(|m| (artifact.join(&m.unit), m))
        .collect())
}

struct Ctx<'a> {
    ckpt: &'a Checkpoint,
    unit: &'a str,
    dir: &'a Path,
    file: &'a str,
    progress: &'a dyn Fn(u64),
}

impl Ctx<'_> {
    fn differs(
        &self,
        tile: Option<u64>,
        region: &str,
        source: &str,
        file_offset: u64,
        detail: String,
    ) -> CheckError {
        CheckError::Differs(Box::new(Difference {
            unit: self.unit.to_string(),
            file: self.file.to_string(),
            tile,
            region: region.to_string(),
            source_tensor: source.to_string(),
            file_offset,
            detail,
        }))
    }

    fn open(&self) -> Result<(File, u64), CheckError> {
        let path = self.dir.join(self.file);
        let file = regular_file::open(&path).map_err(|e| PackError::io(&path, e))?;
        let len = file.metadata().map_err(|e| PackError::io(&path, e))?.len();
        Ok((file, len))
    }

    /// The manifest's source reference must name a tensor of this checkpoint, exactly.
    fn source_file(&self, r: &SourceRef) -> Result<File, CheckError> {
        let matches = self.ckpt.tensors.get(&r.source_tensor).is_some_and(|t| {
            format!("{:?}", t.dtype) == r.dtype
                && t.shape == r.shape
                && t.shard == r.shard
                && t.start == r.shard_offset
                && t.len == r.bytes
        });
        if !matches {
            return Err(self.differs(None, "manifest", &r.source_tensor, 0,
                "the manifest's source tensor (dtype, shape, shard, offset) is not in this checkpoint".to_string()));
        }
        let path = self.ckpt.dir.join(&r.shard);
        Ok(regular_file::open(&path).map_err(|e| PackError::io(&path, e))?)
    }

    fn container(&self, entry: &FileEntry) -> Result<u64, CheckError> {
        let FileEntry::TileContainer {
            packed,
            scales,
            biases,
            bytes,
            count,
            ..
        } = entry
        else {
            return Ok(0);
        };
        let (file, len) = self.open()?;
        if len != *bytes {
            return Err(self.differs(
                None,
                "header",
                &packed.source_tensor,
                len,
                format!("file is {len} bytes, manifest says {bytes}"),
            ));
        }
        let mut header = vec![0u8; HEADER_BYTES.min(len) as usize];
        file.read_exact_at(&mut header, 0)
            .map_err(|e| PackError::io(self.dir.join(self.file), e))?;
        let c = TileContainer::parse(&header, len)
            .map_err(|e| self.differs(None, "header", &packed.source_tensor, 0, e.to_string()))?;
        if u64::from(c.geometry.tile_count) != u64::from(*count) {
            return Err(self.differs(
                None,
                "header",
                &packed.source_tensor,
                16,
                "tile count differs from the manifest".to_string(),
            ));
        }
        let n = u64::from(*count);
        let mut compared = 0;
        // Each source reference is checked against the checkpoint and opened once, not per tile.
        let packed_src = (packed, self.source_file(packed)?);
        let scales_src = (scales, self.source_file(scales)?);
        let biases_src = match biases {
            Some(b) => Some((b, self.source_file(b)?)),
            None => None,
        };
        for tile in 0..n {
            let regions = [
                ("packed", Some(&packed_src), c.packed_range(tile).ok()),
                ("scales", Some(&scales_src), c.scale_range(tile).ok()),
                (
                    "biases",
                    biases_src.as_ref(),
                    c.bias_range(tile).ok().flatten(),
                ),
            ];
            for (region, source, range) in regions {
                let (Some((source, src)), Some(range)) = (source, range) else {
                    continue;
                };
                let per = source.bytes / n;
                compared += self.compare(
                    &file,
                    range.start,
                    src,
                    source.shard_offset + tile * per,
                    per,
                    Some(tile),
                    region,
                    &source.source_tensor,
                )?;
            }
            self.check_padding(&file, &c, tile, &packed.source_tensor)?;
        }
        Ok(compared)
    }

    /// The only bytes of a tile not from the checkpoint are zero padding.
    fn check_padding(
        &self,
        file: &File,
        c: &TileContainer,
        tile: u64,
        tensor: &str,
    ) -> Result<(), CheckError> {
        let l = c.layout;
        let start = c
            .tile_range(tile)
            .map_err(|e| self.differs(Some(tile), "header", tensor, 0, e.to_string()))?
            .start;
        let pads = [
            (start + l.packed_bytes, l.packed_region - l.packed_bytes),
            (
                start + l.scale_offset + l.scale_bytes,
                l.scale_region - l.scale_bytes,
            ),
            (
                start + l.bias_offset + l.bias_bytes,
                l.bias_region - l.bias_bytes,
            ),
        ];
        for (at, len) in pads.into_iter().filter(|(_, len)| *len > 0) {
            let mut buf = vec![0u8; len as usize];
            file.read_exact_at(&mut buf, at)
                .map_err(|e| PackError::io(self.dir.join(self.file), e))?;
            if let Some(i) = buf.iter().position(|&b| b != 0) {
                return Err(self.differs(
                    Some(tile),
                    "padding",
                    "-",
                    at + i as u64,
                    format!("padding byte is {:#04x}, not 0", buf[i]),
                ));
            }
        }
        Ok(())
    }

    fn blob(&self, members: &[Member], bytes: u64) -> Result<u64, CheckError> {
        let (file, len) = self.open()?;
        let mut expected_offset = 0;
        for m in members {
            if m.offset != expected_offset {
                return Err(self.differs(
                    None,
                    "member",
                    &m.source.source_tensor,
                    m.offset,
                    "members do not tile the blob without gaps".to_string(),
                ));
            }
            let src = self.source_file(&m.source)?;
            self.compare(
                &file,
                m.offset,
                &src,
                m.source.shard_offset,
                m.source.bytes,
                None,
                "member",
                &m.source.source_tensor,
            )?;
            expected_offset += m.source.bytes;
        }
        if expected_offset != bytes || len != bytes {
            return Err(self.differs(None, "member", "-", expected_offset.min(len),
                format!("members cover {expected_offset} bytes, the manifest says {bytes}, the file has {len}")));
        }
        Ok(bytes)
    }

    #[allow(clippy::too_many_arguments)]
    fn compare(
        &self,
        ours: &File,
        at: u64,
        src: &File,
        src_at: u64,
        len: u64,
        tile: Option<u64>,
        region: &str,
        tensor: &str,
    ) -> Result<u64, CheckError> {
        let mut done = 0;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        while done < len {
            let n = (len - done).min(CHUNK) as usize;
            a.resize(n, 0);
            b.resize(n, 0);
            let read = |f: &File, buf: &mut [u8], off: u64, what: &str| {
                f.read_exact_at(buf, off).map_err(|e| {
                    self.differs(
                        tile,
                        region,
                        tensor,
                        off,
                        format!("cannot read the {what}: {e}"),
                    )
                })
            };
            read(ours, &mut a, at + done, "artifact")?;
            read(src, &mut b, src_at + done, "source")?;
            if let Some(i) = a.iter().zip(&b).position(|(x, y)| x != y) {
                let off = done + i as u64;
                return Err(self.differs(tile, region, tensor, at + off,
                    format!("byte {off} of the {region} is {:#04x} in the artifact and {:#04x} in the source", a[i], b[i])));
            }
            (self.progress)(n as u64);
            done += n as u64;
        }
        Ok(len)
    }
}
