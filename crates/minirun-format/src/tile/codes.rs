//! The numeric codes a container header stores: quantization mode, scale element type,
//! content kind and feature flags.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How the packed elements and their scales encode weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QuantMode {
    /// OCP MX FP4: e2m1 elements, one e8m0 exponent byte per 32 elements, no bias.
    Mxfp4,
    /// MLX affine: `w = scale * q + bias`, one float scale and bias per group.
    Affine,
    /// FP8 e4m3 elements with a 2-D grid of e8m0 block scales.
    #[serde(rename = "fp8-e4m3-block")]
    Fp8E4m3Block,
}

impl QuantMode {
    pub fn code(self) -> u32 {
        match self {
            QuantMode::Mxfp4 => 0,
            QuantMode::Affine => 1,
            QuantMode::Fp8E4m3Block => 2,
        }
    }

    pub fn from_code(code: u32) -> Option<QuantMode> {
        match code {
            0 => Some(QuantMode::Mxfp4),
            1 => Some(QuantMode::Affine),
            2 => Some(QuantMode::Fp8E4m3Block),
            _ => None,
        }
    }

    /// The name used in manifests and messages.
    pub fn name(self) -> &'static str {
        match self {
            QuantMode::Mxfp4 => "mxfp4",
            QuantMode::Affine => "affine",
            QuantMode::Fp8E4m3Block => "fp8-e4m3-block",
        }
    }
}

impl fmt::Display for QuantMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The element type of the scale (and bias) sub-regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScaleDtype {
    /// An unsigned 8-bit power-of-two exponent (OCP MX e8m0).
    #[serde(rename = "uint8-e8m0")]
    E8m0,
    #[serde(rename = "float16")]
    F16,
    #[serde(rename = "bfloat16")]
    Bf16,
    #[serde(rename = "float32")]
    F32,
}

impl ScaleDtype {
    pub fn code(self) -> u32 {
        match self {
            ScaleDtype::E8m0 => 0,
            ScaleDtype::F16 => 1,
            ScaleDtype::Bf16 => 2,
            ScaleDtype::F32 => 3,
        }
    }

    pub fn from_code(code: u32) -> Option<ScaleDtype> {
        match code {
            0 => Some(ScaleDtype::E8m0),
            1 => Some(ScaleDtype::F16),
            2 => Some(ScaleDtype::Bf16),
            3 => Some(ScaleDtype::F32),
            _ => None,
        }
    }

    /// Bytes per scale element.
    pub fn size(self) -> u64 {
        match self {
            ScaleDtype::E8m0 => 1,
            ScaleDtype::F16 | ScaleDtype::Bf16 => 2,
            ScaleDtype::F32 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ScaleDtype::E8m0 => "uint8-e8m0",
            ScaleDtype::F16 => "float16",
            ScaleDtype::Bf16 => "bfloat16",
            ScaleDtype::F32 => "float32",
        }
    }
}

impl fmt::Display for ScaleDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether a container's bytes can be recomputed or only checked against a digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ContentKind {
    /// Generated from a seed by the SplitMix64 content generator (storage benchmarks, tests).
    SyntheticDeterministic,
    /// Bytes taken from an upstream checkpoint.
    CheckpointDerived,
}

impl ContentKind {
    pub fn code(self) -> u32 {
        match self {
            ContentKind::SyntheticDeterministic => 0,
            ContentKind::CheckpointDerived => 1,
        }
    }

    pub fn from_code(code: u32) -> Option<ContentKind> {
        match code {
            0 => Some(ContentKind::SyntheticDeterministic),
            1 => Some(ContentKind::CheckpointDerived),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ContentKind::SyntheticDeterministic => "synthetic-deterministic",
            ContentKind::CheckpointDerived => "checkpoint-derived",
        }
    }
}

impl fmt::Display for ContentKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The feature-flag word (v2+). Every bit outside [`Flags::KNOWN`] is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(transparent)]
pub struct Flags(pub u32);

impl Flags {
    /// A bias sub-region follows the scales in every tile (affine mode).
    pub const BIASES: u32 = 0x1;
    /// The header carries one SHA-256 per tile.
    pub const TILE_DIGESTS: u32 = 0x2;
    /// Scales form a 2-D grid of blocks of rows x group (v3).
    pub const BLOCK_SCALES_2D: u32 = 0x4;
    /// Sub-region payloads are followed by zero padding to the alignment (v3).
    pub const PADDED_SUBREGIONS: u32 = 0x8;
    /// Every bit this build understands.
    pub const KNOWN: u32 = 0xF;

    pub fn has(self, bit: u32) -> bool {
        self.0 & bit != 0
    }

    /// The names of the set bits, for people.
    pub fn names(self) -> Vec<&'static str> {
        [
            (Flags::BIASES, "biases"),
            (Flags::TILE_DIGESTS, "tile-digests"),
            (Flags::BLOCK_SCALES_2D, "block-scales-2d"),
            (Flags::PADDED_SUBREGIONS, "padded-subregions"),
        ]
        .into_iter()
        .filter(|(bit, _)| self.has(*bit))
        .map(|(_, name)| name)
        .collect()
    }
}

impl fmt::Display for Flags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = self.names();
        if names.is_empty() {
            write!(f, "{:#x} (none)", self.0)
        } else {
            write!(f, "{:#x} ({})", self.0, names.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names people read are the names manifests store.
    #[test]
    fn each_code_is_named_and_shown_as_manifests_spell_it() {
        fn spelled(value: impl Serialize) -> String {
            serde_json::to_value(value)
                .unwrap()
                .as_str()
                .unwrap()
                .to_owned()
        }
        let modes = [QuantMode::Mxfp4, QuantMode::Affine, QuantMode::Fp8E4m3Block];
        let names: Vec<_> = modes.iter().map(|m| m.name()).collect();
        assert_eq!(names, ["mxfp4", "affine", "fp8-e4m3-block"]);
        for mode in modes {
            assert_eq!(
                (mode.to_string(), spelled(mode)),
                (mode.name().into(), mode.name().into())
            );
        }
        let dtypes = [
            ScaleDtype::E8m0,
            ScaleDtype::F16,
            ScaleDtype::Bf16,
            ScaleDtype::F32,
        ];
        let names: Vec<_> = dtypes.iter().map(|d| d.name()).collect();
        assert_eq!(names, ["uint8-e8m0", "float16", "bfloat16", "float32"]);
        for dtype in dtypes {
            assert_eq!(
                (dtype.to_string(), spelled(dtype)),
                (dtype.name().into(), dtype.name().into())
            );
        }
        let kinds = [
            ContentKind::SyntheticDeterministic,
            ContentKind::CheckpointDerived,
        ];
        let names: Vec<_> = kinds.iter().map(|k| k.name()).collect();
        assert_eq!(names, ["synthetic-deterministic", "checkpoint-derived"]);
        for kind in kinds {
            assert_eq!(
                (kind.to_string(), spelled(kind)),
                (kind.name().into(), kind.name().into())
            );
        }
    }

    #[test]
    fn flags_are_shown_as_the_word_and_the_names_of_its_bits() {
        assert_eq!(Flags(0).names(), Vec::<&str>::new());
        assert_eq!(Flags(0).to_string(), "0x0 (none)");
        assert_eq!(Flags(0xA).names(), ["tile-digests", "padded-subregions"]);
        assert_eq!(
            Flags(0xF).to_string(),
            "0xf (biases, tile-digests, block-scales-2d, padded-subregions)"
        );
    }
}
