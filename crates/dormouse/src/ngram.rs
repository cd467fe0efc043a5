//! The host-RAM Engram memory of an `--engram-ram` run, and its sidecar file `<name>.ngram`.
//!
//! With `engram_ram` the memory rows do not live in the model (whose tables the config seam
//! squeezes to one row per order) but here: `engram_slots` rows per order in an anonymous
//! memory map, gathered per batch on the host and updated sparsely (only the rows a batch
//! read) by a lazy Adam of their own. Untouched pages of the moments cost no memory.
//!
//! ```text
//! [0..8)    magic "DMNGRAM\0" (dmexp::identify::ENGRAM_SIDECAR_MAGIC)
//! [8..12)   version u32 (1)            [12..16)  dim u32 (engram_dim)
//! [16..24)  slots u64 (rows per order) [24..32)  step u64 (training steps applied)
//! [32..36)  order count K u32 (1..=8)  [36..68)  orders, 8 x u32 (unused ones 0)
//! [68..72)  CRC-32 of the payload      [72..76)  CRC-32 of bytes [0..72)
//! [76..80)  reserved, 0
//! [80..)    payload: table, first moment, second moment; each K x slots x dim f32 LE,
//!           order-major (order, slot, component)
//! ```
//!
//! Specified in `docs/formats/checkpoint.md`, with the save order that keeps a `.bin` from
//! ever being paired with a sidecar of another step.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use memmap2::MmapMut;
use rayon::prelude::*;

use crate::engram;
use crate::train::stream;

/// The eight bytes a sidecar starts with.
pub const MAGIC: &[u8; 8] = dmexp::identify::ENGRAM_SIDECAR_MAGIC;
/// The sidecar version this build reads and writes.
pub const VERSION: u32 = 1;
/// At most this many orders fit the header.
pub const MAX_ORDERS: usize = 8;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 80;

const INIT_STD: f64 = 0.02;
const INIT_STREAM: u64 = 3;
const INIT_CHUNK_ROWS: usize = 4096;
const BETA1: f64 = 0.9;
const BETA2: f64 = 0.95;
const EPS: f64 = 1e-8;

const _: () = assert!(
    cfg!(target_endian = "little"),
    "the sidecar payload is written as the in-memory f32s, which must be little-endian"
);

/// Why a sidecar could not be made, written or read.
#[derive(Debug, thiserror::Error)]
pub enum NgramError {
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: {advice}", path.display())]
    NotASidecar { path: PathBuf, advice: String },
    #[error("{}: Engram sidecar version {found}; this build reads version {VERSION}", path.display())]
    UnknownVersion { path: PathBuf, found: u32 },
    #[error("{}: damaged sidecar header: {reason}", path.display())]
    BadHeader { path: PathBuf, reason: String },
    #[error(
        "{}: the sidecar has {field} {found}, the run's config {expected}; it belongs to another run",
        path.display()
    )]
    Shape {
        path: PathBuf,
        field: &'static str,
        found: String,
        expected: String,
    },
    #[error(
        "{}: the sidecar holds step {found}, the checkpoint step {expected}; they are not one run state",
        path.display()
    )]
    WrongStep {
        path: PathBuf,
        found: u64,
        expected: u64,
    },
    #[error("{}: the sidecar payload fails its CRC (the file is damaged)", path.display())]
    Checksum { path: PathBuf },
    #[error(
        "a host-RAM table of {orders} orders x {slots} slots x {dim} needs {bytes} bytes with its moments, which cannot be mapped: {reason}"
    )]
    TooLarge {
        orders: usize,
        slots: usize,
        dim: usize,
        bytes: String,
        reason: String,
    },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> NgramError + '_ {
    move |error| NgramError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// What a checkpoint records of the sidecar saved with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SidecarStamp {
    /// Training steps applied when it was saved (the checkpoint's own step).
    pub step: u64,
    /// CRC-32 of its payload.
    pub crc: u32,
}

/// The shape of a host memory: its orders, rows per order and row width.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryShape {
    pub orders: Vec<usize>,
    pub slots: usize,
    pub dim: usize,
}

impl MemoryShape {
    /// Floats in one of the three arrays (table, first moment, second moment).
    fn floats_per_array(&self) -> Option<usize> {
        self.orders
            .len()
            .checked_mul(self.slots)?
            .checked_mul(self.dim)
    }

    fn payload_bytes(&self) -> Option<usize> {
        self.floats_per_array()?.checked_mul(3 * 4)
    }
}

