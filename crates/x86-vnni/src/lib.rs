//! A token that proves the CPU has AVX2, FMA and AVX-512 VNNI with 256-bit vectors
//! (`avx512vl`), found at run time, and the one instruction it is for: `vpdpbusd`, four
//! unsigned-by-signed byte products summed into each 32-bit lane.
//!
//! pulp's tokens (`pulp::x86::V3`) wrap AVX2 safely but no VNNI instruction. This crate does
//! the same for `vpdpbusd`: [`Vnni::try_new`] checks the features once, [`Vnni::vectorize`]
//! runs a closure compiled for them, and [`Vnni::dpbusd`] is safe to call because a token
//! exists only where the instruction does.
//!
//! ```
//! if let Some(vnni) = x86_vnni::Vnni::try_new() {
//!     let sum = vnni.vectorize(|| {
//!         let lanes: [i32; 8] = pulp::bytemuck::cast(vnni.dpbusd(
//!             pulp::bytemuck::cast([0i32; 8]),
//!             pulp::bytemuck::cast([3u8; 32]),
//!             pulp::bytemuck::cast([-2i8; 32]),
//!         ));
//!         lanes.iter().sum::<i32>()
//!     });
//!     assert_eq!(sum, 32 * 3 * -2);
//! }
//! ```

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::{__m256i, _MM_HINT_T0, _mm_prefetch, _mm256_dpbusd_epi32};

/// Proof that AVX2, FMA, AVX-512F, AVX-512VL and AVX-512 VNNI are available.
#[derive(Debug, Clone, Copy)]
pub struct Vnni {
    v3: pulp::x86::V3,
}

impl Vnni {
    /// The token, where the CPU has every feature it stands for.
    pub fn try_new() -> Option<Vnni> {
        let v3 = pulp::x86::V3::try_new()?;
        let vnni = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni");
        vnni.then_some(Vnni { v3 })
    }

    /// The AVX2 token these features include.
    pub fn v3(self) -> pulp::x86::V3 {
        self.v3
    }

    /// `acc + sum of unsigned[4i + k] * signed[4i + k]` over `k` in each 32-bit lane `i`, the
    /// products of unsigned and signed bytes, exactly (no saturation; wraps past i32).
    #[inline(always)]
    #[allow(unsafe_code)]
    pub fn dpbusd(self, acc: __m256i, unsigned: __m256i, signed: __m256i) -> __m256i {
        // SAFETY: `self` exists only where `try_new` found avx512vnni and avx512vl.
        unsafe { _mm256_dpbusd_epi32(acc, unsigned, signed) }
    }

    /// Asks the CPU to bring the cache line holding `bytes[0]` into every cache level ahead of
    /// its use (`prefetcht0`); an empty slice asks for nothing. A hint: it never faults and
    /// changes no result, only when the bytes arrive.
    #[inline(always)]
    #[allow(unsafe_code)]
    pub fn prefetch(self, bytes: &[u8]) {
        if let Some(first) = bytes.first() {
            // SAFETY: `first` is a live reference; `prefetcht0` reads nothing architecturally
            // and cannot fault, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(first).cast::<i8>()) }
        }
    }

    /// Runs `work` compiled for these features, so that `dpbusd` and pulp's AVX2 methods
    /// inline into it as single instructions. `work` should be `#[inline(always)]` code.
    #[inline(always)]
    #[allow(unsafe_code)]
    pub fn vectorize<R>(self, work: impl FnOnce() -> R) -> R {
        #[target_feature(enable = "avx,avx2,fma,avx512f,avx512vl,avx512vnni")]
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
    use super::Vnni;
    use pulp::bytemuck::cast;

    /// Each lane is its four products' exact sum plus the accumulator, at the extremes of
    /// both byte types (a saturating instruction would clip these).
    #[test]
    fn dpbusd_sums_four_byte_products_per_lane_exactly() {
        let Some(vnni) = Vnni::try_new() else {
            eprintln!(
                "NOT EXERCISED: no AVX-512 VNNI on this CPU, so vpdpbusd was not tested here"
            );
            return;
        };
        let unsigned: [u8; 32] =
            std::array::from_fn(|k| if k % 3 == 0 { 255 } else { k as u8 * 7 });
        let signed: [i8; 32] =
            std::array::from_fn(|k| if k % 2 == 0 { -128 } else { 127 - k as i8 });
        let acc: [i32; 8] = std::array::from_fn(|i| i as i32 * 1000 - 3000);
        let got: [i32; 8] =
            vnni.vectorize(|| cast(vnni.dpbusd(cast(acc), cast(unsigned), cast(signed))));
        for (i, &lane) in got.iter().enumerate() {
            let products: i32 = (4 * i..4 * i + 4)
                .map(|k| i32::from(unsigned[k]) * i32::from(signed[k]))
                .sum();
            assert_eq!(lane, acc[i] + products, "lane {i}");
        }
    }
}
