//! Opening a packed artifact for running: its unit manifests, config.json and tokenizer, and
//! every payload file read whole into memory (the resident store). Payload files are opened
//! only through held verification evidence (rooted, no-follow, identity rechecked) unless the
//! caller asked for an unverified run. Every tile container's header is re-parsed against its
//! file length and compared with the manifest before a byte of it is used.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use minirun_format::artifact::{FileEntry, Member, Quantization};
use minirun_format::tile::{HEADER_BYTES, QuantMode, ScaleDtype, TileContainer};
use minirun_store::{ArtifactFiles, HeldEvidence, LayoutError, read_bounded};

use crate::kernels::{BlockScale, FloatType, Format, QMatrix};

#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error(transparent)]
    Evidence(#[from] minirun_store::StoreError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(
        "{0} is not a complete artifact ({1}): pack it again with `minirun pack`, or download it with `minirun download`"
    )]
    Incomplete(String, &'static str),
    #[error("{path}: {reason}")]
    Invalid { path: String, reason: String },
    #[error("the artifact has no tensor {0} (the model's config.json needs it)")]
    Missing(String),
    #[error("{name}: {reason}")]
    Tensor { name: String, reason: String },
    #[error(
        "{path} holds {bytes} bytes of weights and a resident run may use {limit}: it cannot be held in memory (streaming under a memory budget is not built yet)"
    )]
    TooLarge {
        path: String,
        bytes: u64,
        limit: u64,
    },
}

/// Where the bytes come from, and what vouches for them.
pub enum Access {
    /// Every payload file through held evidence.
    Verified(Box<HeldEvidence>),
    /// Plain reads; the caller said so (`--unverified`).
    Unverified,
}

/// Where one tensor's bytes are: a whole blob member, or the packed tensor of a tile container
/// (one tile per leading-dimension slice).
#[derive(Debug, Clone)]
enum Location {
    Member {
        file: usize,
        member: Box<Member>,
    },
    Tiled {
        file: usize,
        container: Box<TileContainer>,
    },
}

/// A resident artifact: every payload file's bytes, and an index from source tensor names to them.
pub struct Artifact {
    pub root: PathBuf,
    pub config_json: String,
    pub tokenizer_json: Option<String>,
    pub tokenizer_config_json: Option<String>,
    /// What vouched for the bytes, in words for the run's header.
    pub provenance: String,
    /// Metadata files a verified run read outside the evidence (offline evidence covers
    /// payload only): the run's header names them.
    pub outside_evidence: Vec<String>,
    files: Vec<Vec<u8>>,
    tensors: BTreeMap<String, Location>,
}

/// A matrix, or a stack of equally shaped matrices (experts, attention heads), as stored.
#[derive(Debug, Clone)]
pub struct Stack<'a> {
    pub format: Format,
    pub rows: usize,
    pub cols: usize,
    matrices: Vec<QMatrix<'a>>,
}

impl<'a> Stack<'a> {
    pub fn len(&self) -> usize {
        self.matrices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.matrices.is_empty()
    }

    /// Matrix `i` of the stack.
    pub fn get(&self, i: usize) -> Option<QMatrix<'a>> {
        self.matrices.get(i).copied()
    }

    /// The only matrix of a stack of one.
    pub fn single(&self, name: &str) -> Result<QMatrix<'a>, ArtifactError> {
        match (self.matrices.len(), self.get(0)) {
            (1, Some(m)) => Ok(m),
            (n, _) => Err(ArtifactError::Tensor {
                name: name.to_string(),
                reason: format!("is a stack of {n} matrices where the model needs one"),
            }),
        }
    }
}

fn invalid(path: &str, reason: impl Into<String>) -> ArtifactError {
    ArtifactError::Invalid {
        path: path.to_string(),
        reason: reason.into(),
    }
}

/// The largest metadata file read (config, tokenizer): far above any real one, and a bound on
/// what a hostile directory can make this process allocate.
const METADATA_LIMIT: u64 = 256 << 20;

impl Access {
    fn files(self, root: &Path) -> Result<ArtifactFiles, ArtifactError> {
        match self {
            Access::Verified(held) => Ok(ArtifactFiles::Verified(held)),
            Access::Unverified => Ok(ArtifactFiles::unverified(root)?),
        }
    }
}

