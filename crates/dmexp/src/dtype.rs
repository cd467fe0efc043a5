//! The element types an export may store.

use std::fmt;
use std::str::FromStr;

/// The storage type of every value in one export. Loading always yields f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE 754 binary32, stored verbatim: the export is bit-exact.
    F32,
    /// IEEE 754 binary16: 10 mantissa bits, largest finite 65504, keeps subnormals down to 2^-24.
    F16,
    /// bfloat16: the top 16 bits of an f32, rounded; f32's exponent range with 7 mantissa bits.
    Bf16,
}

impl Dtype {
    /// All dtypes, in the order the CLI lists them.
    pub const ALL: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::Bf16];

    /// Bytes per stored value.
    pub fn size(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
        }
    }

    /// The name written in the header and in file names (`f32`, `f16`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }

    /// The dtype to suggest when a value does not fit this one.
    pub fn wider(self) -> Option<Dtype> {
        match self {
            Dtype::F16 => Some(Dtype::Bf16),
            Dtype::Bf16 => Some(Dtype::F32),
            Dtype::F32 => None,
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A dtype name that is not one of `f32`, `f16`, `bf16` (or their usual spellings).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dtype {0:?}: expected one of f32, f16, bf16")]
pub struct UnknownDtype(pub String);

impl FromStr for Dtype {
    type Err = UnknownDtype;

    /// Accepts the header names and the common spellings, case-insensitively
    /// (`fp32`/`float32`, `fp16`/`float16`/`half`, `bfloat16`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Ok(Dtype::F32),
            "f16" | "fp16" | "float16" | "half" => Ok(Dtype::F16),
            "bf16" | "bfloat16" => Ok(Dtype::Bf16),
            _ => Err(UnknownDtype(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_aliases_are_accepted() {
        for dtype in Dtype::ALL {
            assert_eq!(dtype.name().parse::<Dtype>(), Ok(dtype));
        }
        assert_eq!("BFloat16".parse::<Dtype>(), Ok(Dtype::Bf16));
        assert_eq!("half".parse::<Dtype>(), Ok(Dtype::F16));
        let err = "int8".parse::<Dtype>().unwrap_err();
        assert!(err.to_string().contains("f32, f16, bf16"));
    }
}
