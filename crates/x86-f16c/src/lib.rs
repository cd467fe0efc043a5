//! A token that proves the CPU has AVX2, FMA and F16C, found at run time, and the one
//! instruction it is for: `vcvtph2ps`, eight IEEE half-precision values widened to f32.
//!
//! pulp's AVX2 token (`pulp::x86::V3`) does not include F16C, so code compiled for it cannot
//! use the conversion and decodes f16 with a dozen integer operations instead. This crate does
//! for `vcvtph2ps` what `x86-vnni` does for `vpdpbusd`: [`F16c::try_new`] checks the features
//! once, [`F16c::vectorize`] runs a closure compiled for them, and [`F16c::widen`] is safe to
//! call because a token exists only where the instruction does.
//!
//! ```
//! if let Some(f16c) = x86_f16c::F16c::try_new() {
//!     let halves: [u16; 8] = [0x3C00, 0xC000, 0x0001, 0x7BFF, 0, 0x8000, 0x7C00, 0x3555];
//!     use pulp::bytemuck::cast;
//!     let wide: [f32; 8] = f16c.vectorize(|| cast(f16c.widen(cast(halves))));
//!     assert_eq!(&wide[..4], &[1.0, -2.0, 2f32.powi(-24), 65504.0]);
//! }
//! ```

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::{__m128i, __m256, _MM_HINT_T0, _mm_prefetch, _mm256_cvtph_ps};

/// Proof that pulp's V3 features (AVX2, FMA, BMI and the SSE levels) and F16C are available.
#[derive(Debug, Clone, Copy)]
pub struct F16c {
    v3: pulp::x86::V3,
}

impl F16c {
    /// The token, where the CPU has every feature it stands for.
    pub fn try_new() -> Option<F16c> {
        let v3 = pulp::x86::V3::try_new()?;
        is_x86_feature_detected!("f16c").then_some(F16c { v3 })
    }

    /// The AVX2 token these features include.
    pub fn v3(self) -> pulp::x86::V3 {
        self.v3
    }

    /// The eight little-endian f16 values of `halves` as f32. Every finite value, subnormals
    /// included, and both infinities widen exactly; a NaN stays a NaN with its payload, the
    /// quiet bit set (as any f32 arithmetic on it would set it).
    #[inline(always)]
    #[allow(unsafe_code)]
    pub fn widen(self, halves: __m128i) -> __m256 {
        // SAFETY: `self` exists only where `try_new` found f16c.
        unsafe { _mm256_cvtph_ps(halves) }
    }

    /// Asks the CPU to bring the cache line holding `bytes[0]` into every cache level ahead of
    /// its use (`prefetcht0`, an SSE instruction these features include); an empty slice asks
    /// for nothing. A hint: it never faults and changes no result, only when the bytes arrive.
    #[inline(always)]
    #[allow(unsafe_code)]
    pub fn prefetch(self, bytes: &[u8]) {
        if let Some(first) = bytes.first() {
            // SAFETY: `first` is a live reference; `prefetcht0` reads nothing architecturally
            // and cannot fault, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(first).cast::<i8>()) }
        }
    }

    /// Runs `work` compiled for these features, so that `widen` and pulp's AVX2 methods inline
    /// into it as single instructions. `work` should be `#[inline(always)]` code.
    #[inline(always)]
    #[allow(unsafe_code)]
    pub fn vectorize<R>(self, work: impl FnOnce() -> R) -> R {
        // pulp's V3 features (which `try_new` found through `V3::try_new`) and F16C, so that
        // every V3 method inlines too.
        #[target_feature(
            enable = "sse,sse2,fxsr,sse3,ssse3,sse4.1,sse4.2,popcnt,avx,avx2,bmi1,bmi2,fma,lzcnt,f16c"
        )]
        #[inline]
        fn compiled<R>(work: impl FnOnce() -> R) -> R {
            work()
        }
        // SAFETY: `self` exists only where `try_new` found every enabled feature.
        unsafe { compiled(work) }
    }
}

#[cfg(test)]
mod tests {
    use super::F16c;
    use pulp::bytemuck::cast;

    /// All 65,536 codes against the `half` crate's widening: the same bits for every number,
    /// and for a NaN the same payload with the quiet bit set.
    #[test]
    fn widen_matches_the_half_crate_on_every_code() {
        let Some(f16c) = F16c::try_new() else {
            eprintln!("NOT EXERCISED: no F16C on this CPU, so vcvtph2ps was not tested here");
            return;
        };
        for first in (0..=u16::MAX).step_by(8) {
            let codes: [u16; 8] = std::array::from_fn(|i| first + i as u16);
            let wide: [f32; 8] = f16c.vectorize(|| cast(f16c.widen(cast(codes))));
            for (&code, &got) in codes.iter().zip(&wide) {
                let want = half::f16::from_bits(code).to_f32();
                if want.is_nan() {
                    let quiet = want.to_bits() | 0x0040_0000;
                    assert_eq!(got.to_bits(), quiet, "{code:#06x}");
                } else {
                    assert_eq!(got.to_bits(), want.to_bits(), "{code:#06x}");
                }
            }
        }
    }
}
