//! Element-by-element updates written into an existing tensor's buffer (the optimizer's
//! moments and parameters, the EMA teacher): one pass, no new buffer. Each element is updated
//! by one thread from its own inputs, so the bits do not depend on the number of threads.

use candle_core::{CpuStorage, Layout, Result, Tensor};
use rayon::prelude::*;

use super::with_f32;

/// Elements per parallel task.
const CHUNK: usize = 1 << 15;

/// `update(&mut d, s)` for every element `d` of `dst` and `s` of `src` (same shapes).
pub fn update_with(
    name: &'static str,
    dst: &Tensor,
    src: &Tensor,
    update: impl Fn(&mut f32, f32) + Sync,
) -> Result<()> {
    same_shape(name, dst, src)?;
    if dst.id() == src.id() {
        candle_core::bail!("{name} updates a tensor from another one");
    }
    let src = src.contiguous()?;
    with_mut_f32(name, dst, |d| {
        with_f32(name, &src, |s| {
            d.par_chunks_mut(CHUNK)
                .zip(s.par_chunks(CHUNK))
                .for_each(|(d, s)| {
                    for (d, &s) in d.iter_mut().zip(s) {
                        update(d, s);
                    }
                });
            Ok(())
        })
    })
}

/// `update(&mut a, &mut b, &mut c, s)` for every element of three tensors updated together
/// and one read (same shapes): one pass over the four where three would take three.
/// The three must be distinct tensors with buffers of their own: each is locked for writing
/// while the others are.
pub fn update_three(
    name: &'static str,
    [a, b, c]: [&Tensor; 3],
    src: &Tensor,
    update: impl Fn(&mut f32, &mut f32, &mut f32, f32) + Sync,
) -> Result<()> {
    for t in [b, c, src] {
        same_shape(name, a, t)?;
    }
    if a.id() == b.id() || a.id() == c.id() || b.id() == c.id() {
        candle_core::bail!("{name} updates three distinct tensors");
    }
    let src = src.contiguous()?;
    with_mut_f32(name, a, |a| {
        with_mut_f32(name, b, |b| {
            with_mut_f32(name, c, |c| {
                with_f32(name, &src, |s| {
                    let outs = a.par_chunks_mut(CHUNK).zip(b.par_chunks_mut(CHUNK));
                    outs.zip(c.par_chunks_mut(CHUNK).zip(s.par_chunks(CHUNK)))
                        .for_each(|((a, b), (c, s))| {
                            let rows = a.iter_mut().zip(b.iter_mut());
                            for ((a, b), (c, &s)) in rows.zip(c.iter_mut().zip(s)) {
                                update(a, b, c, s);
                            }
                        });
                    Ok(())
                })
            })
        })
    })
}

/// [`update_three`] with a fourth tensor updated in the same pass, after the other three
/// (an average of the first that reads the first's new value).
pub fn update_four(
    name: &'static str,
    [a, b, c, d]: [&Tensor; 4],
    src: &Tensor,
    update: impl Fn(&mut f32, &mut f32, &mut f32, &mut f32, f32) + Sync,
) -> Result<()> {
    for t in [b, c, d, src] {
        same_shape(name, a, t)?;
    }
    let ids = [a.id(), b.id(), c.id(), d.id()];
    if (1..4).any(|i| ids[..i].contains(&ids[i])) {
        candle_core::bail!("{name} updates four distinct tensors");
    }
    let src = src.contiguous()?;
    with_mut_f32(name, a, |a| {
        with_mut_f32(name, b, |b| {
            with_mut_f32(name, c, |c| {
                with_mut_f32(name, d, |d| {
                    with_f32(name, &src, |s| {
                        let ab = a.par_chunks_mut(CHUNK).zip(b.par_chunks_mut(CHUNK));
                        let cd = c.par_chunks_mut(CHUNK).zip(d.par_chunks_mut(CHUNK));
                        ab.zip(cd)
                            .zip(s.par_chunks(CHUNK))
                            .for_each(|(((a, b), (c, d)), s)| {
                                let ab = a.iter_mut().zip(b.iter_mut());
                                let cd = c.iter_mut().zip(d.iter_mut());
                                for (((a, b), (c, d)), &s) in ab.zip(cd).zip(s) {
                                    update(a, b, c, d, s);
                                }
                            });
                        Ok(())
                    })
                })
            })
        })
    })
}

/// Runs `f` on the f32 elements of a contiguous CPU tensor, writable (the tensor's storage is
/// locked for writing meanwhile).
pub fn with_mut_f32<R>(
    name: &'static str,
    t: &Tensor,
    f: impl FnOnce(&mut [f32]) -> Result<R>,
) -> Result<R> {
    struct Op<F, R> {
        name: &'static str,
        f: std::cell::Cell<Option<F>>,
        out: std::cell::Cell<Option<Result<R>>>,
    }
    impl<F: FnOnce(&mut [f32]) -> Result<R>, R> candle_core::InplaceOp1 for Op<F, R> {
        fn name(&self) -> &'static str {
            self.name
        }
        fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
            let values = destination(self.name, storage, layout)?;
            if let Some(f) = self.f.take() {
                self.out.set(Some(f(values)));
            }
            Ok(())
        }
    }
    let op = Op {
        name,
        f: std::cell::Cell::new(Some(f)),
        out: std::cell::Cell::new(None),
    };
    t.inplace_op1(&op)?;
    match op.out.take() {
        Some(out) => out,
        None => candle_core::bail!("{name} did not run on a CPU tensor"),
    }
}

fn same_shape(name: &str, dst: &Tensor, src: &Tensor) -> Result<()> {
    if dst.dims() != src.dims() {
        candle_core::bail!("{name}: shapes {:?} and {:?}", dst.dims(), src.dims());
    }
    Ok(())
}

fn destination<'a>(
    name: &str,
    storage: &'a mut CpuStorage,
    layout: &Layout,
) -> Result<&'a mut [f32]> {
    let CpuStorage::F32(values) = storage else {
        candle_core::bail!("{name} updates f32 tensors");
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("{name} updates contiguous tensors");
    };
    Ok(&mut values[start..end])
}

/// The sum of squares of a tensor's elements, in f64: chunks in parallel, each summed in
/// [`SQUARE_LANES`] interleaved partial sums added in order at the end (independent sums, so
/// the compiler can keep them in vector registers), then the chunks in order.
pub fn sum_of_squares(t: &Tensor) -> Result<f64> {
    with_f32("sum of squares", &t.contiguous()?, |values| {
        let arch = pulp::Arch::new();
        let partials: Vec<f64> = values
            .par_chunks(CHUNK)
            .map(|chunk| arch.dispatch(|| squares_in_lanes(chunk)))
            .collect();
        Ok(partials.iter().sum())
    })
}

/// Partial sums a chunk's squares are spread over.
const SQUARE_LANES: usize = 16;

#[inline(always)]
fn squares_in_lanes(values: &[f32]) -> f64 {
    let mut lanes = [0f64; SQUARE_LANES];
    let (groups, rest) = values.as_chunks::<SQUARE_LANES>();
    for group in groups {
        for (lane, &v) in lanes.iter_mut().zip(group) {
            let v = f64::from(v);
            *lane += v * v;
        }
    }
    for (lane, &v) in lanes.iter_mut().zip(rest) {
        let v = f64::from(v);
        *lane += v * v;
    }
    lanes.iter().sum()
}
