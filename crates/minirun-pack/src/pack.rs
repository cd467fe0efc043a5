//! Writing an artifact: units of tile containers and plain-stream blobs, a manifest per
//! unit, the upstream's root files copied verbatim, and `index.json` last.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use minirun_format::artifact::index_writer::{
    PackIndex, Provenance, RootFileIdentity, UnitTotals, is_pack_index,
};
use minirun_format::artifact::{
    FileEntry, INCOMPLETE_MARKER, INDEX_FILE, MANIFEST_FILE, Member, QuantRole, Quantization,
    SourceRef, UnitManifest, unit_of,
};
use minirun_format::identity::{
    is_canonical_repo_id, is_canonical_root_file_name, is_pinned_revision,
};
use minirun_format::tile::{ContainerWriter, ContentKind, Geometry, QuantMode, hex};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::PackError;
use crate::checkpoint::Checkpoint;
use crate::recognize::{Item, QuantMatrix, recognize};
use crate::shard::{TensorSource, read_slice_into};

/// Bytes copied per read when streaming a plain tensor.
const COPY_CHUNK: u64 = 8 << 20;

/// Who published the upstream checkpoint, when the caller knows.
#[derive(Debug, Clone, Default)]
pub struct PackOptions {
    pub source_repo: Option<String>,
    pub source_revision: Option<String>,
}

/// What a pack wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PackSummary {
    pub units: Vec<UnitSummary>,
    pub payload_files: usize,
    pub payload_bytes: u64,
    pub tile_containers: usize,
    pub quantized_as_plain: usize,
    pub copied_files: Vec<String>,
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct UnitSummary {
    pub unit: String,
    pub files: usize,
    pub bytes: u64,
}