/// The memory rows a batch read: the gathered values and which row each came from.
#[derive(Debug)]
pub struct MemoryRead {
    /// `[B, T, orders x dim]`, orders concatenated in config order.
    pub values: Tensor,
    /// `rows[order][position]` over the `B x T` positions, batch-major.
    pub rows: Vec<Vec<u32>>,
}

/// Per order, the summed gradient of every row a batch read (sorted by row, so every
/// reduction happens in one fixed order and a resumed run repeats it bit for bit).
#[derive(Debug, Default)]
pub struct SparseGrad {
    per_order: Vec<BTreeMap<u32, Vec<f32>>>,
}

impl SparseGrad {
    /// Sums `grad` (`[B, T, orders x dim]`, flattened) into the rows `rows` names.
    pub fn accumulate(rows: &[Vec<u32>], grad: &[f32], dim: usize) -> Self {
        let width = rows.len() * dim;
        let per_order = rows
            .iter()
            .enumerate()
            .map(|(k, order_rows)| {
                let mut sums: BTreeMap<u32, Vec<f32>> = BTreeMap::new();
                for (position, &row) in order_rows.iter().enumerate() {
                    let start = position * width + k * dim;
                    let sum = sums.entry(row).or_insert_with(|| vec![0.0; dim]);
                    for (s, g) in sum.iter_mut().zip(&grad[start..start + dim]) {
                        *s += g;
                    }
                }
                sums
            })
            .collect();
        SparseGrad { per_order }
    }

    /// Sum of squares of every summed row gradient (its share of the global norm).
    pub fn norm_squared(&self) -> f64 {
        self.per_order
            .iter()
            .flat_map(|m| m.values())
            .flatten()
            .map(|&g| f64::from(g) * f64::from(g))
            .sum()
    }

    /// Distinct rows touched, over all orders.
    pub fn rows_touched(&self) -> usize {
        self.per_order.iter().map(BTreeMap::len).sum()
    }
}

/// The host-RAM memory: table and Adam moments in one anonymous map.
pub struct HostMemory {
    shape: MemoryShape,
    data: MmapMut,
}

impl std::fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMemory")
            .field("shape", &self.shape)
            .finish_non_exhaustive()
    }
}

impl HostMemory {
    fn map(shape: &MemoryShape) -> Result<MmapMut, NgramError> {
        let too_large = |reason: String| NgramError::TooLarge {
            orders: shape.orders.len(),
            slots: shape.slots,
            dim: shape.dim,
            bytes: shape
                .payload_bytes()
                .map_or_else(|| "more than usize::MAX".into(), |b| b.to_string()),
            reason,
        };
        let bytes = shape
            .payload_bytes()
            .ok_or_else(|| too_large("the size overflows".into()))?;
        MmapMut::map_anon(bytes).map_err(|e| too_large(e.to_string()))
    }

    /// A new memory: every row drawn N(0, 0.02) from `seed`, moments zero. Rows are drawn in
    /// fixed chunks, each from its own stream, so the result does not depend on threads.
    pub fn fresh(shape: MemoryShape, seed: u64) -> Result<Self, NgramError> {
        let mut data = Self::map(&shape)?;
        let per_array = shape.floats_per_array().unwrap_or(0);
        let floats: &mut [f32] = bytemuck::cast_slice_mut(&mut data[..]);
        floats[..per_array]
            .par_chunks_mut(INIT_CHUNK_ROWS * shape.dim)
            .enumerate()
            .for_each(|(chunk, values)| {
                let mut rng = stream(seed, INIT_STREAM, chunk as u64);
                for v in values {
                    *v = (INIT_STD * rng.next_normal()) as f32;
                }
            });
        Ok(HostMemory { shape, data })
    }

    pub fn shape(&self) -> &MemoryShape {
        &self.shape
    }

    /// Table and moments, exactly the payload a save writes.
    pub fn payload(&self) -> &[u8] {
        &self.data[..]
    }

    fn floats(&self) -> &[f32] {
        bytemuck::cast_slice(&self.data[..])
    }

    /// The table of order index `k` (`slots x dim`).
    pub fn table(&self, k: usize) -> &[f32] {
        let len = self.shape.slots * self.shape.dim;
        &self.floats()[k * len..(k + 1) * len]
    }

