//! Tensors held resident: read once when a model first asks for them and kept as read (or
//! mapped, for the page-cache baseline), and the matrices and vectors handed out from them.

use std::ops::Range;
use std::sync::OnceLock;

use minirun_format::artifact::Member;
use minirun_kernels::{Activations, FloatType, Format, QMatrix};
use minirun_store::AlignedBuf;

use super::bands::join_bands;
use super::kernel_formats::float_type;
use super::part_layout::{MatrixPart, PartLayout, Piece, StackLayout};
use super::tensor_index::not_a_member;
use super::{Artifact, ArtifactError, Location, once, tensor_err};

/// A matrix, or a stack of equally shaped matrices (experts, attention heads), as stored.
#[derive(Debug, Clone)]
pub struct Stack<'a> {
    pub format: Format,
    pub rows: usize,
    pub cols: usize,
    matrices: Vec<QMatrix<'a>>,
}

impl<'a> Stack<'a> {
    pub(crate) fn new(
        format: Format,
        rows: usize,
        cols: usize,
        matrices: Vec<QMatrix<'a>>,
    ) -> Stack<'a> {
        Stack {
            format,
            rows,
            cols,
            matrices,
        }
    }

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

/// A container file's bytes for resident matrices: read into memory, or mapped by a baseline
/// that lets the kernel's page cache decide what stays in memory.
pub(super) enum HeldFile {
    Read(AlignedBuf),
    #[cfg(feature = "mapped-baseline")]
    Mapped(super::mapped_baseline::MappedFile),
}

impl HeldFile {
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            HeldFile::Read(buf) => buf.as_slice(),
            #[cfg(feature = "mapped-baseline")]
            HeldFile::Mapped(map) => (**map).as_ref(),
        }
    }
}

impl Artifact {
    /// Container file `file`, whole, for resident matrices: read, or mapped.
    pub(super) fn held_file(&self, file: usize) -> Result<HeldFile, ArtifactError> {
        #[cfg(feature = "mapped-baseline")]
        if let Some(map) = self.mapped_file(file)? {
            return Ok(HeldFile::Mapped(map));
        }
        let bytes = self.payload[file].bytes;
        Ok(HeldFile::Read(self.read_aligned(file, 0, bytes)?))
    }

    /// Bytes of payload held resident (read by the model, and kept as read or converted; mapped
    /// files do not count).
    pub fn payload_bytes(&self) -> u64 {
        let files: u64 = self
            .payload
            .iter()
            .filter_map(|p| match p.resident.get() {
                Some(HeldFile::Read(buf)) => Some(buf.len() as u64),
                _ => None,
            })
            .sum();
        let members: u64 = self
            .tensors
            .values()
            .filter_map(|l| match l {
                Location::Member { resident, .. } => resident.get().map(AlignedBuf::len),
                Location::Banded { resident, .. } => resident.get().map(AlignedBuf::len),
                Location::Tiled { .. } => None,
            })
            .map(|len| len as u64)
            .sum();
        files
            + members
            + self
                .held_converted
                .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A float tensor (norm weights, biases) as f32, checked against `len` elements before it
    /// is read.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ArtifactError> {
        let dtype = self.check_vector(name, len)?;
        // Held as read: a streamed layer is built again every step, its norms from these bytes.
        let (bytes, _) = self.member(name)?;
        if Some(bytes.len()) != len.checked_mul(dtype.size()) {
            return Err(tensor_err(
                name,
                format!("read {} bytes; the config needs {len} floats", bytes.len()),
            ));
        }
        Ok((0..len).map(|i| dtype.read(bytes, i)).collect())
    }

    /// `f` of a member's bytes, for a tensor the model asks for once and holds converted (a
    /// routing table): the bytes a matrix already holds, else read for `f` alone and dropped
    /// after it, so that the run does not hold the tensor twice. What is read so counts as held
    /// ([`Artifact::payload_bytes`]): the model holds it, converted.
    pub(super) fn with_member<T>(
        &self,
        name: &str,
        f: impl FnOnce(&[u8], &Member) -> Result<T, ArtifactError>,
    ) -> Result<T, ArtifactError> {
        if let Some(Location::Member {
            file,
            member,
            resident,
        }) = self.tensors.get(name)
            && resident.get().is_none()
        {
            let read = self.read_aligned(*file, member.offset, member.source.bytes)?;
            self.held_converted
                .fetch_add(member.source.bytes, std::sync::atomic::Ordering::Relaxed);
            return f(read.as_slice(), member);
        }
        let (bytes, member) = self.member(name)?;
        f(bytes, member)
    }