/// Repacks the checkpoint at `source` into the artifact directory `out`. `progress` is
/// called with the number of payload bytes written since the last call.
pub fn pack(
    source: &Path,
    out: &Path,
    opts: &PackOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<PackSummary, PackError> {
    check_provenance(opts)?;
    let ckpt = Checkpoint::open(source)?;
    let items = recognize(&ckpt)?;
    let mut summary = PackSummary {
        units: Vec::new(),
        payload_files: 0,
        payload_bytes: 0,
        tile_containers: 0,
        quantized_as_plain: 0,
        copied_files: Vec::new(),
        warnings: Vec::new(),
    };
    let mut units: BTreeMap<String, Vec<Item>> = BTreeMap::new();
    for item in items {
        units.entry(unit_of(item.name())).or_default().push(item);
    }
    let plans: Vec<UnitPlan> = units
        .iter()
        .map(|(unit, items)| plan_unit(out, unit, items, &mut summary))
        .collect::<Result<_, _>>()?;
    // Every refusal happens above: only now is the output directory touched.
    prepare_output(out, &ckpt.other_files)?;
    for plan in &plans {
        std::fs::create_dir_all(&plan.dir).map_err(|e| PackError::io(&plan.dir, e))?;
    }
    // Every payload file is independent: write (and hash) them all on every core, then
    // gather them back per unit in a fixed order, so the output stays deterministic.
    let jobs: Vec<(usize, Option<&QuantMatrix>)> = plans
        .iter()
        .enumerate()
        .flat_map(|(u, plan)| {
            let containers = plan.containers.iter().map(move |q| (u, Some(*q)));
            let blob = (!plan.plain.is_empty()).then_some((u, None));
            containers.chain(blob)
        })
        .collect();
    let written: Vec<(usize, FileEntry)> = jobs
        .par_iter()
        .map(|&(u, job)| {
            let plan = &plans[u];
            let entry = match job {
                Some(q) => write_container(&ckpt, &plan.dir, q, progress),
                None => write_blob(
                    &ckpt,
                    &plan.dir,
                    &format!("{}-plain.blob", plan.unit),
                    &plan.plain,
                    progress,
                ),
            };
            entry.map(|e| (u, e))
        })
        .collect::<Result<_, _>>()?;
    // Every payload file durable before any manifest names it.
    atomic_file::sync_filesystem(out).map_err(|e| PackError::io(out, e.source))?;
    for (u, plan) in plans.iter().enumerate() {
        let files: Vec<FileEntry> = written
            .iter()
            .filter(|(w, _)| *w == u)
            .map(|(_, e)| e.clone())
            .collect();
        let manifest = write_manifest(plan, files, opts)?;
        let bytes = manifest.files.iter().map(FileEntry::bytes).sum();
        summary.payload_files += manifest.files.len();
        summary.payload_bytes += bytes;
        summary.units.push(UnitSummary {
            unit: plan.unit.clone(),
            files: manifest.files.len(),
            bytes,
        });
    }
    for name in &ckpt.other_files {
        copy_verbatim(&ckpt.dir.join(name), &out.join(name))?;
        summary.copied_files.push(name.clone());
    }
    let mut warnings = Vec::new();
    let index = pack_index(&ckpt, out, opts, &summary, &mut warnings)?;
    summary.warnings.extend(warnings);
    let index_path = out.join(INDEX_FILE);
    atomic_file::write_bytes(&index_path, &index.to_bytes())
        .map_err(|e| PackError::io(&index_path, e.source))?;
    std::fs::remove_file(out.join(INCOMPLETE_MARKER)).map_err(|e| PackError::io(out, e))?;
    atomic_file::sync_dir(out).map_err(|e| PackError::io(out, e.source))?;
    if opts.source_repo.is_none() {
        summary.warnings.push(
            "no --source-repo/--source-revision: index.json names no upstream, so the artifact's identity is unknown \
             and it carries no tokenizer or configuration identity"
                .to_string(),
        );
    }
    Ok(summary)
}

fn refused(what: impl Into<String>, reason: impl Into<String>) -> PackError {
    PackError::Refused {
        what: what.into(),
        reason: reason.into(),
    }
}

pub(crate) fn check_provenance(opts: &PackOptions) -> Result<(), PackError> {
    match (&opts.source_repo, &opts.source_revision) {
        (None, None) => Ok(()),
        (Some(repo), Some(rev)) => {
            if !is_canonical_repo_id(repo) {
                return Err(refused(
                    "--source-repo",
                    format!("{repo:?} is not a canonical Hugging Face repo id (owner/name)"),
                ));
            }
            if !is_pinned_revision(rev) {
                return Err(refused(
                    "--source-revision",
                    format!("{rev:?} is not a pinned commit (40 lowercase hex characters)"),
                ));
            }
            Ok(())
        }
        _ => Err(refused(
            "--source-repo/--source-revision",
            "give both or neither: a repository without a pinned revision is no identity",
        )),
    }
}

/// `out` must be absent, empty, or a previous pack's output (complete or interrupted), which
/// is cleared first so that no file of an earlier pack survives into this one. Only what a pack
/// writes is removed: a root file this pack does not write again (`copies`, the source's root
/// files, and `index.json`) or, in a finished pack, a directory that is not a unit (it has no
/// `manifest.json`) is someone's own, and the pack is refused naming it instead.
pub(crate) fn prepare_output(out: &Path, copies: &[String]) -> Result<(), PackError> {
    if out.exists() {
        let entries: Vec<PathBuf> = std::fs::read_dir(out)
            .map_err(|e| PackError::io(out, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        if !entries.is_empty() && !is_previous_pack(out) {
            return Err(refused(
                out.display().to_string(),
                "the output directory holds files that no pack wrote; choose a new or empty directory",
            ));
        }
        let foreign = not_written_by_a_pack(out, &entries, copies);
        if !foreign.is_empty() {
            return Err(refused(
                out.display().to_string(),
                format!(
                    "it is an earlier pack's output, but it also holds {} that this pack would not write again (yours, or copied from another source); move {} away, or choose a new or empty directory",
                    foreign.join(", "),
                    if foreign.len() == 1 { "it" } else { "them" }
                ),
            ));
        }
        // The marker goes first: a directory with the marker is unfinished.
        File::create(out.join(INCOMPLETE_MARKER)).map_err(|e| PackError::io(out, e))?;
        atomic_file::sync_dir(out).map_err(|e| PackError::io(out, e.source))?;
        for path in entries.iter().filter(|p| !p.ends_with(INCOMPLETE_MARKER)) {
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(path)
            } else {
                std::fs::remove_file(path)
            };
            removed.map_err(|e| PackError::io(path, e))?;
        }
        return Ok(());
    }
    std::fs::create_dir_all(out).map_err(|e| PackError::io(out, e))?;
    File::create(out.join(INCOMPLETE_MARKER)).map_err(|e| PackError::io(out, e))?;
    atomic_file::sync_dir(out).map_err(|e| PackError::io(out, e.source))?;
    Ok(())
}

/// The names among an earlier pack's `entries` that no pack wrote, as far as can be told: a
/// root file that is neither `index.json`, the marker nor one of `copies`; a directory other
/// than `.minirun/` (evidence) without a `manifest.json`, unless the pack was interrupted
/// (its units get their manifests last).
fn not_written_by_a_pack(out: &Path, entries: &[PathBuf], copies: &[String]) -> Vec<String> {
    let interrupted = out.join(INCOMPLETE_MARKER).is_file();
    entries
        .iter()
        .filter_map(|path| {
            let name = path.file_name()?.to_string_lossy().into_owned();
            // An entry that cannot even be looked at is not known to be ours: kept, and named.
            let Ok(meta) = std::fs::symlink_metadata(path) else {
                return Some(name);
            };
            let ours = match meta.is_dir() {
                true => name == ".minirun" || interrupted || path.join("manifest.json").is_file(),
                false => {
                    meta.is_file()
                        && (name == INDEX_FILE
                            || name == INCOMPLETE_MARKER
                            || copies.contains(&name))
                }
            };
            (!ours).then(|| match meta.is_dir() {
                true => format!("{name}/"),
                false => name,
            })
        })
        .collect()
}

/// An interrupted pack left its marker; a finished one left an index.json of our shape.
fn is_previous_pack(out: &Path) -> bool {
    if out.join(INCOMPLETE_MARKER).is_file() {
        return true;
    }
    std::fs::read(out.join(INDEX_FILE)).is_ok_and(|bytes| is_pack_index(&bytes))
}

fn source_ref(t: &TensorSource) -> SourceRef {
    SourceRef {
        source_tensor: t.name.clone(),
        dtype: format!("{:?}", t.dtype),
        shape: t.shape.clone(),
        shard: t.shard.clone(),
        shard_offset: t.start,
        bytes: t.len,
    }
}

fn geometry_of(q: &QuantMatrix) -> Geometry {
    Geometry {
        mode: q.mode,
        rows: q.rows,
        cols: q.cols,
        group_size: q.group,
        bits: q.bits,
        scale_dtype: q.scale_dtype,
        scale_block_rows: q.block_rows,
        tile_count: q.experts.unwrap_or(1),
    }
}

fn extension(mode: QuantMode) -> &'static str {
    match mode {
        QuantMode::Mxfp4 => "mxfp4tile",
        QuantMode::Affine => "affinetile",
        QuantMode::Fp8E4m3Block => "fp8tile",
    }
}

/// What one unit will hold: its containers and its plain-stream members.
struct UnitPlan<'a> {
    unit: String,
    dir: PathBuf,
    containers: Vec<&'a QuantMatrix>,
    plain: Vec<(TensorSource, Option<Quantization>, Option<String>)>,
}