    /// Gathers the rows every position of `windows` (each starting a sequence) reads.
    pub fn read(&self, windows: &[&[u8]], device: &Device) -> candle_core::Result<MemoryRead> {
        let (b, t) = (windows.len(), windows.first().map_or(0, |w| w.len()));
        let (orders, dim) = (&self.shape.orders, self.shape.dim);
        let mut rows: Vec<Vec<u32>> = vec![Vec::with_capacity(b * t); orders.len()];
        for window in windows {
            let window_rows = engram::rows_for(&[], window, orders, self.shape.slots);
            for (all, order_rows) in rows.iter_mut().zip(window_rows) {
                all.extend(order_rows);
            }
        }
        let mut values = Vec::with_capacity(b * t * orders.len() * dim);
        for position in 0..b * t {
            for (k, order_rows) in rows.iter().enumerate() {
                let row = order_rows[position] as usize;
                values.extend_from_slice(&self.table(k)[row * dim..(row + 1) * dim]);
            }
        }
        let values = Tensor::from_vec(values, (b, t, orders.len() * dim), device)?;
        Ok(MemoryRead { values, rows })
    }

    /// One lazy-Adam update of the rows in `grad` (scaled by `clip_scale`), no weight decay;
    /// `update` is the 1-based count of updates, for the bias correction.
    pub fn apply_adam(&mut self, grad: &SparseGrad, lr: f64, clip_scale: f64, update: u64) {
        let (dim, slots) = (self.shape.dim, self.shape.slots);
        let per_array = self.shape.floats_per_array().unwrap_or(0);
        let correction1 = 1.0 - BETA1.powi(update as i32);
        let correction2 = 1.0 - BETA2.powi(update as i32);
        let floats: &mut [f32] = bytemuck::cast_slice_mut(&mut self.data[..]);
        let (table, moments) = floats.split_at_mut(per_array);
        let (first, second) = moments.split_at_mut(per_array);
        for (k, rows) in grad.per_order.iter().enumerate() {
            for (&row, g) in rows {
                let start = (k * slots + row as usize) * dim;
                for i in 0..dim {
                    let g = f64::from(g[i]) * clip_scale;
                    let m = BETA1 * f64::from(first[start + i]) + (1.0 - BETA1) * g;
                    let v = BETA2 * f64::from(second[start + i]) + (1.0 - BETA2) * g * g;
                    first[start + i] = m as f32;
                    second[start + i] = v as f32;
                    let step = (m / correction1) / ((v / correction2).sqrt() + EPS);
                    table[start + i] = (f64::from(table[start + i]) - lr * step) as f32;
                }
            }
        }
    }

    fn header(&self, step: u64, payload_crc: u32) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&(self.shape.dim as u32).to_le_bytes());
        h[16..24].copy_from_slice(&(self.shape.slots as u64).to_le_bytes());
        h[24..32].copy_from_slice(&step.to_le_bytes());
        h[32..36].copy_from_slice(&(self.shape.orders.len() as u32).to_le_bytes());
        for (i, &n) in self.shape.orders.iter().enumerate() {
            h[36 + 4 * i..40 + 4 * i].copy_from_slice(&(n as u32).to_le_bytes());
        }
        h[68..72].copy_from_slice(&payload_crc.to_le_bytes());
        let header_crc = crc32fast::hash(&h[..72]);
        h[72..76].copy_from_slice(&header_crc.to_le_bytes());
        h
    }

    /// Writes the memory at `step` to `tmp` (fsynced, not yet in place); [`commit`] moves it
    /// to its final name once the checkpoint that records the returned stamp is saved.
    pub fn write_pending(&self, tmp: &Path, step: u64) -> Result<SidecarStamp, NgramError> {
        let crc = crc32fast::hash(&self.data[..]);
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(tmp)
            .map_err(io_error(tmp))?;
        let mut out = BufWriter::with_capacity(8 << 20, file);
        out.write_all(&self.header(step, crc))
            .and_then(|()| out.write_all(&self.data[..]))
            .map_err(io_error(tmp))?;
        let file = out
            .into_inner()
            .map_err(|e| io_error(tmp)(e.into_error()))?;
        file.sync_all().map_err(io_error(tmp))?;
        Ok(SidecarStamp { step, crc })
    }

    /// Reads the sidecar at `path`, refusing one whose shape, step or CRC is not `expected`.
    pub fn load(
        path: &Path,
        shape: &MemoryShape,
        expected: SidecarStamp,
    ) -> Result<Self, NgramError> {
        let mut file = File::open(path).map_err(io_error(path))?;
        let header = read_header(&mut file, path)?;
        check_shape(&header, shape, path)?;
        if header.step != expected.step {
            return Err(NgramError::WrongStep {
                path: path.to_path_buf(),
                found: header.step,
                expected: expected.step,
            });
        }
        let mut data = Self::map(shape)?;
        let file_len = file.metadata().map_err(io_error(path))?.len();
        if file_len != (HEADER_LEN + data.len()) as u64 {
            return Err(NgramError::BadHeader {
                path: path.to_path_buf(),
                reason: format!(
                    "the file is {file_len} bytes; its header says {}",
                    HEADER_LEN + data.len()
                ),
            });
        }
        file.read_exact(&mut data[..]).map_err(io_error(path))?;
        let crc = crc32fast::hash(&data[..]);
        if crc != header.payload_crc || crc != expected.crc {
            return Err(NgramError::Checksum {
                path: path.to_path_buf(),
            });
        }
        Ok(HostMemory {
            shape: shape.clone(),
            data,
        })
    }
}

