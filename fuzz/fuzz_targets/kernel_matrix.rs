//! Any shape, format and byte slices offered to the kernels: `QMatrix::new` accepts only
//! consistent ones, and every accepted matrix multiplies without panicking (NaN codes included).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_properties::kernel_matrix(data));
