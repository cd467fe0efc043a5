//! Any shape, format and byte slices offered to the kernels: `QMatrix::new` accepts only
//! consistent ones, and every accepted matrix multiplies without panicking (NaN codes included).
#![no_main]

use libfuzzer_sys::fuzz_target;
use minirun_kernels::{BlockScale, FloatType, Format, QMatrix};

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let (head, bytes) = data.split_at(6);
    let float = [FloatType::F32, FloatType::F16, FloatType::BF16][usize::from(head[0] % 3)];
    let format = match head[0] % 5 {
        0 => Format::Dense(float),
        1 => Format::Affine { bits: u32::from(head[1] % 9), group: 16 << (head[1] % 4), scale: float },
        2 => Format::Mxfp4,
        3 => Format::Fp8Block { block_rows: usize::from(head[1] % 5), block_cols: 8 * usize::from(head[2] % 4), scale: BlockScale::E8m0 },
        _ => Format::Fp8Block { block_rows: 1 + usize::from(head[1] % 3), block_cols: 8, scale: BlockScale::Float(float) },
    };
    let rows = usize::from(head[3] % 8);
    let cols = 8 * usize::from(head[4] % 40);
    let split = usize::from(head[5]).min(bytes.len());
    let (packed, rest) = bytes.split_at(split);
    let half = rest.len() / 2;
    let (scales, biases) = rest.split_at(half);
    if let Ok(m) = QMatrix::new(format, rows, cols, packed, scales, biases) {
        let x = vec![0.5f32; cols];
        let mut y = vec![0f32; rows];
        m.matvec(&x, &mut y).expect("a consistent matrix multiplies");
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            m.dequantize_row(r, &mut row).expect("every row dequantizes");
        }
    }
});
