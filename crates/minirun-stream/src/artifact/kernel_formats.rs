//! The kernels' format of a stored tensor: its manifest's quantization, or its float dtype, as
//! a [`minirun_kernels::Format`] the kernels compute from, refused where no kernel does.

use minirun_format::artifact::Quantization;
use minirun_format::tile::{QuantMode, ScaleDtype};
use minirun_kernels::{BlockScale, FloatType, Format};

use super::{ArtifactError, tensor_err};

pub(super) fn quantized_format(name: &str, q: &Quantization) -> Result<Format, ArtifactError> {
    let scale = scale_float(q.scale_dtype);
    let parameters_ok = match q.layout {
        QuantMode::Affine => matches!(q.element_bits, 4 | 8) && matches!(q.group, 32 | 64 | 128),
        QuantMode::Mxfp4 => q.element_bits == 4,
        QuantMode::Fp8E4m3Block => {
            q.element_bits == 8 && q.block_rows > 0 && q.group > 0 && q.group.is_multiple_of(8)
        }
    };
    if !parameters_ok {
        return Err(tensor_err(
            name,
            format!(
                "{} with {} bits, group {} and block rows {} is not implemented",
                q.layout, q.element_bits, q.group, q.block_rows
            ),
        ));
    }
    match (q.layout, scale) {
        (QuantMode::Affine, Some(scale)) => Ok(Format::Affine {
            bits: q.element_bits,
            group: q.group as usize,
            scale,
        }),
        (QuantMode::Mxfp4, None) if q.group == 32 => Ok(Format::Mxfp4),
        (QuantMode::Fp8E4m3Block, scale) => Ok(Format::Fp8Block {
            block_rows: q.block_rows as usize,
            block_cols: q.group as usize,
            scale: scale.map_or(BlockScale::E8m0, BlockScale::Float),
        }),
        (layout, _) => Err(tensor_err(
            name,
            format!("{layout} with {} scales is not implemented", q.scale_dtype),
        )),
    }
}

pub(super) fn float_type(dtype: &str) -> Option<FloatType> {
    match dtype {
        "F32" => Some(FloatType::F32),
        "F16" => Some(FloatType::F16),
        "BF16" => Some(FloatType::BF16),
        _ => None,
    }
}

pub(super) fn scale_float(dtype: ScaleDtype) -> Option<FloatType> {
    match dtype {
        ScaleDtype::F16 => Some(FloatType::F16),
        ScaleDtype::Bf16 => Some(FloatType::BF16),
        ScaleDtype::F32 => Some(FloatType::F32),
        ScaleDtype::E8m0 => None,
    }
}