/// A payload file, which must be exactly `expected` bytes long (checked before reading).
fn read_payload(
    files: &ArtifactFiles,
    path: &str,
    expected: u64,
) -> Result<Vec<u8>, ArtifactError> {
    let file = files.open_payload(path)?;
    let actual = file
        .metadata()
        .map_err(|error| ArtifactError::Io {
            path: path.to_string(),
            error,
        })?
        .len();
    if actual != expected {
        return Err(invalid(
            path,
            format!("has {actual} bytes, its manifest says {expected}"),
        ));
    }
    Ok(read_bounded(file, path, expected)?)
}

/// A root metadata file; named in `outside` when a verified run read it outside the evidence.
fn read_metadata(
    files: &ArtifactFiles,
    path: &str,
    outside: &mut Vec<String>,
) -> Result<Option<Vec<u8>>, ArtifactError> {
    let Some(read) = files.read_metadata(path, METADATA_LIMIT)? else {
        return Ok(None);
    };
    if !read.evidenced && files.held().is_some() {
        outside.push(path.to_string());
    }
    Ok(Some(read.bytes))
}

fn text(path: &str, bytes: Vec<u8>) -> Result<String, ArtifactError> {
    String::from_utf8(bytes).map_err(|_| invalid(path, "is not UTF-8"))
}

impl Artifact {
    /// Reads the artifact at `root` into memory, refusing one whose payload is larger than the
    /// memory the system reports available.
    pub fn open(root: &Path, access: Access) -> Result<Artifact, ArtifactError> {
        Artifact::open_within(root, access, None)
    }

    /// `open` with an explicit limit on the payload held (`None`: the available memory).
    pub fn open_within(
        root: &Path,
        access: Access,
        memory_limit: Option<u64>,
    ) -> Result<Artifact, ArtifactError> {
        let shown = root.display().to_string();
        let provenance = match &access {
            Access::Unverified => {
                "bytes not checked against any publication (--unverified)".to_string()
            }
            Access::Verified(held) => {
                let e = held.evidence();
                if e.repo.is_empty() {
                    "verified offline against the artifact's own manifests (which are not authenticated)".to_string()
                } else {
                    format!("verified ({}) against {}@{}", e.mode, e.repo, e.revision)
                }
            }
        };
        let files = access.files(root)?;
        files.check_complete()?;
        let mut outside = Vec::new();
        let config_json = read_metadata(&files, "config.json", &mut outside)?
            .ok_or_else(|| ArtifactError::Incomplete(shown.clone(), "it has no config.json"))?;
        let config_json = text("config.json", config_json)?;
        let tokenizer_json = read_metadata(&files, "tokenizer.json", &mut outside)?
            .map(|b| text("tokenizer.json", b))
            .transpose()?;
        let tokenizer_config_json = read_metadata(&files, "tokenizer_config.json", &mut outside)?
            .map(|b| text("tokenizer_config.json", b))
            .transpose()?;
        let mut artifact = Artifact {
            root: root.to_path_buf(),
            config_json,
            tokenizer_json,
            tokenizer_config_json,
            provenance,
            outside_evidence: Vec::new(),
            files: Vec::new(),
            tensors: BTreeMap::new(),
        };
        let manifests = files.unit_manifests(&mut outside)?;
        let total = manifests
            .iter()
            .flat_map(|m| m.files.iter().map(|f| f.bytes()))
            .fold(0u64, u64::saturating_add);
        let limit = memory_limit.or_else(available_memory);
        if let Some(limit) = limit
            && total > limit
        {
            return Err(ArtifactError::TooLarge {
                path: shown,
                bytes: total,
                limit,
            });
        }
        for manifest in &manifests {
            for entry in &manifest.files {
                artifact.add_file(&files, &manifest.unit, entry)?;
            }
        }
        artifact.outside_evidence = outside;
        if artifact.files.is_empty() {
            return Err(ArtifactError::Incomplete(shown, "it has no unit manifests"));
        }
        Ok(artifact)
    }