/// What a sidecar's header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidecarHeader {
    pub shape: MemoryShape,
    pub step: u64,
    pub payload_crc: u32,
}

fn read_header(file: &mut File, path: &Path) -> Result<SidecarHeader, NgramError> {
    let mut h = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match file.read(&mut h[got..]).map_err(io_error(path))? {
            0 => break,
            n => got += n,
        }
    }
    parse_header(&h[..got], path)
}

/// Parses and checks the first bytes of a sidecar (80 are enough; `path` names it in errors).
pub fn parse_header(h: &[u8], path: &Path) -> Result<SidecarHeader, NgramError> {
    let got = h.len();
    if !h.starts_with(MAGIC) {
        return Err(NgramError::NotASidecar {
            path: path.to_path_buf(),
            advice: dmexp::identify::identify(h).advice(Some(path)),
        });
    }
    let bad = |reason: &str| NgramError::BadHeader {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    if got < HEADER_LEN {
        return Err(bad("the file ends inside the 80-byte header"));
    }
    let u32_at = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    let u64_at = |at: usize| u64::from(u32_at(at)) | (u64::from(u32_at(at + 4)) << 32);
    let version = u32_at(8);
    if version != VERSION {
        return Err(NgramError::UnknownVersion {
            path: path.to_path_buf(),
            found: version,
        });
    }
    if crc32fast::hash(&h[..72]) != u32_at(72) {
        return Err(bad("the header fails its CRC"));
    }
    if u32_at(76) != 0 {
        return Err(bad("the reserved word is not zero"));
    }
    let count = u32_at(32) as usize;
    if !(1..=MAX_ORDERS).contains(&count) {
        return Err(bad("the order count is not in 1..=8"));
    }
    let orders: Vec<usize> = (0..count).map(|i| u32_at(36 + 4 * i) as usize).collect();
    if (count..MAX_ORDERS).any(|i| u32_at(36 + 4 * i) != 0) {
        return Err(bad("an unused order slot is not zero"));
    }
    let slots = usize::try_from(u64_at(16)).map_err(|_| bad("slots overflows usize"))?;
    Ok(SidecarHeader {
        shape: MemoryShape {
            orders,
            slots,
            dim: u32_at(12) as usize,
        },
        step: u64_at(24),
        payload_crc: u32_at(68),
    })
}

/// Reads only the header of the sidecar at `path`.
pub fn peek(path: &Path) -> Result<SidecarHeader, NgramError> {
    let mut file = File::open(path).map_err(io_error(path))?;
    read_header(&mut file, path)
}

fn check_shape(header: &SidecarHeader, shape: &MemoryShape, path: &Path) -> Result<(), NgramError> {
    let mismatch = |field, found: String, expected: String| NgramError::Shape {
        path: path.to_path_buf(),
        field,
        found,
        expected,
    };
    let h = &header.shape;
    if h.orders != shape.orders {
        return Err(mismatch(
            "engram_orders",
            format!("{:?}", h.orders),
            format!("{:?}", shape.orders),
        ));
    }
    if h.slots != shape.slots {
        return Err(mismatch(
            "engram_slots",
            h.slots.to_string(),
            shape.slots.to_string(),
        ));
    }
    if h.dim != shape.dim {
        return Err(mismatch(
            "engram_dim",
            h.dim.to_string(),
            shape.dim.to_string(),
        ));
    }
    Ok(())
}

/// `<dir>/<name>.ngram` beside the checkpoint `<dir>/<name>.bin`.
pub fn sidecar_path(bin: &Path) -> PathBuf {
    bin.with_extension("ngram")
}

/// Where a sidecar waits until the checkpoint that records it is in place.
pub fn pending_path(bin: &Path) -> PathBuf {
    bin.with_extension("ngram.tmp")
}

/// Moves the pending sidecar to its final name and makes the rename durable.
pub fn commit(bin: &Path) -> Result<(), NgramError> {
    let (pending, target) = (pending_path(bin), sidecar_path(bin));
    std::fs::rename(&pending, &target).map_err(io_error(&target))?;
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error(&dir))
}

