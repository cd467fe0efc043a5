//! The host-RAM Engram memory of an `--engram-ram` run.
//!
//! With `engram_ram` the memory rows do not live in the model (whose tables the config seam
//! squeezes to one row per order) but here: `engram_slots` rows per order in an anonymous
//! memory map, gathered per batch on the host and updated sparsely (only the rows a batch
//! read) by a lazy Adam of their own. Untouched pages of the moments cost no memory. The map
//! holds, order-major, the table, then its first moment, then its second moment: exactly the
//! payload of the run's `.ngram` sidecar ([`super::sidecar`]).

use std::collections::BTreeMap;

use candle_core::{Device, Tensor};
use memmap2::MmapMut;
use rayon::prelude::*;

use super::hash;
use crate::optim::{self, BETA1, BETA2};
use crate::rng::{purpose, stream};

const INIT_STD: f64 = 0.02;
/// Rows drawn from one stream: a fixed chunking, so the draw does not depend on the thread
/// count.
const INIT_CHUNK_ROWS: usize = 4096;

/// Why a host memory could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
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

/// The shape of a host memory: its orders, rows per order and row width.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryShape {
    pub orders: Vec<usize>,
    pub slots: usize,
    pub dim: usize,
}

impl MemoryShape {
    /// Floats in one of the three arrays (table, first moment, second moment).
    pub fn floats_per_array(&self) -> Option<usize> {
        self.orders
            .len()
            .checked_mul(self.slots)?
            .checked_mul(self.dim)
    }

    /// Bytes of the three arrays together (the sidecar's payload).
    pub fn payload_bytes(&self) -> Option<usize> {
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
    /// A memory of `shape` whose table and moments are all zero (untouched pages cost
    /// nothing), to be filled by a draw or a sidecar.
    pub fn zeroed(shape: MemoryShape) -> Result<Self, MemoryError> {
        let too_large = |reason: String| MemoryError::TooLarge {
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
        let data = MmapMut::map_anon(bytes).map_err(|e| too_large(e.to_string()))?;
        Ok(HostMemory { shape, data })
    }

    /// A new memory: every row drawn N(0, 0.02) from `seed`, moments zero. Rows are drawn in
    /// fixed chunks, each from its own stream, so the result does not depend on threads.
    pub fn fresh(shape: MemoryShape, seed: u64) -> Result<Self, MemoryError> {
        let mut memory = Self::zeroed(shape)?;
        let per_array = memory.shape.floats_per_array().unwrap_or(0);
        let chunk = INIT_CHUNK_ROWS * memory.shape.dim;
        let floats: &mut [f32] = bytemuck::cast_slice_mut(&mut memory.data[..]);
        floats[..per_array]
            .par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(chunk, values)| {
                let mut rng = stream(seed, purpose::HOST_MEMORY_INIT, chunk as u64);
                for v in values {
                    *v = (INIT_STD * rng.next_normal()) as f32;
                }
            });
        Ok(memory)
    }

    pub fn shape(&self) -> &MemoryShape {
        &self.shape
    }

    /// Table and moments, exactly the payload a save writes.
    pub fn payload(&self) -> &[u8] {
        &self.data[..]
    }

    /// Table and moments, for a load to read a saved payload into.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.data[..]
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
            let window_rows = hash::rows_for(&[], window, orders, self.shape.slots);
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
        let corrections = (
            optim::bias_correction(BETA1, update),
            optim::bias_correction(BETA2, update),
        );
        let floats: &mut [f32] = bytemuck::cast_slice_mut(&mut self.data[..]);
        let (table, moments) = floats.split_at_mut(per_array);
        let (first, second) = moments.split_at_mut(per_array);
        for (k, rows) in grad.per_order.iter().enumerate() {
            for (&row, g) in rows {
                let start = (k * slots + row as usize) * dim;
                let at = start..start + dim;
                optim::adam_row(
                    &mut table[at.clone()],
                    &mut first[at.clone()],
                    &mut second[at],
                    g,
                    lr,
                    clip_scale,
                    corrections,
                );
            }
        }
    }
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
