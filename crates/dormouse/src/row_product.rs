//! The matrix product of decoding steps: `y = x W^T (+ b)` for a few rows of `x`, where each
//! output is one dot product whose rounding depends on nothing but its own row and weight row.
//!
//! candle's product (the `gemm` crate) picks a kernel by size (a matrix-vector kernel for one
//! row, a small-product kernel, a blocked kernel whose tile holds dozens of rows) and each
//! kernel rounds differently, so a row's bits would depend on how many sequences decode with
//! it; and the blocked kernel spends a whole tile's arithmetic on one or two rows. Here every
//! dot product is [`LANES`] running sums over the row zero-padded to a multiple of `LANES`,
//! lane `l` taking the elements `l`, `l + LANES`, ..., the lanes then summed in a fixed tree
//! ([`dot`]). Every multiply-add is fused, one rounding (`f32::mul_add`; FMA instructions on
//! the AVX2 path), so the vector kernel and the portable one give the same bits, on every
//! machine, with any number of rows or threads. Each weight row is
//! read once per call for all rows of `x`, which is what makes batching pay.

use candle_core::{DType, Device, Result, Storage, Tensor};

/// Running sums per dot product.
pub const LANES: usize = 16;

/// Multiply-adds from which a product is split across every core (a batched step's): below it
/// (a lone step's products) starting threads and waiting for them costs more than it saves.
const PARALLEL_PRODUCTS: usize = 1 << 20;

/// `x [B, in]` times the transpose of `weight [out, in]`, plus `bias [out]` if given:
/// `[B, out]`. Both tensors must be f32 on the CPU; the weight contiguous.
pub fn rows_times_transposed(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let (rows, inputs) = x.dims2()?;
    let (outputs, weight_inputs) = weight.dims2()?;
    if inputs != weight_inputs {
        candle_core::bail!(
            "a product of [{rows}, {inputs}] rows with a [{outputs}, {weight_inputs}] weight"
        );
    }
    if rows == 0 || outputs == 0 || inputs == 0 {
        // Nothing to sum: zeros (the chunked loops below need whole rows).
        return plus_bias(
            Tensor::zeros((rows, outputs), DType::F32, &Device::Cpu)?,
            bias,
        );
    }
    let x = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let (storage, layout) = weight.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        candle_core::bail!("decoding steps run on the CPU");
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("a decoding step's weight must be contiguous");
    };
    let weight = &cpu.as_slice::<f32>()?[start..end];
    // Output-major while computing, so each thread owns whole weight rows; transposed after.
    let mut by_output = vec![0f32; outputs * rows];
    let threads = if rows * outputs * inputs < PARALLEL_PRODUCTS {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    };
    // Whole groups of four weight rows per thread, so each thread runs the same kernel.
    let per_thread = outputs.div_ceil(threads).next_multiple_of(4);
    std::thread::scope(|scope| {
        let mut parts = by_output
            .chunks_mut(per_thread * rows)
            .zip(weight.chunks(per_thread * inputs));
        let first = parts.next();
        for (out, w) in parts {
            scope.spawn(|| products(&x, w, inputs, out));
        }
        if let Some((out, w)) = first {
            products(&x, w, inputs, out);
        }
    });
    let mut y = vec![0f32; rows * outputs];
    for (j, column) in by_output.chunks(rows).enumerate() {
        for (i, &v) in column.iter().enumerate() {
            y[i * outputs + j] = v;
        }
    }
    plus_bias(Tensor::from_vec(y, (rows, outputs), &Device::Cpu)?, bias)
}

fn plus_bias(y: Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    match bias {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}

/// `out[j * rows + i] = dot(x row i, w row j)` for every weight row of `w` and row of `x`.
fn products(x: &[f32], w: &[f32], inputs: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = pulp::x86::V3::try_new() {
        return pulp::Simd::vectorize(
            v3,
            avx2::Products {
                v3,
                x,
                w,
                inputs,
                out,
            },
        );
    }
    let rows = x.len() / inputs.max(1);
    for (out, w) in out.chunks_mut(rows).zip(w.chunks(inputs)) {
        for (o, x) in out.iter_mut().zip(x.chunks(inputs)) {
            *o = dot(x, w);
        }
    }
}

/// The dot product in the order the module describes: the vectors zero-padded to a multiple
/// of [`LANES`], lane `l` summing the products of elements `l`, `l + LANES`, ...; then lanes
/// `l` and `l + 8` added, then `l` and `l + 4`, then `l` and `l + 2`, then the last two.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    for (a, b) in padded_chunks(a).zip(padded_chunks(b)) {
        for l in 0..LANES {
            lanes[l] = a[l].mul_add(b[l], lanes[l]);
        }
    }
    reduce(lanes)
}