    fn add_file(
        &mut self,
        files: &ArtifactFiles,
        unit: &str,
        entry: &FileEntry,
    ) -> Result<(), ArtifactError> {
        let path = format!("{unit}/{}", entry.name());
        let bytes = read_payload(files, &path, entry.bytes())?;
        if bytes.len() as u64 != entry.bytes() {
            return Err(invalid(
                &path,
                format!(
                    "has {} bytes, its manifest says {}",
                    bytes.len(),
                    entry.bytes()
                ),
            ));
        }
        let file = self.files.len();
        match entry {
            FileEntry::Blob { members, .. } => {
                for member in members {
                    let end = member.offset.checked_add(member.source.bytes);
                    if end.is_none_or(|end| end > bytes.len() as u64) {
                        return Err(invalid(
                            &path,
                            format!("member {} lies past the end", member.source.source_tensor),
                        ));
                    }
                    let location = Location::Member {
                        file,
                        member: Box::new(member.clone()),
                    };
                    self.insert(&path, &member.source.source_tensor, location)?;
                }
            }
            FileEntry::TileContainer {
                packed,
                rows,
                cols,
                count,
                ..
            } => {
                let header = bytes
                    .get(..HEADER_BYTES as usize)
                    .ok_or_else(|| invalid(&path, "is shorter than a header"))?;
                let container = TileContainer::parse(header, bytes.len() as u64)
                    .map_err(|e| invalid(&path, e.to_string()))?;
                let g = &container.geometry;
                if (g.rows, g.cols, g.tile_count) != (*rows, *cols, *count) {
                    return Err(invalid(
                        &path,
                        format!(
                            "its header holds {} tiles of {} x {}, its manifest says {count} of {rows} x {cols}",
                            g.tile_count, g.rows, g.cols
                        ),
                    ));
                }
                let location = Location::Tiled {
                    file,
                    container: Box::new(container),
                };
                self.insert(&path, &packed.source_tensor, location)?;
            }
        }
        self.files.push(bytes);
        Ok(())
    }

    fn insert(&mut self, path: &str, name: &str, location: Location) -> Result<(), ArtifactError> {
        if self.tensors.insert(name.to_string(), location).is_some() {
            return Err(invalid(path, format!("holds {name} a second time")));
        }
        Ok(())
    }