    /// Checks, without reading it, that `name` is a plain float tensor of `len` elements;
    /// returns its element type.
    pub fn check_vector(&self, name: &str, len: usize) -> Result<FloatType, ArtifactError> {
        let member = self.plain_member(name)?;
        let dtype = float_type(&member.source.dtype).ok_or_else(|| {
            tensor_err(
                name,
                format!("is {}, not a float tensor", member.source.dtype),
            )
        })?;
        check_plain_len(name, member, (len, dtype.size()), "floats")?;
        Ok(dtype)
    }

    /// A plain integer tensor of `len` elements (I64 or I32, little-endian), widened to i64:
    /// DeepSeek V4's `tid2eid` tables.
    pub fn integers(&self, name: &str, len: usize) -> Result<Vec<i64>, ArtifactError> {
        let width = self.check_integers(name, len)?;
        self.with_member(name, |bytes, _| {
            if bytes.len() != len * width {
                return Err(tensor_err(
                    name,
                    format!(
                        "holds {} bytes; the config needs {len} integers",
                        bytes.len()
                    ),
                ));
            }
            Ok(bytes
                .chunks_exact(width)
                .map(|b| match b.try_into() {
                    Ok(eight) => i64::from_le_bytes(eight),
                    Err(_) => i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                })
                .collect())
        })
    }

    /// Checks, from the metadata alone, that `name` is a plain integer tensor of `len`
    /// elements; its width in bytes.
    pub fn check_integers(&self, name: &str, len: usize) -> Result<usize, ArtifactError> {
        let member = self.plain_member(name)?;
        let width = match member.source.dtype.as_str() {
            "I64" => 8,
            "I32" => 4,
            other => {
                return Err(tensor_err(
                    name,
                    format!("is {other}, not an integer tensor"),
                ));
            }
        };
        check_plain_len(name, member, (len, width), "integers")?;
        Ok(width)
    }

    /// The blob member that stores `name` whole.
    fn plain_member(&self, name: &str) -> Result<&Member, ArtifactError> {
        match self.tensors.get(name) {
            Some(Location::Member { member, .. })
            | Some(Location::Banded {
                member: Some(member),
                ..
            }) => Ok(member),
            other => Err(not_a_member(name, other)),
        }
    }

    /// A blob member's bytes (read once, then resident).
    pub(super) fn member(&self, name: &str) -> Result<(&[u8], &Member), ArtifactError> {
        match self.tensors.get(name) {
            Some(Location::Member {
                file,
                member,
                resident,
            }) => {
                let bytes = once(resident, || {
                    self.read_aligned(*file, member.offset, member.source.bytes)
                })?;
                Ok((bytes.as_slice(), member))
            }
            Some(Location::Banded {
                member: Some(member),
                part,
                resident,
                ..
            }) => Ok((self.joined_bands(part, resident)?, member)),
            other => Err(not_a_member(name, other)),
        }
    }

