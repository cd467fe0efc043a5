//! `minirun check`: compare every packed block, scale, bias and plain stream of an artifact
//! with the source checkpoint's bytes. A byte comparison, not a tolerance.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use minirun_format::tile::{HEADER_BYTES, Layout, TileContainer};
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
        let start = c
            .tile_range(tile)
            .map_err(|e| self.differs(Some(tile), "header", tensor, 0, e.to_string()))?
            .start;
        for (offset, len) in padding_of(&c.layout) {
            let at = start + offset;
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
        let spans = Spans {
            ours_at: at,
            source_at: src_at,
            len,
        };
        match first_difference(ours, src, spans, CHUNK, self.progress) {
            Ok(None) => Ok(len),
            Ok(Some(d)) => Err(self.differs(
                tile,
                region,
                tensor,
                at + d.offset,
                format!(
                    "byte {} of the {region} is {:#04x} in the artifact and {:#04x} in the source",
                    d.offset, d.ours, d.source
                ),
            )),
            Err(Unreadable {
                offset,
                what,
                error,
            }) => Err(self.differs(
                tile,
                region,
                tensor,
                offset,
                format!("cannot read the {what}: {error}"),
            )),
        }
    }
}

/// The bytes of a tile that hold no data, as (offset from the tile's start, length): each
/// region's tail past its payload (empty where the payload fills the region).
fn padding_of(l: &Layout) -> [(u64, u64); 3] {
    [
        (l.packed_bytes, l.packed_region - l.packed_bytes),
        (
            l.scale_offset + l.scale_bytes,
            l.scale_region - l.scale_bytes,
        ),
        (l.bias_offset + l.bias_bytes, l.bias_region - l.bias_bytes),
    ]
}

/// Where two equal-length byte ranges lie: one in the artifact, one in the source.
#[derive(Debug, Clone, Copy)]
struct Spans {
    ours_at: u64,
    source_at: u64,
    len: u64,
}

/// The first byte at which the two ranges differ, counted from their starts.
#[derive(Debug, PartialEq, Eq)]
struct ByteDifference {
    offset: u64,
    ours: u8,
    source: u8,
}

/// A read that failed, at its offset in the file it was reading.
#[derive(Debug)]
struct Unreadable {
    offset: u64,
    what: &'static str,
    error: std::io::Error,
}

/// Compares the two ranges `chunk` bytes at a time, reporting each chunk to `progress`.
/// A zero `chunk` panics at once (`step_by`) rather than looping without reading.
fn first_difference(
    ours: &File,
    source: &File,
    spans: Spans,
    chunk: u64,
    progress: &dyn Fn(u64),
) -> Result<Option<ByteDifference>, Unreadable> {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for done in (0..spans.len).step_by(chunk as usize) {
        let n = (spans.len - done).min(chunk) as usize;
        a.resize(n, 0);
        b.resize(n, 0);
        let read = |f: &File, buf: &mut [u8], offset: u64, what: &'static str| {
            f.read_exact_at(buf, offset).map_err(|error| Unreadable {
                offset,
                what,
                error,
            })
        };
        read(ours, &mut a, spans.ours_at + done, "artifact")?;
        read(source, &mut b, spans.source_at + done, "source")?;
        if let Some(i) = a.iter().zip(&b).position(|(x, y)| x != y) {
            return Ok(Some(ByteDifference {
                offset: done + i as u64,
                ours: a[i],
                source: b[i],
            }));
        }
        progress(n as u64);
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn file_of(bytes: &[u8]) -> File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        f
    }

    /// Runs `first_difference` with a 4-byte chunk and returns its answer and the progress sum.
    fn differ(ours: &[u8], source: &[u8], spans: Spans) -> (Option<ByteDifference>, u64) {
        let reported = AtomicU64::new(0);
        let progress = |n: u64| {
            reported.fetch_add(n, Ordering::Relaxed);
        };
        let found = first_difference(&file_of(ours), &file_of(source), spans, 4, &progress)
            .unwrap_or_else(|e| panic!("read failed at {}: {}", e.offset, e.error));
        (found, reported.into_inner())
    }

    #[test]
    fn padding_is_each_regions_tail_past_its_payload() {
        let layout = Layout {
            packed_bytes: 10,
            scale_bytes: 3,
            bias_bytes: 5,
            packed_region: 16,
            scale_region: 16,
            bias_region: 16,
            scale_offset: 16,
            bias_offset: 32,
            tile_stride: 48,
            first_tile_offset: 64,
            total_bytes: 112,
        };
        assert_eq!(padding_of(&layout), [(10, 6), (19, 13), (37, 11)]);
    }

    const SOURCE: &[u8] = b"..0123456789abcdef";
    const OURS: &[u8] = b"0123456789abcdef";

    fn spans(len: u64) -> Spans {
        Spans {
            ours_at: 0,
            source_at: 2,
            len,
        }
    }

    #[test]
    fn equal_ranges_over_several_chunks_report_every_byte_once() {
        assert_eq!(differ(OURS, SOURCE, spans(16)), (None, 16));
        // A length that is not a multiple of the chunk: the last chunk is short, not past the end.
        assert_eq!(differ(&OURS[..10], SOURCE, spans(10)), (None, 10));
    }

    #[test]
    fn a_difference_in_a_later_chunk_is_found_at_its_offset_from_the_start() {
        for at in [0usize, 3, 4, 9, 15] {
            let mut ours = OURS.to_vec();
            ours[at] = b'#';
            let (found, reported) = differ(&ours, SOURCE, spans(16));
            assert_eq!(
                found,
                Some(ByteDifference {
                    offset: at as u64,
                    ours: b'#',
                    source: SOURCE[at + 2],
                }),
                "difference at {at}"
            );
            assert_eq!(
                reported,
                (at as u64 / 4) * 4,
                "chunks before the difference"
            );
        }
    }

    #[test]
    fn ranges_start_where_their_spans_say() {
        let ours = b"xyz0123456789abcdef";
        let found = differ(
            ours,
            SOURCE,
            Spans {
                ours_at: 3,
                source_at: 2,
                len: 16,
            },
        );
        assert_eq!(found, (None, 16));
    }

    #[test]
    fn a_range_past_the_end_of_a_file_is_unreadable_at_its_offset() {
        let err =
            first_difference(&file_of(OURS), &file_of(SOURCE), spans(17), 4, &|_| {}).unwrap_err();
        assert_eq!((err.offset, err.what), (16, "artifact"));
    }
}
