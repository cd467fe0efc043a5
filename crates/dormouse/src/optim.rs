//! The optimizers of a run and the gradient clipping they share: AdamW over the model's
//! tensors, and the lazy Adam update of the host-RAM memory rows a batch read.
//!
//! Both use the same hyperparameters and bias correction, so an `--engram-ram` run's memory
//! rows learn exactly as the in-model tables would. Every state kept across steps is plain
//! data that a checkpoint saves and restores bit for bit.

use candle_core::{Result, Tensor, Var, backprop::GradStore};
use rayon::prelude::*;

use crate::fused::in_place::{sum_of_squares, update_four, update_three, update_with};

/// Decay of the first moment.
pub const BETA1: f64 = 0.9;
/// Decay of the second moment.
pub const BETA2: f64 = 0.95;
/// Added to the second moment's root, so a parameter that never had a gradient does not divide
/// by zero.
pub const EPS: f64 = 1e-8;

/// `1 - beta^t`: divides a moment after `t` updates (1-based) so that its zero start does not
/// shrink the early steps.
pub fn bias_correction(beta: f64, update: u64) -> f64 {
    1.0 - beta.powi(update as i32)
}

/// AdamW with decoupled weight decay, whose moments can be saved and restored exactly.
#[derive(Debug, Clone)]
pub struct AdamW {
    pub m: Vec<Tensor>,
    pub v: Vec<Tensor>,
    pub step: u64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
}

impl AdamW {
    pub fn new(vars: &[(String, Var)]) -> Result<Self> {
        let zeros = |v: &Var| Ok(v.as_tensor().zeros_like()?.detach());
        Ok(AdamW {
            m: vars.iter().map(|(_, v)| zeros(v)).collect::<Result<_>>()?,
            v: vars.iter().map(|(_, v)| zeros(v)).collect::<Result<_>>()?,
            step: 0,
            beta1: BETA1,
            beta2: BETA2,
            eps: EPS,
        })
    }

    /// One update with gradients already scaled by `clip_scale`. Norm and bias parameters
    /// (1-D) are not decayed. The moments and the parameters are updated in place, in one pass,
    /// in f32, as
    /// `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g^2`, then
    /// `p = (1 - lr decay) p - lr (m / c1) / (sqrt(v / c2) + eps)` with `c1`, `c2` the bias
    /// corrections (each division by a constant a product with its f32 reciprocal).
    pub fn update(
        &mut self,
        vars: &[(String, Var)],
        grads: &GradStore,
        lr: f64,
        weight_decay: f64,
        clip_scale: f64,
    ) -> Result<()> {
        self.step_all(vars, grads, (lr, weight_decay, clip_scale), None)
    }

    /// [`AdamW::update`] and, in the same pass, an exponential moving average of every
    /// parameter after its update, `ema = decay ema + (1 - decay) p` in f32 (`ema[i]` follows
    /// `vars[i]`; a parameter without a gradient is averaged unchanged).
    pub fn update_with_average(
        &mut self,
        vars: &[(String, Var)],
        grads: &GradStore,
        (lr, weight_decay, clip_scale): (f64, f64, f64),
        ema: &[Tensor],
        decay: f64,
    ) -> Result<()> {
        if ema.len() != vars.len() {
            candle_core::bail!(
                "an average of {} tensors for {} parameters",
                ema.len(),
                vars.len()
            );
        }
        self.step_all(
            vars,
            grads,
            (lr, weight_decay, clip_scale),
            Some((ema, decay)),
        )
    }