fn plan_unit<'a>(
    out: &Path,
    unit: &str,
    items: &'a [Item],
    summary: &mut PackSummary,
) -> Result<UnitPlan<'a>, PackError> {
    let dir = out.join(unit);
    let mut plan = UnitPlan {
        unit: unit.to_string(),
        dir,
        containers: Vec::new(),
        plain: Vec::new(),
    };
    for item in items {
        match item {
            Item::Plain(t) => plan.plain.push((t.clone(), None, None)),
            Item::Quantized(q) => match geometry_of(q).layout() {
                Ok(_) => {
                    let name = format!("{}.{}", q.module, extension(q.mode));
                    if !is_canonical_root_file_name(&name) {
                        return Err(refused(
                            &q.packed.name,
                            "this tensor name cannot be a file name in the artifact (only letters, digits, '.', '-', '_')",
                        ));
                    }
                    plan.containers.push(q);
                    summary.tile_containers += 1;
                }
                Err(why) => {
                    summary.quantized_as_plain += 1;
                    let roles = [
                        (QuantRole::Packed, Some(&q.packed)),
                        (QuantRole::Scales, Some(&q.scales)),
                        (QuantRole::Biases, q.biases.as_ref()),
                    ];
                    for (role, t) in roles {
                        if let Some(t) = t {
                            plan.plain.push((
                                t.clone(),
                                Some(quantization(q, role)),
                                Some(why.to_string()),
                            ));
                        }
                    }
                }
            },
        }
    }
    Ok(plan)
}