    /// Bytes of payload held resident.
    pub fn payload_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.len() as u64).sum()
    }

    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// A float tensor (norm weights, biases) as f32, checked against `len` elements.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ArtifactError> {
        let (bytes, member) = self.member(name)?;
        let dtype = float_type(&member.source.dtype).ok_or_else(|| {
            tensor_err(
                name,
                format!("is {}, not a float tensor", member.source.dtype),
            )
        })?;
        let shape_len = member
            .source
            .shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d));
        if shape_len != Some(len)
            || bytes.len() != len * dtype.size()
            || member.quantization.is_some()
        {
            return Err(tensor_err(
                name,
                format!(
                    "has shape {:?} in {} bytes; the config needs {len} floats",
                    member.source.shape,
                    bytes.len()
                ),
            ));
        }
        Ok((0..len).map(|i| dtype.read(bytes, i)).collect())
    }

    fn member(&self, name: &str) -> Result<(&[u8], &Member), ArtifactError> {
        match self.tensors.get(name) {
            Some(Location::Member { file, member }) => {
                let start = member.offset as usize;
                Ok((
                    &self.files[*file][start..start + member.source.bytes as usize],
                    member,
                ))
            }
            Some(Location::Tiled { .. }) => Err(tensor_err(
                name,
                "is a tile container where a plain tensor is expected".to_string(),
            )),
            None => Err(ArtifactError::Missing(name.to_string())),
        }
    }

    /// The matrix (or stack) of module `module`: `{module}.weight` with its scales and biases
    /// wherever they are stored. Its shape must be `[.., rows, cols]` (`cols` in elements).
    pub fn matrix(
        &self,
        module: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Stack<'_>, ArtifactError> {
        let name = format!("{module}.weight");
        let stack = match self.tensors.get(&name) {
            None => return Err(ArtifactError::Missing(name)),
            Some(Location::Tiled { file, container }) => self.tiled(&name, *file, container)?,
            Some(Location::Member { .. }) => self.plain_matrix(module, &name)?,
        };
        if (stack.rows, stack.cols) != (rows, cols) {
            return Err(tensor_err(
                &name,
                format!(
                    "is {} x {}; config.json implies {rows} x {cols}",
                    stack.rows, stack.cols
                ),
            ));
        }
        Ok(stack)
    }

    fn tiled(
        &self,
        name: &str,
        file: usize,
        c: &TileContainer,
    ) -> Result<Stack<'_>, ArtifactError> {
        let g = &c.geometry;
        let format = match (g.mode, g.scale_dtype) {
            (QuantMode::Affine, dtype) => Format::Affine {
                bits: g.bits,
                group: g.group_size as usize,
                scale: scale_float(dtype)
                    .ok_or_else(|| tensor_err(name, "affine with e8m0 scales".into()))?,
            },
            (QuantMode::Mxfp4, _) => Format::Mxfp4,
            (QuantMode::Fp8E4m3Block, dtype) => Format::Fp8Block {
                block_rows: g.scale_block_rows as usize,
                block_cols: g.group_size as usize,
                scale: match dtype {
                    ScaleDtype::E8m0 => BlockScale::E8m0,
                    other => BlockScale::Float(
                        scale_float(other).ok_or_else(|| tensor_err(name, "bad scale".into()))?,
                    ),
                },
            },
        };
        let bytes = &self.files[file];
        let slice = |r: std::ops::Range<u64>| &bytes[r.start as usize..r.end as usize];
        let mut parts = Vec::new();
        for i in 0..u64::from(g.tile_count) {
            let err = |e: minirun_format::tile::TileError| tensor_err(name, e.to_string());
            let packed = slice(c.packed_range(i).map_err(err)?);
            let scales = slice(c.scale_range(i).map_err(err)?);
            let biases = c.bias_range(i).map_err(err)?.map(slice).unwrap_or(&[]);
            parts.push((packed, scales, biases));
        }
        build_stack(name, format, g.rows as usize, g.cols as usize, parts)
    }

    fn plain_matrix(&self, module: &str, name: &str) -> Result<Stack<'_>, ArtifactError> {
        let (packed, member) = self.member(name)?;
        let shape = &member.source.shape;
        let Some(q) = &member.quantization else {
            let dtype = float_type(&member.source.dtype).ok_or_else(|| {
                tensor_err(
                    name,
                    format!("is {} and not recorded as quantized", member.source.dtype),
                )
            })?;
            let (count, rows, cols) = leading(name, shape)?;
            return build_stack(
                name,
                Format::Dense(dtype),
                rows,
                cols,
                split(name, packed, count, &[], &[])?,
            );
        };
        let format = quantized_format(name, q)?;
        let (scales_name, biases_name) = match q.layout {
            QuantMode::Fp8E4m3Block => (format!("{name}_scale_inv"), None),
            QuantMode::Affine => (format!("{module}.scales"), Some(format!("{module}.biases"))),
            QuantMode::Mxfp4 => (format!("{module}.scales"), None),
        };
        let (scales, scales_member) = self.member(&scales_name)?;
        let expected_scale_dtype = match q.scale_dtype {
            ScaleDtype::E8m0 => ["U8", "F8_E8M0"].as_slice(),
            ScaleDtype::F16 => ["F16"].as_slice(),
            ScaleDtype::Bf16 => ["BF16"].as_slice(),
            ScaleDtype::F32 => ["F32"].as_slice(),
        };
        if !expected_scale_dtype.contains(&scales_member.source.dtype.as_str()) {
            return Err(tensor_err(
                &scales_name,
                format!(
                    "is {}, but the manifest records {} scales",
                    scales_member.source.dtype, q.scale_dtype
                ),
            ));
        }
        let biases = match &biases_name {
            Some(b) => {
                let (bytes, bias) = self.member(b)?;
                if bias.source.dtype != scales_member.source.dtype {
                    return Err(tensor_err(
                        b,
                        format!(
                            "is {}, its scales {}",
                            bias.source.dtype, scales_member.source.dtype
                        ),
                    ));
                }
                bytes
            }
            None => &[],
        };
        if q.layout == QuantMode::Fp8E4m3Block && member.source.dtype != "F8_E4M3" {
            return Err(tensor_err(
                name,
                format!(
                    "is {}; only F8_E4M3 elements are implemented",
                    member.source.dtype
                ),
            ));
        }
        let (count, rows, stored_cols) = leading(name, shape)?;
        let cols = match format {
            Format::Affine { bits, .. } if member.source.dtype == "U32" => {
                stored_cols.saturating_mul(32) / bits as usize
            }
            Format::Mxfp4 if member.source.dtype == "U32" => stored_cols.saturating_mul(8),
            Format::Fp8Block { .. } => stored_cols,
            _ => {
                return Err(tensor_err(
                    name,
                    format!(
                        "{} stored as {} is not implemented",
                        q.layout, member.source.dtype
                    ),
                ));
            }
        };
        build_stack(
            name,
            format,
            rows,
            cols,
            split(name, packed, count, scales, biases)?,
        )
    }
}

