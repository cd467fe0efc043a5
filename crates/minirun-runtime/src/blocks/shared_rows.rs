//! A batch's input rows as several products read them: an MLP's gate and up projections take
//! the same rows, and so do all of a layer's routed experts. With 8-bit activations each of
//! those products would quantize the rows it reads; here they are quantized once, by the first
//! product that asks, and shared. Quantizing depends only on a row's values and the group, so
//! every product still gets the bits its own quantization would give it.

use std::borrow::Cow;
use std::sync::OnceLock;

use minirun_kernels::{Int8Vector, KernelError};

/// Rows of f32 values and, once asked for, their 8-bit form for one group.
pub(crate) struct SharedRows<'x> {
    values: &'x [Vec<f32>],
    /// The group first asked for, and every row quantized for it (or why that failed).
    int8: OnceLock<(usize, Result<Vec<Int8Vector>, KernelError>)>,
}

impl<'x> SharedRows<'x> {
    pub fn new(values: &'x [Vec<f32>]) -> SharedRows<'x> {
        SharedRows {
            values,
            int8: OnceLock::new(),
        }
    }

    pub fn values(&self) -> &'x [Vec<f32>] {
        self.values
    }

    /// Every row quantized for `group`: computed by the first caller (the others wait for it)
    /// and kept; a later caller asking for another group gets its own quantization.
    pub fn quantized(&self, group: usize) -> Result<Cow<'_, [Int8Vector]>, KernelError> {
        let (kept_group, kept) = self
            .int8
            .get_or_init(|| (group, quantize_all(self.values, group)));
        if *kept_group != group {
            return quantize_all(self.values, group).map(Cow::Owned);
        }
        kept.as_deref().map(Cow::Borrowed).map_err(Clone::clone)
    }

    /// Quantizes every row for `group` now, before the products that share them run in
    /// parallel: asked for lazily from inside them, one worker would quantize while the others
    /// wait on it.
    pub fn prepare(&self, group: usize) {
        // The value (or the error) is kept for the products to take.
        let _ = self.quantized(group);
    }

    /// Rows `which` (indices into the batch), each borrowed from `all`.
    pub fn pick<'a, T>(all: &'a [T], which: &[usize]) -> Result<Vec<&'a T>, KernelError> {
        which
            .iter()
            .map(|&i| {
                all.get(i).ok_or(KernelError::Length {
                    what: "batch rows",
                    expected: i + 1,
                    actual: all.len(),
                })
            })
            .collect()
    }
}

/// Every row quantized, rows on whichever worker takes them (each row's codes are its own).
fn quantize_all(values: &[Vec<f32>], group: usize) -> Result<Vec<Int8Vector>, KernelError> {
    use rayon::prelude::*;
    values
        .par_iter()
        .map(|x| Int8Vector::quantize(x, group))
        .collect()
}