fn write_manifest(
    plan: &UnitPlan<'_>,
    files: Vec<FileEntry>,
    opts: &PackOptions,
) -> Result<UnitManifest, PackError> {
    let manifest = UnitManifest {
        unit: plan.unit.clone(),
        source_repo: opts.source_repo.clone(),
        source_revision: opts.source_revision.clone(),
        files,
    };
    let mut bytes =
        serde_json::to_vec_pretty(&manifest).map_err(|e| refused(MANIFEST_FILE, e.to_string()))?;
    bytes.push(b'\n');
    let path = plan.dir.join(MANIFEST_FILE);
    atomic_file::write_bytes(&path, &bytes).map_err(|e| PackError::io(&path, e.source))?;
    Ok(manifest)
}

fn quantization(q: &QuantMatrix, role: QuantRole) -> Quantization {
    Quantization {
        scheme: q.scheme.to_string(),
        layout: q.mode,
        element_bits: q.bits,
        group: q.group,
        block_rows: q.block_rows,
        scale_dtype: q.scale_dtype,
        role,
    }
}

fn write_container(
    ckpt: &Checkpoint,
    dir: &Path,
    q: &QuantMatrix,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<FileEntry, PackError> {
    let geometry = geometry_of(q);
    let name = format!("{}.{}", q.module, extension(q.mode));
    let count = u64::from(geometry.tile_count);
    let per = |t: &TensorSource| t.len / count;
    let mut sha = String::new();
    let mut bytes = 0;
    write_payload(&dir.join(&name), |file| {
        let hashing = HashingWriter::new(BufWriter::with_capacity(4 << 20, file));
        let mut writer =
            ContainerWriter::new(hashing, geometry, ContentKind::CheckpointDerived, 0, false)
                .map_err(|e| io::Error::other(e.to_string()))?;
        let (mut packed, mut scales, mut biases) = (Vec::new(), Vec::new(), Vec::new());
        for tile in 0..count {
            let read = |t: &TensorSource, buf: &mut Vec<u8>| {
                read_slice_into(&ckpt.dir, t, tile * per(t), per(t), buf)
                    .map_err(|e| io::Error::other(e.to_string()))
            };
            read(&q.packed, &mut packed)?;
            read(&q.scales, &mut scales)?;
            match &q.biases {
                Some(b) => read(b, &mut biases)?,
                None => biases.clear(),
            }
            writer
                .push_tile(&packed, &scales, &biases)
                .map_err(|e| io::Error::other(e.to_string()))?;
            progress((packed.len() + scales.len() + biases.len()) as u64);
        }
        let (hashing, container) = writer
            .finish()
            .map_err(|e| io::Error::other(e.to_string()))?;
        let (mut inner, digest, len) = hashing.finish();
        inner.flush()?;
        sha = digest;
        bytes = len;
        debug_assert_eq!(len, container.layout.total_bytes);
        Ok(())
    })?;
    Ok(FileEntry::TileContainer {
        name,
        bytes,
        sha256: sha,
        layout: q.mode,
        scheme: q.scheme.to_string(),
        rows: q.rows,
        cols: q.cols,
        count: geometry.tile_count,
        element_bits: q.bits,
        group: q.group,
        block_rows: q.block_rows,
        scale_dtype: q.scale_dtype,
        packed: source_ref(&q.packed),
        scales: source_ref(&q.scales),
        biases: q.biases.as_ref().map(source_ref),
    })
}

fn write_blob(
    ckpt: &Checkpoint,
    dir: &Path,
    name: &str,
    tensors: &[(TensorSource, Option<Quantization>, Option<String>)],
    progress: &(dyn Fn(u64) + Sync),
) -> Result<FileEntry, PackError> {
    let mut members = Vec::new();
    let mut sha = String::new();
    let mut bytes = 0;
    write_payload(&dir.join(name), |file| {
        let mut hashing = HashingWriter::new(BufWriter::with_capacity(4 << 20, file));
        for (t, quantization, not_tiled) in tensors {
            members.push(Member {
                source: source_ref(t),
                offset: hashing.position,
                quantization: quantization.clone(),
                not_tiled: not_tiled.clone(),
            });
            let mut done = 0;
            let mut chunk = Vec::new();
            while done < t.len {
                let n = (t.len - done).min(COPY_CHUNK);
                read_slice_into(&ckpt.dir, t, done, n, &mut chunk)
                    .map_err(|e| io::Error::other(e.to_string()))?;
                hashing.write_all(&chunk)?;
                progress(n);
                done += n;
            }
        }
        let (mut inner, digest, len) = hashing.finish();
        inner.flush()?;
        sha = digest;
        bytes = len;
        Ok(())
    })?;
    Ok(FileEntry::Blob {
        name: name.to_string(),
        bytes,
        sha256: sha,
        members,
    })
}

pub(crate) fn copy_verbatim(from: &Path, to: &Path) -> Result<(), PackError> {
    let mut src = regular_file::open(from).map_err(|e| PackError::io(from, e))?;
    write_atomic(to, |mut file| io::copy(&mut src, &mut file).map(|_| ()))
}

/// `index.json` in the single-source-units shape, with identities when provenance is known.
fn pack_index(
    ckpt: &Checkpoint,
    out: &Path,
    opts: &PackOptions,
    summary: &PackSummary,
    warnings: &mut Vec<String>,
) -> Result<PackIndex, PackError> {
    let units = summary
        .units
        .iter()
        .map(|u| UnitTotals {
            unit: u.unit.clone(),
            files: u.files,
            bytes: u.bytes,
        })
        .collect();
    let mut index = PackIndex {
        units,
        total_bytes: summary.payload_bytes,
        provenance: None,
    };
    let (Some(repo), Some(rev)) = (&opts.source_repo, &opts.source_revision) else {
        return Ok(index);
    };
    let identity = |file: &str| -> Result<RootFileIdentity, PackError> {
        let path = out.join(file);
        let data = std::fs::read(&path).map_err(|e| PackError::io(&path, e))?;
        Ok(RootFileIdentity {
            file: file.to_string(),
            bytes: data.len() as u64,
            sha256: hex(&Sha256::digest(&data)),
        })
    };
    let tokenizer = ["tokenizer.json", "tokenizer.model", "tiktoken.model"]
        .into_iter()
        .find(|f| ckpt.other_files.iter().any(|o| o == f));
    let license = ckpt.other_files.iter().find(|f| {
        let lower = f.to_ascii_lowercase();
        (lower.starts_with("license") || lower.starts_with("licence"))
            && is_canonical_root_file_name(f)
    });
    let tokenizer = match (tokenizer, license) {
        (Some(tokenizer), Some(license)) => Some((identity(tokenizer)?, license.clone())),
        _ => {
            warnings.push(
                "no tokenizer identity in index.json: it needs a tokenizer file (tokenizer.json, tokenizer.model or \
                 tiktoken.model) and a licence file (LICENSE*) at the checkpoint's root"
                    .to_string(),
            );
            None
        }
    };
    index.provenance = Some(Provenance {
        repo: repo.clone(),
        revision: rev.clone(),
        configuration: identity("config.json")?,
        tokenizer,
    });
    Ok(index)
}

/// Writes `path` atomically (temporary file, fsync, rename, directory fsync): a file that
/// exists is complete.
fn write_atomic(path: &Path, fill: impl FnOnce(&File) -> io::Result<()>) -> Result<(), PackError> {
    atomic_file::write_with(path, atomic_file::Options::default(), |file| {
        fill(file).map_err(|e| PackError::io(path, e))
    })
}

/// A payload file: renamed into place when whole, made durable by the one filesystem flush that
/// precedes the manifests (the output holds its incomplete marker until then).
fn write_payload(path: &Path, fill: impl FnOnce(&File) -> io::Result<()>) -> Result<(), PackError> {
    atomic_file::write_unsynced_with(path, atomic_file::Options::default(), |file| {
        fill(file).map_err(|e| PackError::io(path, e))
    })
}

/// A writer that hashes what passes through, for a per-file SHA-256 without re-reading.
/// It supports only the position queries the container writer makes.
struct HashingWriter<W: Write> {
    inner: W,
    hasher: Sha256,
    position: u64,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            position: 0,
        }
    }

    fn finish(self) -> (W, String, u64) {
        (self.inner, hex(&self.hasher.finalize()), self.position)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.position += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Write> Seek for HashingWriter<W> {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        match pos {
            SeekFrom::Current(0) => Ok(self.position),
            _ => Err(io::Error::other("a hashing writer only moves forward")),
        }
    }
}