    fn step_all(
        &mut self,
        vars: &[(String, Var)],
        grads: &GradStore,
        (lr, weight_decay, clip_scale): (f64, f64, f64),
        ema: Option<(&[Tensor], f64)>,
    ) -> Result<()> {
        self.step += 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let (keep1, take1) = (b1 as f32, (1.0 - b1) as f32);
        let (keep2, take2) = (b2 as f32, (1.0 - b2) as f32);
        let inverse1 = (1.0 / bias_correction(b1, self.step)) as f32;
        let inverse2 = (1.0 / bias_correction(b2, self.step)) as f32;
        let (clip, eps, rate) = (clip_scale as f32, self.eps as f32, lr as f32);
        let adam = move |shrink: f32, p: &mut f32, m: &mut f32, v: &mut f32, g: f32| {
            let g = g * clip + 0.0;
            *m = *m * keep1 + g * take1;
            *v = *v * keep2 + g * g * take2;
            let step = (*m * inverse1) / ((*v * inverse2).sqrt() + eps);
            *p = *p * shrink - step * rate;
        };
        let (averages, decay) = ema.map_or((None, 0.0), |(e, d)| (Some(e), d));
        let (keep, take) = (decay as f32, (1.0 - decay) as f32);
        // The tensors side by side: each is one pass over memory, too short to wake the
        // other threads for on its own.
        let states = vars.par_iter().zip(self.m.par_iter().zip(&self.v));
        states.enumerate().try_for_each(|(i, ((_, var), (m, v)))| {
            let p = var.as_tensor();
            let average = averages.and_then(|e| e.get(i));
            let Some(grad) = grads.get(p) else {
                return match average {
                    Some(e) => update_with("ema", e, p, |e, p| *e = *e * keep + p * take),
                    None => Ok(()),
                };
            };
            let decay = if var.rank() > 1 { weight_decay } else { 0.0 };
            let shrink = (1.0 - lr * decay) as f32;
            match average {
                Some(e) => update_four("adamw", [p, m, v, e], grad, |p, m, v, e, g| {
                    adam(shrink, p, m, v, g);
                    *e = *e * keep + *p * take;
                }),
                None => update_three("adamw", [p, m, v], grad, |p, m, v, g| {
                    adam(shrink, p, m, v, g)
                }),
            }
        })
    }
}

/// One lazy-Adam update of one row (no weight decay: memory rows are looked up, not
/// multiplied, and a row a batch did not read keeps its moments untouched). `grad` is the
/// row's summed gradient before clipping; `corrections` are the bias corrections of this
/// update for [`BETA1`] and [`BETA2`]. The arithmetic is f64, rounded to f32 where stored.
pub fn adam_row(
    param: &mut [f32],
    first: &mut [f32],
    second: &mut [f32],
    grad: &[f32],
    lr: f64,
    clip_scale: f64,
    (correction1, correction2): (f64, f64),
) {
    let moments = first.iter_mut().zip(second.iter_mut());
    for ((p, (m1, m2)), &g) in param.iter_mut().zip(moments).zip(grad) {
        let g = f64::from(g) * clip_scale;
        let m = BETA1 * f64::from(*m1) + (1.0 - BETA1) * g;
        let v = BETA2 * f64::from(*m2) + (1.0 - BETA2) * g * g;
        *m1 = m as f32;
        *m2 = v as f32;
        let step = (m / correction1) / ((v / correction2).sqrt() + EPS);
        *p = (f64::from(*p) - lr * step) as f32;
    }
}

/// The sum of squares of every variable's gradient (its share of the global norm), in f64,
/// the variables' shares added in order.
pub fn grad_norm_squared(vars: &[(String, Var)], grads: &GradStore) -> Result<f64> {
    let shares: Vec<f64> = vars
        .par_iter()
        .map(|(_, var)| match grads.get(var.as_tensor()) {
            Some(g) => sum_of_squares(g),
            None => Ok(0.0),
        })
        .collect::<Result<_>>()?;
    Ok(shares.iter().sum())
}

/// The factor that clips a global gradient norm to `max_norm` (0: no clipping).
pub fn clip_factor(norm: f64, max_norm: f64) -> f64 {
    if max_norm > 0.0 && norm > max_norm {
        max_norm / norm
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_adam_step_moves_each_component_by_lr_against_its_gradient() {
        // After one update m_hat = g and v_hat = g^2, so the step is sign(g) (up to EPS).
        let (mut param, mut first, mut second) = (vec![1.0f32; 3], vec![0.0; 3], vec![0.0; 3]);
        let corrections = (bias_correction(BETA1, 1), bias_correction(BETA2, 1));
        adam_row(
            &mut param,
            &mut first,
            &mut second,
            &[2.0, -0.5, 0.0],
            0.1,
            1.0,
            corrections,
        );
        assert!((param[0] - 0.9).abs() < 1e-6 && (param[1] - 1.1).abs() < 1e-6);
        assert_eq!(param[2], 1.0, "no gradient, no move");
        assert!((first[0] - 0.2).abs() < 1e-7 && (second[0] - 0.2).abs() < 1e-6);
    }

    #[test]
    fn clipping_only_shrinks_norms_above_the_limit() {
        assert_eq!(clip_factor(4.0, 1.0), 0.25);
        assert_eq!(clip_factor(0.5, 1.0), 1.0);
        assert_eq!(clip_factor(4.0, 0.0), 1.0, "0 turns clipping off");
    }
}
