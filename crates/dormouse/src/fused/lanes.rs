//! Sums and maxima of a row in a fixed order that vectorizes: element `i` goes to running sum
//! `i mod 16`, and the 16 sums are added pairwise (0+8, 1+9, ..., then 0+4, ...). A sum in
//! index order waits for each add before the next; these 16 are independent. The order is
//! the same at every vector width (16 lanes, two 8-lane halves, or scalars), so the bits are.

/// Running sums per reduction.
const LANES: usize = 16;

#[inline(always)]
fn tree(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            acc[i] += acc[i + width];
        }
        width /= 2;
    }
    acc[0]
}

/// `sum of f(i)` over `0..n` in the lane order.
#[inline(always)]
pub fn sum_by(n: usize, f: impl Fn(usize) -> f32) -> f32 {
    let mut acc = [0f32; LANES];
    let whole = n - n % LANES;
    for base in (0..whole).step_by(LANES) {
        for (l, a) in acc.iter_mut().enumerate() {
            *a += f(base + l);
        }
    }
    for (l, a) in acc.iter_mut().enumerate().take(n - whole) {
        *a += f(whole + l);
    }
    tree(acc)
}

/// The sum of `values` in the lane order.
#[inline(always)]
pub fn sum(values: &[f32]) -> f32 {
    sum_by(values.len(), |i| values[i])
}

/// The dot product of `a` and `b` (same lengths) in the lane order.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    sum_by(n, |i| a[i] * b[i])
}

/// The sum of squares of `values` in the lane order.
#[inline(always)]
pub fn sum_of_squares(values: &[f32]) -> f32 {
    sum_by(values.len(), |i| values[i] * values[i])
}

/// The largest of `values` (`-inf` for none); the order does not change a maximum.
#[inline(always)]
pub fn max(values: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    for chunk in values.chunks(LANES) {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a = a.max(v);
        }
    }
    acc.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_follow_the_documented_lane_order() {
        let values: Vec<f32> = (0..37).map(|i| 1.0 + i as f32 * 1e-7).collect();
        let mut lanes = [0f32; LANES];
        for (i, v) in values.iter().enumerate() {
            lanes[i % LANES] += v;
        }
        assert_eq!(sum(&values).to_bits(), tree(lanes).to_bits());
        assert_eq!(sum(&[]), 0.0);
        assert_eq!(dot(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]), 32.0);
        assert_eq!(sum_of_squares(&[3.0, 4.0]), 25.0);
        assert_eq!(max(&[-3.0, 7.5, 2.0]), 7.5);
        assert_eq!(max(&[]), f32::NEG_INFINITY);
    }
}
