//! The token embedding every architecture starts from: one stored row per token, decoded
//! exactly, its bytes counted in the step's figures.

use minirun_kernels::{KernelError, QMatrix};

use minirun_stream::step::StepStats;

/// Each token's embedding row, in f32 (`embed.cols()` wide). A token past the table is refused
/// by the kernel, not read.
pub(crate) fn embed_tokens(
    embed: &QMatrix,
    tokens: &[u32],
    stats: &mut StepStats,
) -> Result<Vec<Vec<f32>>, KernelError> {
    let row_bytes = (embed.stored_bytes() / embed.rows().max(1)) as u64;
    tokens
        .iter()
        .map(|&token| {
            let mut h = vec![0f32; embed.cols()];
            embed.dequantize_row(token as usize, &mut h)?;
            stats.weight_bytes += row_bytes;
            Ok(h)
        })
        .collect()
}
