//! A token that proves the CPU has AVX2, FMA and AVX-512 VNNI with 256-bit vectors
//! (`avx512vl`), found at run time, and the one instruction it is for: `vpdpbusd`, four
//! unsigned-by-signed byte products summed into each 32-bit lane. A second token, [`Vnni512`],
//! proves the same with 512-bit vectors and carries the few 512-bit operations the kernels
//! that use it need.
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

use std::arch::x86_64::{
    __m128i, __m256, __m256i, __m512, __m512i, _MM_HINT_T0, _mm_prefetch, _mm256_dpbusd_epi32,
    _mm512_add_epi32, _mm512_add_ps, _mm512_and_si512, _mm512_castps256_ps512,
    _mm512_castsi256_si512, _mm512_castsi512_si256, _mm512_cmpeq_epi32_mask, _mm512_cvtepi32_ps,
    _mm512_cvtepu8_epi32, _mm512_cvtepu16_epi32, _mm512_dpbusd_epi32, _mm512_extracti64x4_epi64,
    _mm512_inserti64x4, _mm512_mask_mov_epi32, _mm512_mask_mov_ps, _mm512_mask_set1_epi32,
    _mm512_mul_ps, _mm512_permutex2var_epi8, _mm512_permutex2var_ps, _mm512_permutexvar_ps,
    _mm512_set1_epi32, _mm512_set1_ps, _mm512_shuffle_f32x4, _mm512_slli_epi32, _mm512_srli_epi16,
    _mm512_srli_epi32, _mm512_srlv_epi32, _mm512_sub_epi32, _mm512_xor_si512,
};

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

/// Proof that [`Vnni`]'s features are there with 512-bit vectors too: AVX-512F and VNNI, whose
/// `vpdpbusd` then takes sixteen lanes at once. pulp wraps no 512-bit operation without a
/// cargo feature that would switch every pulp dispatch in the workspace to 512-bit lanes, so
/// the few operations the sixteen-row kernels need are here, behind this token.
#[derive(Debug, Clone, Copy)]
pub struct Vnni512 {
    vnni: Vnni,
}