fn reduce(lanes: [f32; LANES]) -> f32 {
    let s: [f32; 8] = std::array::from_fn(|l| lanes[l] + lanes[l + 8]);
    let h = [s[0] + s[4], s[1] + s[5], s[2] + s[6], s[3] + s[7]];
    (h[0] + h[2]) + (h[1] + h[3])
}

/// `v` in chunks of [`LANES`], the last one padded with zeros.
fn padded_chunks(v: &[f32]) -> impl Iterator<Item = [f32; LANES]> + '_ {
    v.chunks(LANES).map(|c| {
        let mut chunk = [0f32; LANES];
        chunk[..c.len()].copy_from_slice(c);
        chunk
    })
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! [`super::dot`] in 8-lane AVX2 operations (pulp's safe `V3` token): two vectors of eight
    //! running sums, fused multiply-adds, the same reduction; the same bits.

    use pulp::bytemuck::cast;
    use pulp::f32x8;
    use pulp::x86::V3;

    use super::LANES;

    pub(super) struct Products<'a> {
        pub v3: V3,
        pub x: &'a [f32],
        pub w: &'a [f32],
        pub inputs: usize,
        pub out: &'a mut [f32],
    }

    impl pulp::WithSimd for Products<'_> {
        type Output = ();

        /// Four weight rows at a time against each row of `x`: eight independent running
        /// sums keep the adders busy, and each loaded piece of `x` serves four outputs.
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let Products {
                v3,
                x,
                w,
                inputs,
                out,
            } = self;
            let rows = x.len() / inputs.max(1);
            let mut outs = out.chunks_mut(rows);
            let mut quads = w.chunks_exact(4 * inputs);
            for quad in quads.by_ref() {
                let w: [&[f32]; 4] = std::array::from_fn(|r| &quad[r * inputs..][..inputs]);
                let mut columns: Vec<&mut [f32]> = outs.by_ref().take(4).collect();
                for (i, x) in x.chunks(inputs).enumerate() {
                    for (column, sum) in columns.iter_mut().zip(dot4(v3, x, w)) {
                        column[i] = sum;
                    }
                }
            }
            for (out, w) in outs.zip(quads.remainder().chunks(inputs)) {
                for (o, x) in out.iter_mut().zip(x.chunks(inputs)) {
                    *o = dot4(v3, x, [w; 4])[0];
                }
            }
        }
    }

    /// [`super::dot`] of `x` with four weight rows at once, each with its own lanes.
    #[inline(always)]
    fn dot4(v3: V3, x: &[f32], w: [&[f32]; 4]) -> [f32; 4] {
        let zero = v3.splat_f32x8(0.0);
        let (mut l0, mut l1, mut l2, mut l3) = (zero, zero, zero, zero);
        let (mut h0, mut h1, mut h2, mut h3) = (zero, zero, zero, zero);
        let whole = x.len() / LANES * LANES;
        let rows = chunks(x, whole)
            .iter()
            .zip(chunks(w[0], whole))
            .zip(chunks(w[1], whole))
            .zip(chunks(w[2], whole))
            .zip(chunks(w[3], whole));
        let halves = |c: &[f32; LANES]| -> (f32x8, f32x8) {
            let [low, high]: [[f32; 8]; 2] = cast(*c);
            (cast(low), cast(high))
        };
        let mut step = |x: &[f32; LANES],
                        w0: &[f32; LANES],
                        w1: &[f32; LANES],
                        w2: &[f32; LANES],
                        w3: &[f32; LANES]| {
            let (xl, xh) = halves(x);
            let ((a, b), (c, d)) = (halves(w0), halves(w1));
            let ((e, f), (g, h)) = (halves(w2), halves(w3));
            l0 = v3.mul_add_f32x8(xl, a, l0);
            h0 = v3.mul_add_f32x8(xh, b, h0);
            l1 = v3.mul_add_f32x8(xl, c, l1);
            h1 = v3.mul_add_f32x8(xh, d, h1);
            l2 = v3.mul_add_f32x8(xl, e, l2);
            h2 = v3.mul_add_f32x8(xh, f, h2);
            l3 = v3.mul_add_f32x8(xl, g, l3);
            h3 = v3.mul_add_f32x8(xh, h, h3);
        };
        for ((((x, w0), w1), w2), w3) in rows {
            step(x, w0, w1, w2, w3);
        }
        if whole < x.len() {
            let p = |v: &[f32]| pad(&v[whole..]);
            step(&p(x), &p(w[0]), &p(w[1]), &p(w[2]), &p(w[3]));
        }
        [
            reduce(v3, l0, h0),
            reduce(v3, l1, h1),
            reduce(v3, l2, h2),
            reduce(v3, l3, h3),
        ]
    }

    #[inline(always)]
    fn chunks(v: &[f32], whole: usize) -> &[[f32; LANES]] {
        v[..whole].as_chunks::<LANES>().0
    }

    #[inline(always)]
    fn pad(tail: &[f32]) -> [f32; LANES] {
        let mut chunk = [0f32; LANES];
        chunk[..tail.len()].copy_from_slice(tail);
        chunk
    }

    #[inline(always)]
    fn reduce(v3: V3, low: f32x8, high: f32x8) -> f32 {
        let s: [f32; 8] = cast(v3.add_f32x8(low, high));
        let h = [s[0] + s[4], s[1] + s[5], s[2] + s[6], s[3] + s[7]];
        (h[0] + h[2]) + (h[1] + h[3])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dot_product_sums_in_its_documented_order() {
        // The documented order written out plainly, with fused or separate multiply-adds.
        let in_order = |a: &[f32], b: &[f32], fused: bool| {
            let mut lanes = [0f32; LANES];
            for k in 0..a.len().next_multiple_of(LANES) {
                let (x, y) = (
                    a.get(k).copied().unwrap_or(0.0),
                    b.get(k).copied().unwrap_or(0.0),
                );
                let lane = &mut lanes[k % LANES];
                *lane = if fused {
                    x.mul_add(y, *lane)
                } else {
                    *lane + x * y
                };
            }
            let mut tree = lanes.to_vec();
            while tree.len() > 1 {
                let half = tree.len() / 2;
                tree = (0..half).map(|l| tree[l] + tree[l + half]).collect();
            }
            tree[0]
        };
        let a: Vec<f32> = (0..1003).map(|i| (i as f32 * 0.731).sin() * 1.7).collect();
        let b: Vec<f32> = (0..1003).map(|i| (i as f32 * 0.377).cos() - 0.2).collect();
        assert_eq!(dot(&a, &b).to_bits(), in_order(&a, &b, true).to_bits());
        assert_ne!(
            dot(&a, &b).to_bits(),
            in_order(&a, &b, false).to_bits(),
            "the data tells fused from separate multiply-adds"
        );
        let exact: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum();
        assert!((f64::from(dot(&a, &b)) - exact).abs() < 1e-3);
    }

    /// The vectorized kernel (where the CPU has AVX2) gives the portable dot product's bits,
    /// for every length up to past three chunks.
    #[test]
    fn the_vector_kernel_gives_the_portable_bits() {
        for inputs in 1..=50 {
            let x: Vec<f32> = (0..2 * inputs)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.31)
                .collect();
            let w: Vec<f32> = (0..5 * inputs)
                .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.17)
                .collect();
            let mut out = vec![0f32; 2 * 5];
            products(&x, &w, inputs, &mut out);
            for j in 0..5 {
                for i in 0..2 {
                    let portable = dot(&x[i * inputs..][..inputs], &w[j * inputs..][..inputs]);
                    assert_eq!(
                        out[j * 2 + i].to_bits(),
                        portable.to_bits(),
                        "length {inputs}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_row_gets_the_same_bits_with_any_number_of_rows_and_the_bias_is_added() {
        let device = Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, (9, 70), &device).unwrap();
        let w = Tensor::randn(0f32, 0.1, (130, 70), &device).unwrap();
        let b = Tensor::randn(0f32, 0.1, 130, &device).unwrap();
        let all = rows_times_transposed(&x, &w, Some(&b))
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for (i, row) in all.iter().enumerate() {
            let alone = rows_times_transposed(&x.narrow(0, i, 1).unwrap(), &w, Some(&b))
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            let bits = |r: &[f32]| r.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(row), bits(&alone[0]), "row {i}");
        }
        let reference = x
            .matmul(&w.t().unwrap())
            .unwrap()
            .broadcast_add(&b)
            .unwrap();
        let delta = (Tensor::new(all, &device).unwrap() - reference)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(delta < 1e-4, "max |delta| vs candle's product: {delta}");
        assert!(rows_times_transposed(&x, &w.t().unwrap(), None).is_err());
        let empty = Tensor::zeros((2, 0), DType::F32, &device).unwrap();
        let no_inputs = Tensor::zeros((3, 0), DType::F32, &device).unwrap();
        let y = rows_times_transposed(&empty, &no_inputs, None).unwrap();
        assert_eq!(y.to_vec2::<f32>().unwrap(), vec![vec![0.0; 3]; 2]);
    }
}
