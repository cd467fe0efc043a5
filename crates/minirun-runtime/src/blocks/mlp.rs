//! The gated MLP and its activations.

use std::sync::Arc;

use crate::blocks::norm::{sigmoid, silu};
use crate::blocks::products::{Product, apply_batch, apply_shared};
use crate::blocks::shared_rows::SharedRows;
use minirun_stream::artifact::ArtifactError;
use minirun_stream::experts::{ExpertNames, Projections};
use minirun_stream::matrix::Matrix;
use minirun_stream::step::{ModelError, StepStats};
use minirun_stream::weights::Weights;

/// How a gated MLP combines its gate and up projections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// `silu(gate) * up` (DeepSeek).
    Silu,
    /// SiTU (Kimi K3): `β·tanh(gate/β)·σ(gate) · β_lin·tanh(up/β_lin)`.
    Situ { beta: f32, linear_beta: f32 },
    /// DeepSeek V4's clamped SwiGLU: `silu(min(gate, limit)) * clamp(up, -limit, limit)`.
    ClampedSilu { limit: f32 },
    /// gpt-oss's SwiGLU: `(clamp(up, -limit, limit) + 1) · g·σ(α·g)` with `g = min(gate, limit)`.
    SwigluOai { alpha: f32, limit: f32 },
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
            Activation::SwigluOai { alpha, limit } => {
                let gate = gate.min(limit);
                (up.clamp(-limit, limit) + 1.0) * (gate * sigmoid(alpha * gate))
            }
        }
    }
}

/// One MLP's biases (gpt-oss's experts): added to the gate and up projections before the
/// activation, and to the down projection's output.
#[derive(Debug, Clone, PartialEq)]
pub struct MlpBiases {
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
}

/// A gated MLP over matrices `M`: a routed expert's, held or read for a step
/// (`QMatrix`), or a layer's own ([`Matrix`], held or streamed).
pub struct Mlp<M> {
    pub projections: Projections<M>,
    pub activation: Activation,
    pub biases: Option<Arc<MlpBiases>>,
}

impl<'w> Mlp<Matrix<'w>> {
    /// The gated MLP under `w`'s prefix: `names` are its gate, up and down projections, gate
    /// and up `[inner, hidden]`, down `[hidden, inner]`; no biases.
    pub fn new(
        w: &Weights<'w>,
        names: ExpertNames,
        (hidden, inner): (usize, usize),
        activation: Activation,
    ) -> Result<Mlp<Matrix<'w>>, ArtifactError> {
        let projections = names.build((hidden, inner), |name, rows, cols| {
            w.matrix(name, rows, cols)
        })?;
        Ok(Mlp {
            projections,
            activation,
            biases: None,
        })
    }
}

impl<M: Product> Mlp<M> {
    pub fn forward(
        &self,
        xs: &[Vec<f32>],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let all: Vec<usize> = (0..xs.len()).collect();
        self.forward_on(&SharedRows::new(xs), &all, stats)
    }

    /// The matrix the input meets first (for its int8 grouping).
    pub(crate) fn first(&self) -> &M {
        self.projections.first()
    }

    /// The MLP on rows `which` of a shared input (the gate and up projections read the same
    /// rows, quantized once between them and any other product sharing `input`).
    pub(crate) fn forward_on(
        &self,
        input: &SharedRows,
        which: &[usize],
        stats: &mut StepStats,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let (gates, ups, down) = match &self.projections {
            Projections::Separate { gate, up, down } => (
                apply_shared(gate, input, which, stats)?,
                apply_shared(up, input, which, stats)?,
                down,
            ),
            Projections::Interleaved { gate_up, down } => {
                let (gates, ups) = apply_shared(gate_up, input, which, stats)?
                    .iter()
                    .map(|row| deinterleave(row))
                    .unzip();
                (gates, ups, down)
            }
        };
        let biases = self.biases.as_deref();
        let inner: Vec<Vec<f32>> = gates
            .iter()
            .zip(&ups)
            .map(|(g, u)| {
                g.iter()
                    .zip(u)
                    .enumerate()
                    .map(|(i, (&g, &u))| match biases {
                        Some(b) => self.activation.combine(g + b.gate[i], u + b.up[i]),
                        None => self.activation.combine(g, u),
                    })
                    .collect()
            })
            .collect();
        let mut out = apply_batch(down, &inner, stats)?;
        if let Some(b) = biases {
            for row in &mut out {
                row.iter_mut().zip(&b.down).for_each(|(o, b)| *o += b);
            }
        }
        Ok(out)
    }
}

/// `[g0, u0, g1, u1, ...]` as `([g0, g1, ...], [u0, u1, ...])`.
pub(crate) fn deinterleave(row: &[f32]) -> (Vec<f32>, Vec<f32>) {
    row.chunks_exact(2).map(|pair| (pair[0], pair[1])).unzip()
}