/// Safe methods for 512-bit intrinsics: each exists only on a token that proves AVX-512F.
macro_rules! wide_ops {
    ($($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $intrinsic:expr;)*) => {
        $(
            $(#[$doc])*
            #[inline(always)]
            #[allow(unsafe_code)]
            pub fn $name(self, $($arg: $ty),*) -> $ret {
                // SAFETY: `self` exists only where `try_new` found avx512f and avx512vnni.
                unsafe { $intrinsic($($arg),*) }
            }
        )*
    };
}

impl Vnni512 {
    /// The token, where the CPU has every feature it stands for.
    pub fn try_new() -> Option<Vnni512> {
        let vnni = Vnni::try_new()?;
        Some(Vnni512 { vnni })
    }

    /// The 256-bit VNNI token these features include.
    pub fn vnni(self) -> Vnni {
        self.vnni
    }

    wide_ops! {
        /// [`Vnni::dpbusd`] on sixteen 32-bit lanes.
        fn dpbusd(acc: __m512i, unsigned: __m512i, signed: __m512i) -> __m512i = _mm512_dpbusd_epi32;
        /// `value` in every 32-bit lane.
        fn splat_i32(value: i32) -> __m512i = _mm512_set1_epi32;
        /// `value` in every f32 lane.
        fn splat_f32(value: f32) -> __m512 = _mm512_set1_ps;
        /// Lane-wise wrapping 32-bit add.
        fn add_i32(a: __m512i, b: __m512i) -> __m512i = _mm512_add_epi32;
        /// Lane-wise wrapping 32-bit subtract.
        fn sub_i32(a: __m512i, b: __m512i) -> __m512i = _mm512_sub_epi32;
        /// Bitwise and.
        fn and(a: __m512i, b: __m512i) -> __m512i = _mm512_and_si512;
        /// Each 32-bit lane shifted right by four bits, zeros in.
        fn shift_right_4(a: __m512i) -> __m512i = _mm512_srli_epi32::<4>;
        /// Each 32-bit lane converted to the nearest f32 (`vcvtdq2ps`).
        fn i32_to_f32(a: __m512i) -> __m512 = _mm512_cvtepi32_ps;
        /// Lane-wise f32 add, one rounding.
        fn add_f32(a: __m512, b: __m512) -> __m512 = _mm512_add_ps;
        /// Lane-wise f32 multiply, one rounding.
        fn mul_f32(a: __m512, b: __m512) -> __m512 = _mm512_mul_ps;
        /// Each 32-bit lane shifted right by its lane of `counts`, zeros in.
        fn shift_right_var(a: __m512i, counts: __m512i) -> __m512i = _mm512_srlv_epi32;
        /// Each 32-bit lane shifted left by sixteen bits.
        fn shift_left_16(a: __m512i) -> __m512i = _mm512_slli_epi32::<16>;
        /// Each 32-bit lane shifted left by 23 bits.
        fn shift_left_23(a: __m512i) -> __m512i = _mm512_slli_epi32::<23>;
        /// Each 32-bit lane shifted left by 28 bits.
        fn shift_left_28(a: __m512i) -> __m512i = _mm512_slli_epi32::<28>;
        /// Bitwise exclusive or.
        fn xor(a: __m512i, b: __m512i) -> __m512i = _mm512_xor_si512;
        /// Sixteen u16 widened to sixteen 32-bit lanes.
        fn widen_u16(a: __m256i) -> __m512i = _mm512_cvtepu16_epi32;
        /// Sixteen u8 widened to sixteen 32-bit lanes.
        fn widen_u8(a: __m128i) -> __m512i = _mm512_cvtepu8_epi32;
        /// Lane `i` is `table`'s lane given by the low four bits of `index`'s lane `i`.
        fn lookup_f32(index: __m512i, table: __m512) -> __m512 = _mm512_permutexvar_ps;
        /// Lane `i` is lane `index[i] & 15` of `low` (bit 4 of `index[i]` clear) or of `high`
        /// (set).
        fn lookup_two_f32(low: __m512, index: __m512i, high: __m512) -> __m512 = _mm512_permutex2var_ps;
    }

    /// `low` in the eight low 32-bit lanes, `high` in the eight high ones.
    #[inline(always)]
    #[allow(unsafe_code)]
    pub fn splat_two_i32(self, low: i32, high: i32) -> __m512i {
        // SAFETY: `self` exists only where `try_new` found avx512f.
        unsafe { _mm512_mask_set1_epi32(_mm512_set1_epi32(low), 0xFF00, high) }
    }

    /// `low` in the eight low f32 lanes, `high` in the eight high ones.
    #[inline(always)]
    #[allow(unsafe_code)]
    pub fn splat_two_f32(self, low: f32, high: f32) -> __m512 {
        // SAFETY: `self` exists only where `try_new` found avx512f.
        unsafe { _mm512_mask_mov_ps(_mm512_set1_ps(low), 0xFF00, _mm512_set1_ps(high)) }
    }

    /// Lane `i` is `then[i]` where `a[i] == b[i]`, `otherwise[i]` elsewhere (32-bit lanes).
    #[inline(always)]
    #[allow(unsafe_code)]
    pub fn where_equal(self, a: __m512i, b: __m512i, then: __m512i, otherwise: __m512i) -> __m512i {
        // SAFETY: `self` exists only where `try_new` found avx512f.
        unsafe { _mm512_mask_mov_epi32(otherwise, _mm512_cmpeq_epi32_mask(a, b), then) }
    }

    /// The 256 low bits and the 256 high bits.
    #[inline(always)]
    #[allow(unsafe_code)]
    pub fn halves(self, a: __m512i) -> (__m256i, __m256i) {
        // SAFETY: `self` exists only where `try_new` found avx512f.
        unsafe { (_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64::<1>(a)) }
    }

    /// The eight f32 of `a` in both halves.
    #[inline(always)]
    #[allow(unsafe_code)]
    pub fn repeat_f32(self, a: __m256) -> __m512 {
        // SAFETY: `self` exists only where `try_new` found avx512f.
        unsafe {
            let wide = _mm512_castps256_ps512(a);
            _mm512_shuffle_f32x4::<0b01_00_01_00>(wide, wide)
        }
    }

    /// `low` in the 256 low bits, `high` in the 256 high bits.
    #[inline(always)]
    #[allow(unsafe_code)]
    pub fn join(self, low: __m256i, high: __m256i) -> __m512i {
        // SAFETY: `self` exists only where `try_new` found avx512f.
        unsafe { _mm512_inserti64x4::<1>(_mm512_castsi256_si512(low), high) }
    }

    /// Runs `work` compiled for these features: [`Vnni::vectorize`], whose features (AVX-512F
    /// among them) are this token's.
    #[inline(always)]
    pub fn vectorize<R>(self, work: impl FnOnce() -> R) -> R {
        self.vnni.vectorize(work)
    }
}

/// Proof that [`Vnni512`]'s features are there with AVX-512BW and AVX-512 VBMI too, whose
/// byte permute (`vpermt2b`) picks any of 128 bytes into any byte of a 512-bit register: one
/// instruction then places sixteen 4-bit codes of two rows, each in its own 32-bit lane, where
/// [`Vnni512`] alone needs two loads, a permute, a shift and a mask.
#[derive(Debug, Clone, Copy)]
pub struct Vbmi512 {
    wide: Vnni512,
}

impl Vbmi512 {
    /// The token, where the CPU has every feature it stands for.
    pub fn try_new() -> Option<Vbmi512> {
        let wide = Vnni512::try_new()?;
        let vbmi = is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vbmi");
        vbmi.then_some(Vbmi512 { wide })
    }

    /// The [`Vnni512`] token these features include.
    pub fn wide(self) -> Vnni512 {
        self.wide
    }

    /// Byte `i` is byte `index[i] & 63` of `low` (bit 6 of `index[i]` clear) or of `high`
    /// (set) (`vpermt2b`).
    #[inline(always)]
    #[allow(unsafe_code)]
    pub fn pick_bytes(self, low: __m512i, index: __m512i, high: __m512i) -> __m512i {
        // SAFETY: `self` exists only where `try_new` found avx512vbmi (and avx512f).
        unsafe { _mm512_permutex2var_epi8(low, index, high) }
    }

    /// Each 16-bit lane shifted right by four bits, zeros in.
    #[inline(always)]
    #[allow(unsafe_code)]
    pub fn shift_right_4_u16(self, a: __m512i) -> __m512i {
        // SAFETY: `self` exists only where `try_new` found avx512bw.
        unsafe { _mm512_srli_epi16::<4>(a) }
    }

    /// Runs `work` compiled for these features, so that this token's methods and
    /// [`Vnni512`]'s inline into it as single instructions.
    #[inline(always)]
    #[allow(unsafe_code)]
    pub fn vectorize<R>(self, work: impl FnOnce() -> R) -> R {
        #[target_feature(enable = "avx,avx2,fma,avx512f,avx512vl,avx512vnni,avx512bw,avx512vbmi")]
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

    /// Each of the sixteen lanes is its four products' exact sum plus the accumulator.
    #[test]
    fn wide_dpbusd_sums_four_byte_products_per_lane_exactly() {
        let Some(wide) = super::Vnni512::try_new() else {
            eprintln!("NOT EXERCISED: no AVX-512 VNNI with 512-bit vectors on this CPU");
            return;
        };
        let unsigned: [u8; 64] = std::array::from_fn(|k| (k as u8).wrapping_mul(37) | 0x80);
        let signed: [i8; 64] = std::array::from_fn(|k| (k as i8).wrapping_mul(-29));
        let acc: [i32; 16] = std::array::from_fn(|i| i as i32 * 977 - 7000);
        let got: [i32; 16] = wide.vectorize(|| {
            bytemuck::cast(wide.dpbusd(
                bytemuck::cast(acc),
                bytemuck::cast(unsigned),
                bytemuck::cast(signed),
            ))
        });
        for (i, &lane) in got.iter().enumerate() {
            let products: i32 = (4 * i..4 * i + 4)
                .map(|k| i32::from(unsigned[k]) * i32::from(signed[k]))
                .sum();
            assert_eq!(lane, acc[i] + products, "lane {i}");
        }
    }

    /// Each byte comes from the register and position its index names, bit 6 choosing the
    /// register and bit 7 ignored; the 16-bit shift brings in zeros.
    #[test]
    fn vbmi_picks_bytes_from_two_registers_and_shifts_sixteen_bit_lanes() {
        let Some(vbmi) = super::Vbmi512::try_new() else {
            eprintln!("NOT EXERCISED: no AVX-512 VBMI on this CPU");
            return;
        };
        let low: [u8; 64] = std::array::from_fn(|k| k as u8);
        let high: [u8; 64] = std::array::from_fn(|k| 200u8.wrapping_add(k as u8));
        let index: [u8; 64] = std::array::from_fn(|k| (k as u8).wrapping_mul(37) ^ 0x80);
        let picked: [u8; 64] = vbmi.vectorize(|| {
            bytemuck::cast(vbmi.pick_bytes(
                bytemuck::cast(low),
                bytemuck::cast(index),
                bytemuck::cast(high),
            ))
        });
        for (k, &byte) in picked.iter().enumerate() {
            let at = usize::from(index[k] & 63);
            let want = if index[k] & 64 == 0 {
                low[at]
            } else {
                high[at]
            };
            assert_eq!(byte, want, "byte {k}");
        }
        let lanes: [u16; 32] = std::array::from_fn(|k| 0xF00F ^ (k as u16 * 0x0111));
        let shifted: [u16; 32] =
            vbmi.vectorize(|| bytemuck::cast(vbmi.shift_right_4_u16(bytemuck::cast(lanes))));
        assert_eq!(shifted, lanes.map(|lane| lane >> 4));
    }
}