/// The sidecar that belongs with the checkpoint `bin` whose trainer section holds `stamp`.
/// A save killed after its checkpoint was renamed into place but before its sidecar was
/// leaves the right sidecar pending: it is moved into place here (the save rolled forward).
pub fn open_for(
    bin: &Path,
    shape: &MemoryShape,
    stamp: SidecarStamp,
) -> Result<HostMemory, NgramError> {
    let (target, pending) = (sidecar_path(bin), pending_path(bin));
    let in_place = peek(&target).map(|h| h.step == stamp.step);
    if !matches!(in_place, Ok(true)) {
        let pending_matches = peek(&pending)
            .map(|h| h.step == stamp.step && h.payload_crc == stamp.crc)
            .unwrap_or(false);
        if pending_matches {
            commit(bin)?;
        } else {
            in_place?;
        }
    }
    HostMemory::load(&target, shape, stamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> MemoryShape {
        MemoryShape {
            orders: vec![2, 3],
            slots: 64,
            dim: 4,
        }
    }

    #[test]
    fn fresh_memory_is_seeded_and_independent_of_threads() {
        let big = MemoryShape {
            slots: 5 * INIT_CHUNK_ROWS + 3,
            ..shape()
        };
        let one_thread = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let four_threads = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let serial = one_thread.install(|| HostMemory::fresh(big.clone(), 7).unwrap());
        let parallel = four_threads.install(|| HostMemory::fresh(big, 7).unwrap());
        assert!(serial.payload() == parallel.payload());
        let a = HostMemory::fresh(shape(), 7).unwrap();
        let b = HostMemory::fresh(shape(), 7).unwrap();
        let c = HostMemory::fresh(shape(), 8).unwrap();
        assert_eq!(a.floats(), b.floats());
        assert_ne!(a.table(0), c.table(0));
        let n = 2 * 64 * 4;
        assert!(
            a.floats()[n..].iter().all(|&x| x == 0.0),
            "moments start at 0"
        );
        let std = (a.table(0).iter().map(|x| x * x).sum::<f32>() / 256.0).sqrt();
        assert!((0.01..0.03).contains(&std), "std {std}");
    }

    #[test]
    fn a_written_header_parses_back_and_any_bytes_never_panic() {
        let memory = HostMemory::fresh(shape(), 3).unwrap();
        let header = memory.header(42, 0xDEAD_BEEF);
        let parsed = parse_header(&header, Path::new("x.ngram")).unwrap();
        assert_eq!(parsed.shape, shape());
        assert_eq!((parsed.step, parsed.payload_crc), (42, 0xDEAD_BEEF));
        for len in 0..HEADER_LEN {
            assert!(parse_header(&header[..len], Path::new("x")).is_err());
        }
        proptest::proptest!(|(bytes in proptest::collection::vec(0u8..=255, 0..120), flip in 0usize..80)| {
            let _ = parse_header(&bytes, Path::new("x"));
            let mut damaged = header;
            damaged[flip] ^= 0x10;
            proptest::prop_assert!(parse_header(&damaged, Path::new("x")).is_err());
        });
    }

    #[test]
    fn sparse_gradients_sum_repeated_rows_and_only_those_rows_move() {
        let mut memory = HostMemory::fresh(shape(), 1).unwrap();
        let before = memory.floats().to_vec();
        // Two positions reading row 5 of order 2 and rows 9, 9 of order 3.
        let rows = vec![vec![5, 5], vec![9, 9]];
        let grad: Vec<f32> = (0..2 * 8).map(|i| i as f32).collect();
        let sparse = SparseGrad::accumulate(&rows, &grad, 4);
        assert_eq!(sparse.per_order[0][&5], vec![8.0, 10.0, 12.0, 14.0]);
        assert_eq!(sparse.per_order[1][&9], vec![16.0, 18.0, 20.0, 22.0]);
        assert_eq!(sparse.rows_touched(), 2);
        memory.apply_adam(&sparse, 0.1, 1.0, 1);
        let changed: Vec<usize> = (0..2 * 64 * 4)
            .filter(|&i| memory.floats()[i] != before[i])
            .collect();
        let expected: Vec<usize> = (5 * 4..6 * 4).chain((64 + 9) * 4..(64 + 10) * 4).collect();
        assert_eq!(changed, expected);
        // The first Adam step moves each component by lr (m_hat / sqrt(v_hat) = sign(g)).
        for &i in &expected {
            assert!((before[i] - memory.floats()[i] - 0.1).abs() < 1e-6);
        }
    }
}
