//! Rotary position embedding. DeepSeek-V3 rotates interleaved pairs `(x[2i], x[2i+1])`
//! ("traditional" in mlx), optionally with YaRN frequency scaling; Qwen3 and gpt-oss rotate the
//! two halves against each other, `(x[i], x[i + d/2])`, gpt-oss with YaRN, Llama 3.1 with its
//! own frequency rule ([`Llama3Scaling`]). Frequencies are computed in f32 following mlx-lm's
//! `YarnRoPE` and `Llama3RoPE` step by step; angles in f64, rounded once to f32.

use crate::engine::config::Yarn;

/// Llama 3.1's RoPE frequency rule (`rope_scaling.rope_type: "llama3"`): wavelengths longer
/// than the original context over `low_freq_factor` are stretched by `factor`, those shorter
/// than it over `high_freq_factor` kept, and those between interpolated.
#[derive(Debug, Clone, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: f64,
}

pub struct Rope {
    /// Per pair: the wavelength divisor (mlx's `freqs`); angle = position / freq.
    freqs: Vec<f32>,
    /// Which elements pair up.
    halves: bool,
    /// YaRN's magnitude correction applied to the rotated dims (1 without YaRN).
    pub mscale: f32,
}

fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

impl Rope {
    pub fn new(dims: usize, base: f64, yarn: Option<&Yarn>) -> Rope {
        let pairs = dims / 2;
        let extra: Vec<f32> = (0..pairs)
            .map(|i| (base as f32).powf((2 * i) as f32 / dims as f32))
            .collect();
        let Some(y) = yarn else {
            return Rope {
                freqs: extra,
                halves: false,
                mscale: 1.0,
            };
        };
        let correction = |rotations: f64| {
            dims as f64
                * (y.original_max_position_embeddings / (rotations * 2.0 * std::f64::consts::PI))
                    .ln()
                / (2.0 * base.ln())
        };
        let (low, high) = match y.truncate {
            true => (
                correction(y.beta_fast).floor(),
                correction(y.beta_slow).ceil(),
            ),
            false => (correction(y.beta_fast), correction(y.beta_slow)),
        };
        let (low, high) = (low.max(0.0), high.min(dims as f64 - 1.0));
        let (low, high) = (
            low as f32,
            if low == high {
                high as f32 + 0.001
            } else {
                high as f32
            },
        );
        let factor = y.factor as f32;
        let freqs = extra
            .iter()
            .enumerate()
            .map(|(i, &e)| {
                let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                let mask = 1.0 - ramp;
                let inter = factor * e;
                (inter * e) / (inter * mask + e * (1.0 - mask))
            })
            .collect();
        let mscale =
            (yarn_mscale(y.factor, y.mscale) / yarn_mscale(y.factor, y.mscale_all_dim)) as f32;
        Rope {
            freqs,
            halves: false,
            mscale,
        }
    }

    /// RoPE over `dims` whose pairs are `(x[i], x[i + dims/2])` (mlx's non-traditional
    /// rotation, Hugging Face's `rotate_half`), with YaRN where given.
    pub fn halves(dims: usize, base: f64, yarn: Option<&Yarn>) -> Rope {
        Rope {
            halves: true,
            ..Rope::new(dims, base, yarn)
        }
    }

    /// RoPE over the two halves of `dims` with Llama 3.1's frequencies, in f32 step by step as
    /// mlx-lm's `Llama3RoPE` computes them (its comparisons strict, so a wavelength exactly on
    /// an edge is not interpolated).
    pub fn llama3(dims: usize, base: f64, rule: &Llama3Scaling) -> Rope {
        let old = rule.original_max_position_embeddings;
        let low_wavelen = (old / rule.low_freq_factor) as f32;
        let high_wavelen = (old / rule.high_freq_factor) as f32;
        let (factor, low) = (rule.factor as f32, rule.low_freq_factor as f32);
        let spread = (rule.high_freq_factor - rule.low_freq_factor) as f32;
        let two_pi = (2.0 * std::f64::consts::PI) as f32;
        let freqs = Rope::halves(dims, base, None)
            .freqs
            .into_iter()
            .map(|f| {
                let wavelen = two_pi * f;
                if wavelen > low_wavelen {
                    return f * factor;
                }
                if wavelen <= high_wavelen || wavelen >= low_wavelen {
                    return f;
                }
                let smooth = (old as f32 / wavelen - low) / spread;
                f / ((1.0 - smooth) / factor + smooth)
            })
            .collect();
        Rope {
            freqs,
            halves: true,
            mscale: 1.0,
        }
    }

    /// The rotary dims this rotation covers.
    pub fn dims(&self) -> usize {
        2 * self.freqs.len()
    }

    /// Rotates `x` (one head's rotary dims) in place for `position`.
    pub fn apply(&self, x: &mut [f32], position: usize) {
        self.rotate(x, position, 1.0);
    }

    /// Rotates `x` back by `position`'s angle (the sine negated), as V4 undoes the rotation
    /// its values carry on the attention output.
    pub fn apply_inverse(&self, x: &mut [f32], position: usize) {
        self.rotate(x, position, -1.0);
    }

    fn rotate(&self, x: &mut [f32], position: usize, direction: f32) {
        let half = self.freqs.len();
        for (i, &freq) in self.freqs.iter().enumerate() {
            let angle = position as f64 / f64::from(freq);
            let (sin, cos) = (angle.sin() as f32 * direction, angle.cos() as f32);
            let (first, second) = match self.halves {
                true => (i, i + half),
                false => (2 * i, 2 * i + 1),
            };
            if second >= x.len() {
                break;
            }
            let (a, b) = (x[first] * self.mscale, x[second] * self.mscale);
            x[first] = a * cos - b * sin;
            x[second] = a * sin + b * cos;
        }
    }
}

/// The softmax scale of DeepSeek-V3's attention: `q_head_dim^-1/2`, times YaRN's
/// `(0.1 * mscale_all_dim * ln(factor) + 1)^2` when `mscale_all_dim` is set.
pub fn attention_scale(q_head_dim: usize, yarn: Option<&Yarn>) -> f32 {
    let mut scale = (q_head_dim as f64).powf(-0.5);
    if let Some(y) = yarn
        && y.mscale_all_dim != 0.0
        && y.factor > 1.0
    {
        let s = 0.1 * y.mscale_all_dim * y.factor.ln() + 1.0;
        scale *= s * s;
    }
    scale as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// mlx-lm's `Llama3RoPE._freqs` for the Llama fixture's rule (head dim 32, theta 500000,
    /// factor 8, low 1, high 4, original context 128), as the fixture generator recorded them:
    /// two pairs kept, two interpolated, twelve stretched.
    #[test]
    fn llama3_frequencies_are_mlx_lms_bit_for_bit() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/llama/hf-bf16/oracle.json"
        );
        let oracle: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let expected: Vec<f32> = oracle["rope_freqs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let rule = Llama3Scaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 128.0,
        };
        let rope = Rope::llama3(32, 500_000.0, &rule);
        let bits = |f: &[f32]| f.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&rope.freqs), bits(&expected));
        let plain = Rope::halves(32, 500_000.0, None);
        let changed = (0..16).filter(|&i| plain.freqs[i] != rope.freqs[i]).count();
        assert_eq!(
            changed, 14,
            "the rule must change the fixture's frequencies"
        );
    }
}
