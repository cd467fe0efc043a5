//! Element-by-element updates written into an existing tensor's buffer (the optimizer's
//! moments and parameters, the EMA teacher): one pass, no new buffer. Each element is updated
//! by one thread from its own inputs, so the bits do not depend on the number of threads.

use candle_core::{CpuStorage, InplaceOp2, InplaceOp3, Layout, Result, Tensor};
use rayon::prelude::*;

use super::contiguous_f32;

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
    dst.inplace_op2(&src.contiguous()?, &With1 { name, update })
}

/// `update(&mut d, a, b)` for every element of `dst`, `a` and `b` (same shapes).
pub fn update_with2(
    name: &'static str,
    dst: &Tensor,
    a: &Tensor,
    b: &Tensor,
    update: impl Fn(&mut f32, f32, f32) + Sync,
) -> Result<()> {
    same_shape(name, dst, a)?;
    same_shape(name, dst, b)?;
    dst.inplace_op3(&a.contiguous()?, &b.contiguous()?, &With2 { name, update })
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

struct With1<F> {
    name: &'static str,
    update: F,
}

impl<F: Fn(&mut f32, f32) + Sync> InplaceOp2 for With1<F> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn cpu_fwd(
        &self,
        ds: &mut CpuStorage,
        dl: &Layout,
        ss: &CpuStorage,
        sl: &Layout,
    ) -> Result<()> {
        let src = contiguous_f32(self.name, ss, sl)?;
        let dst = destination(self.name, ds, dl)?;
        dst.par_chunks_mut(CHUNK)
            .zip(src.par_chunks(CHUNK))
            .for_each(|(dst, src)| {
                for (d, &s) in dst.iter_mut().zip(src) {
                    (self.update)(d, s);
                }
            });
        Ok(())
    }
}

struct With2<F> {
    name: &'static str,
    update: F,
}

impl<F: Fn(&mut f32, f32, f32) + Sync> InplaceOp3 for With2<F> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn cpu_fwd(
        &self,
        ds: &mut CpuStorage,
        dl: &Layout,
        a_s: &CpuStorage,
        al: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> Result<()> {
        let a = contiguous_f32(self.name, a_s, al)?;
        let b = contiguous_f32(self.name, bs, bl)?;
        let dst = destination(self.name, ds, dl)?;
        dst.par_chunks_mut(CHUNK)
            .zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK)))
            .for_each(|(dst, (a, b))| {
                for ((d, &a), &b) in dst.iter_mut().zip(a).zip(b) {
                    (self.update)(d, a, b);
                }
            });
        Ok(())
    }
}

/// The sum of squares of a tensor's elements, in f64: chunks in parallel, then in order.
pub fn sum_of_squares(t: &Tensor) -> Result<f64> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        candle_core::bail!("sum of squares runs on the CPU");
    };
    let values = contiguous_f32("sum of squares", cpu, layout)?;
    let partials: Vec<f64> = values
        .par_chunks(CHUNK)
        .map(|c| c.iter().map(|&v| f64::from(v) * f64::from(v)).sum())
        .collect();
    Ok(partials.iter().sum())
}