/// The `count` equal slices of each tensor (experts, heads); refused when a length does not
/// divide evenly (a manifest that contradicts itself).
fn split<'a>(
    name: &str,
    packed: &'a [u8],
    count: usize,
    scales: &'a [u8],
    biases: &'a [u8],
) -> Result<Vec<Parts<'a>>, ArtifactError> {
    let even = |b: &[u8]| count > 0 && count <= packed.len() && b.len().is_multiple_of(count);
    if !(even(packed) && even(scales) && even(biases)) {
        return Err(tensor_err(
            name,
            format!(
                "does not split into {count} equal matrices ({} packed bytes)",
                packed.len()
            ),
        ));
    }
    let piece = |b: &'a [u8], i: usize| &b[b.len() / count * i..b.len() / count * (i + 1)];
    Ok((0..count)
        .map(|i| (piece(packed, i), piece(scales, i), piece(biases, i)))
        .collect())
}

/// A matrix's packed, scale and bias bytes.
type Parts<'a> = (&'a [u8], &'a [u8], &'a [u8]);

fn build_stack<'a>(
    name: &str,
    format: Format,
    rows: usize,
    cols: usize,
    parts: Vec<Parts<'a>>,
) -> Result<Stack<'a>, ArtifactError> {
    let matrices = parts
        .into_iter()
        .map(|(packed, scales, biases)| QMatrix::new(format, rows, cols, packed, scales, biases))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tensor_err(name, e.to_string()))?;
    Ok(Stack {
        format,
        rows,
        cols,
        matrices,
    })
}

/// `[count.., rows, cols]` with the leading dimensions multiplied; rank 2 gives a count of 1.
fn leading(name: &str, shape: &[usize]) -> Result<(usize, usize, usize), ArtifactError> {
    match shape {
        [rows, cols] => Ok((1, *rows, *cols)),
        [count, rows, cols] if *count > 0 => Ok((*count, *rows, *cols)),
        _ => Err(tensor_err(
            name,
            format!("has shape {shape:?}, not a matrix or a stack of matrices"),
        )),
    }
}

fn quantized_format(name: &str, q: &Quantization) -> Result<Format, ArtifactError> {
    let scale = scale_float(q.scale_dtype);
    let parameters_ok = match q.layout {
        QuantMode::Affine => matches!(q.element_bits, 4 | 8) && matches!(q.group, 32 | 64 | 128),
        QuantMode::Mxfp4 => q.element_bits == 4,
        QuantMode::Fp8E4m3Block => {
            q.element_bits == 8 && q.block_rows > 0 && q.group > 0 && q.group.is_multiple_of(8)
        }
    };
    if !parameters_ok {
        return Err(tensor_err(
            name,
            format!(
                "{} with {} bits, group {} and block rows {} is not implemented",
                q.layout, q.element_bits, q.group, q.block_rows
            ),
        ));
    }
    match (q.layout, scale) {
        (QuantMode::Affine, Some(scale)) => Ok(Format::Affine {
            bits: q.element_bits,
            group: q.group as usize,
            scale,
        }),
        (QuantMode::Mxfp4, None) if q.group == 32 => Ok(Format::Mxfp4),
        (QuantMode::Fp8E4m3Block, scale) => Ok(Format::Fp8Block {
            block_rows: q.block_rows as usize,
            block_cols: q.group as usize,
            scale: scale.map_or(BlockScale::E8m0, BlockScale::Float),
        }),
        (layout, _) => Err(tensor_err(
            name,
            format!("{layout} with {} scales is not implemented", q.scale_dtype),
        )),
    }
}

fn float_type(dtype: &str) -> Option<FloatType> {
    match dtype {
        "F32" => Some(FloatType::F32),
        "F16" => Some(FloatType::F16),
        "BF16" => Some(FloatType::BF16),
        _ => None,
    }
}

fn scale_float(dtype: ScaleDtype) -> Option<FloatType> {
    match dtype {
        ScaleDtype::F16 => Some(FloatType::F16),
        ScaleDtype::Bf16 => Some(FloatType::BF16),
        ScaleDtype::F32 => Some(FloatType::F32),
        ScaleDtype::E8m0 => None,
    }
}

fn tensor_err(name: &str, reason: String) -> ArtifactError {
    ArtifactError::Tensor {
        name: name.to_string(),
        reason,
    }
}

/// `MemAvailable` from /proc/meminfo, in bytes; `None` where the system does not say.
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
