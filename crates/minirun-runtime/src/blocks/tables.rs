//! The tables outside the layers as the model computes with them: the token embedding (one
//! stored row per token, decoded exactly) and the output head (every row, for each wanted
//! row's logits), held or read by rows from storage as the plan says, with the same bits
//! either way; their bytes counted in the step's figures.

use minirun_kernels::QMatrix;

use crate::blocks::products::apply_batch;
use minirun_stream::artifact::ArtifactError;
use minirun_stream::step::{ModelError, StepStats};
use minirun_stream::tables::Table;

/// Each token's embedding row, in f32 (`embed.cols()` wide). A token past the table is refused
/// before a byte is read.
pub(crate) fn embed_tokens(
    embed: &Table,
    tokens: &[u32],
    stats: &mut StepStats,
) -> Result<Vec<Vec<f32>>, ModelError> {
    tokens
        .iter()
        .map(|&token| {
            let row = token as usize;
            if row >= embed.rows() {
                return Err(ModelError::Token(token, embed.rows()));
            }
            let mut h = vec![0f32; embed.cols()];
            match embed {
                Table::Held(m) => decode_row(m, row, &mut h, stats)?,
                Table::Stored(t) => {
                    let read = t.read_row(row, stats)?;
                    decode_row(&read.matrix()?, 0, &mut h, stats)?;
                }
                Table::Recorded { .. } => return Err(recorded()),
            }
            Ok(h)
        })
        .collect()
}

fn decode_row(
    m: &QMatrix,
    row: usize,
    out: &mut [f32],
    stats: &mut StepStats,
) -> Result<(), ModelError> {
    m.dequantize_row(row, out)?;
    stats.weight_bytes += (m.stored_bytes() / m.rows().max(1)) as u64;
    Ok(())
}

/// `head x` for every `x` of `xs`: a stored head a tile of rows at a time, each tile's logits
/// written at its rows, so every logit has the bits the held head gives it.
pub(crate) fn head_logits(
    head: &Table,
    xs: &[Vec<f32>],
    stats: &mut StepStats,
) -> Result<Vec<Vec<f32>>, ModelError> {
    match head {
        Table::Held(m) => Ok(apply_batch(m, xs, stats)?),
        Table::Stored(t) => {
            let mut out = vec![vec![0f32; head.rows()]; xs.len()];
            t.each_tile(stats, |tile, stats| -> Result<(), ModelError> {
                let rows = tile.rows();
                let part = apply_batch(&tile.matrix()?, xs, stats)?;
                for (logits, part) in out.iter_mut().zip(part) {
                    logits[rows.clone()].copy_from_slice(&part);
                }
                Ok(())
            })?;
            Ok(out)
        }
        Table::Recorded { .. } => Err(recorded()),
    }
}

fn recorded() -> ModelError {
    ModelError::Artifact(ArtifactError::Tensor {
        name: "a table".into(),
        reason: "was recorded by a dry build, which computes nothing".into(),
    })
}
