//! The gated MLP and its activations.

use crate::artifact::ArtifactError;
use crate::blocks::norm::{sigmoid, silu};
use crate::blocks::products::{apply_batch, apply_shared};
use crate::blocks::shared_rows::SharedRows;
use crate::step::StepStats;
use crate::weights::Weights;
use minirun_kernels::{KernelError, QMatrix};

/// How a gated MLP combines its gate and up projections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// `silu(gate) * up` (DeepSeek).
    Silu,
    /// SiTU (Kimi K3): `β·tanh(gate/β)·σ(gate) · β_lin·tanh(up/β_lin)`.
    Situ { beta: f32, linear_beta: f32 },
    /// DeepSeek V4's clamped SwiGLU: `silu(min(gate, limit)) * clamp(up, -limit, limit)`.
    ClampedSilu { limit: f32 },
}

impl Activation {
    fn combine(self, gate: f32, up: f32) -> f32 {
        match self {
            Activation::Silu => silu(gate) * up,
            Activation::Situ { beta, linear_beta } => {
                let a = beta * (gate / beta).tanh() * sigmoid(gate);
                a * (linear_beta * (up / linear_beta).tanh())
            }
            Activation::ClampedSilu { limit } => silu(gate.min(limit)) * up.clamp(-limit, limit),
        }
    }
}

pub struct Mlp<'a> {
    pub gate: QMatrix<'a>,
    pub up: QMatrix<'a>,
    pub down: QMatrix<'a>,
    pub activation: Activation,
}

impl<'w> Mlp<'w> {
    /// The gated MLP under `w`'s prefix: `names` are its gate, up and down projections, gate
    /// and up `[inner, hidden]`, down `[hidden, inner]`.
    pub fn new(
        w: &Weights<'w>,
        [gate, up, down]: [&str; 3],
        (hidden, inner): (usize, usize),
        activation: Activation,
    ) -> Result<Mlp<'w>, ArtifactError> {
        Ok(Mlp {
            gate: w.matrix(gate, inner, hidden)?,
            up: w.matrix(up, inner, hidden)?,
            down: w.matrix(down, hidden, inner)?,
            activation,
        })
    }
}

impl Mlp<'_> {
    pub fn forward(
        &self,
        xs: &[Vec<f32>],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, KernelError> {
        let all: Vec<usize> = (0..xs.len()).collect();
        self.forward_on(&SharedRows::new(xs), &all, stats)
    }

    /// The MLP on rows `which` of a shared input (the gate and up projections read the same
    /// rows, quantized once between them and any other product sharing `input`).
    pub(crate) fn forward_on(
        &self,
        input: &SharedRows,
        which: &[usize],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, KernelError> {
        let gate = apply_shared(&self.gate, input, which, stats)?;
        let up = apply_shared(&self.up, input, which, stats)?;
        let inner: Vec<Vec<f32>> = gate
            .iter()
            .zip(&up)
            .map(|(g, u)| {
                g.iter()
                    .zip(u)
                    .map(|(&g, &u)| self.activation.combine(g, u))
                    .collect()
            })
            .collect();
        apply_batch(&self.down, &inner, stats)
    }
}
