//! Random stored matrices for the kernel tests: codes and finite scales of each float type
//! from a small deterministic generator, so that one proptest seed gives a whole matrix.

use minirun_kernels::{FloatType, Format, QMatrix};

/// Bytes for a matrix: random codes, and scales/biases drawn as finite floats of the right type.
pub struct Stored {
    pub format: Format,
    pub rows: usize,
    pub cols: usize,
    pub packed: Vec<u8>,
    pub scales: Vec<u8>,
    pub biases: Vec<u8>,
}

impl Stored {
    pub fn matrix(&self) -> QMatrix<'_> {
        QMatrix::new(
            self.format,
            self.rows,
            self.cols,
            &self.packed,
            &self.scales,
            &self.biases,
        )
        .expect("the generator makes consistent matrices")
    }
}

pub fn float_bytes(t: FloatType, values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&v| match t {
            FloatType::F32 => v.to_le_bytes().to_vec(),
            FloatType::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
            FloatType::BF16 => half::bf16::from_f32(v).to_le_bytes().to_vec(),
        })
        .collect()
}

/// A small deterministic generator, so one proptest seed gives a whole matrix.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn byte(&mut self) -> u8 {
        self.next() as u8
    }
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }
    pub fn floats(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.unit() * scale).collect()
    }
}