    /// A banded part's bytes joined (packed, then scales), read once and held.
    pub(super) fn joined_bands<'s>(
        &'s self,
        part: &PartLayout,
        resident: &'s OnceLock<AlignedBuf>,
    ) -> Result<&'s [u8], ArtifactError> {
        let joined = once(resident, || {
            let PartLayout::Bands { file, range, .. } = part else {
                return Err(tensor_err("bands", "are not a banded part".into()));
            };
            let read = self.read_aligned(*file, range.start, range.end - range.start)?;
            Ok(join_bands(part, read, AlignedBuf::new))
        })?;
        Ok(&joined.as_slice()[..part.joined_len()])
    }

    /// The matrix (or stack) of module `module`: `{module}.weight` with its scales and biases
    /// wherever they are stored, read now and held resident. Its shape must be `[.., rows,
    /// cols]` (`cols` in elements).
    pub fn matrix(
        &self,
        module: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Stack<'_>, ArtifactError> {
        let layout = self.stack_layout(module, rows, cols)?;
        let matrices = layout
            .parts
            .iter()
            .map(|part| self.resident_matrix(&layout, part))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Stack {
            format: layout.format,
            rows: layout.rows,
            cols: layout.cols,
            matrices,
        })
    }

    /// One matrix of a stack, read now and held resident as [`Artifact::matrix`] holds it.
    pub fn resident_part(&self, part: &MatrixPart) -> Result<QMatrix<'_>, ArtifactError> {
        let layout = StackLayout {
            name: part.tensor.to_string(),
            format: part.format,
            rows: part.rows,
            cols: part.cols,
            parts: Vec::new(),
        };
        self.resident_matrix(&layout, &part.part)
    }

    pub(super) fn resident_matrix(
        &self,
        layout: &StackLayout,
        part: &PartLayout,
    ) -> Result<QMatrix<'_>, ArtifactError> {
        let (packed, scales, biases) = match part {
            PartLayout::Tile {
                file,
                tile,
                packed,
                scales,
                biases,
                ..
            } => {
                let entry = &self.payload[*file];
                let bytes = once(&entry.resident, || self.held_file(*file))?.bytes();
                let at = |r: &Range<u64>| {
                    &bytes[(tile.start + r.start) as usize..(tile.start + r.end) as usize]
                };
                (at(packed), at(scales), biases.as_ref().map_or(&[][..], at))
            }
            PartLayout::Bands { .. } => {
                let Some(Location::Banded { resident, .. }) = self.tensors.get(&layout.name) else {
                    return Err(tensor_err(&layout.name, "is not a banded tensor".into()));
                };
                let bytes = self.joined_bands(part, resident)?;
                let p = part.joined_packed_len();
                (&bytes[..p], &bytes[p..], &[][..])
            }
            PartLayout::Pieces {
                packed,
                scales,
                biases,
            } => {
                let piece = |p: &Piece| -> Result<&[u8], ArtifactError> {
                    let (bytes, _) = self.member(&p.tensor)?;
                    Ok(&bytes[p.start as usize..(p.start + p.len) as usize])
                };
                let optional = |p: &Option<Piece>| p.as_ref().map_or(Ok(&[][..]), piece);
                (piece(packed)?, optional(scales)?, optional(biases)?)
            }
        };
        QMatrix::new(
            layout.format,
            layout.rows,
            layout.cols,
            packed,
            scales,
            biases,
        )
        .map(|m| m.with_activations(self.activations))
        .map_err(|e| tensor_err(&layout.name, e.to_string()))
    }

    /// The stack `layout` describes over `zeros` instead of its stored bytes: what a dry build
    /// of a layer hands the model, so that its builder runs (and says what it asks for) without
    /// a payload byte read. `zeros` must hold the longest of each part's byte lengths.
    pub fn unread_stack<'z>(
        &self,
        layout: &StackLayout,
        zeros: &'z [u8],
    ) -> Result<Stack<'z>, ArtifactError> {
        let matrices = layout
            .parts
            .iter()
            .map(|part| {
                let [packed, scales, biases] = part.byte_lengths();
                let slice = |n: usize| {
                    zeros
                        .get(..n)
                        .ok_or_else(|| tensor_err(&layout.name, format!("needs {n} zero bytes")))
                };
                QMatrix::new(
                    layout.format,
                    layout.rows,
                    layout.cols,
                    slice(packed)?,
                    slice(scales)?,
                    slice(biases)?,
                )
                .map(|m| m.with_activations(self.activations))
                .map_err(|e| tensor_err(&layout.name, e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Stack::new(
            layout.format,
            layout.rows,
            layout.cols,
            matrices,
        ))
    }

    /// The arithmetic of the matrices this artifact hands out from now on (set it before a
    /// model is loaded: a model keeps the matrices it loaded).
    pub fn set_activations(&mut self, activations: Activations) {
        self.activations = activations;
    }

    pub fn activations(&self) -> Activations {
        self.activations
    }
}

/// That `member` holds `len` unquantized elements of `width` bytes, by its shape and its bytes.
fn check_plain_len(
    name: &str,
    member: &Member,
    (len, width): (usize, usize),
    what: &str,
) -> Result<(), ArtifactError> {
    let shape_len = member
        .source
        .shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d));
    let bytes = len.checked_mul(width).map(|b| b as u64);
    if shape_len != Some(len) || bytes != Some(member.source.bytes) || member.quantization.is_some()
    {
        return Err(tensor_err(
            name,
            format!(
                "has shape {:?} in {} bytes; the config needs {len} {what}",
                member.source.shape, member.source.bytes
            ),
        ));
    }
    Ok(())
}
