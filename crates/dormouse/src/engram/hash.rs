//! The Engram memory's addressing: which table row each position reads.
//!
//! **mulxor-v1.** For order `n` at position `t`, the n-gram is the `n` bytes ending at `t`
//! (inclusive: position `t` predicts byte `t + 1`, so reading bytes up to `t` is causal).
//! Bytes before the start of the context are [`PAD_BYTE`]. The hash, in wrapping u64
//! arithmetic:
//!
//! ```text
//! h = 0x9E3779B97F4A7C15 ^ (n * 0xD6E8FEB86659FD93)
//! for each byte b of the n-gram, oldest first:  h = (h ^ b) * 0x100000001B3
//! h ^= h >> 32
//! row = h % rows
//! ```
//!
//! The order salt keeps the orders' tables decorrelated; the final fold brings the well-mixed
//! high bits into the low bits that `% rows` keeps.

/// The name of the only documented hash.
pub const MULXOR_V1: &str = "mulxor-v1";

/// The byte assumed before the first byte of any context.
pub const PAD_BYTE: u8 = 0x00;

const SEED: u64 = 0x9E37_79B9_7F4A_7C15;
const ORDER_SALT: u64 = 0xD6E8_FEB8_6659_FD93;
const PRIME: u64 = 0x0000_0100_0000_01B3;

/// The mulxor-v1 row of one n-gram (its bytes oldest first; `ngram.len()` is the order).
pub fn mulxor_v1(ngram: &[u8], rows: usize) -> u32 {
    let order = ngram.len() as u64;
    let mut h = SEED ^ order.wrapping_mul(ORDER_SALT);
    for &b in ngram {
        h = (h ^ u64::from(b)).wrapping_mul(PRIME);
    }
    h ^= h >> 32;
    (h % rows.max(1) as u64) as u32
}

/// For every position of `window`, preceded by `history` (the bytes before it, possibly
/// empty: then [`PAD_BYTE`]s), the row each order reads: `rows[order_index][position]`.
pub fn rows_for(history: &[u8], window: &[u8], orders: &[usize], rows: usize) -> Vec<Vec<u32>> {
    let max_order = orders.iter().copied().max().unwrap_or(1);
    let keep = history.len().min(max_order.saturating_sub(1));
    let pad = max_order.saturating_sub(1) - keep;
    let mut context = vec![PAD_BYTE; pad];
    context.extend_from_slice(&history[history.len() - keep..]);
    context.extend_from_slice(window);
    let offset = context.len() - window.len();
    orders
        .iter()
        .map(|&n| {
            (0..window.len())
                .map(|t| {
                    let end = offset + t + 1;
                    mulxor_v1(&context[end - n..end], rows)
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_depend_only_on_the_last_n_bytes() {
        let a = rows_for(b"", b"xxab", &[2], 1 << 20);
        let b = rows_for(b"", b"yyab", &[2], 1 << 20);
        assert_eq!(a[0][3], b[0][3], "same bigram 'ab', same row");
        assert_ne!(a[0][1], b[0][1], "bigrams 'xx' and 'yy' differ");
    }

    #[test]
    fn history_replaces_padding_and_splitting_a_window_changes_nothing() {
        let text = b"the quick brown fox";
        let whole = rows_for(b"", text, &[2, 3], 4096);
        let (head, tail) = text.split_at(7);
        let first = rows_for(b"", head, &[2, 3], 4096);
        let second = rows_for(head, tail, &[2, 3], 4096);
        for order in 0..2 {
            let joined: Vec<u32> = first[order].iter().chain(&second[order]).copied().collect();
            assert_eq!(joined, whole[order]);
        }
        // The first position's trigram is (PAD, PAD, 't').
        assert_eq!(whole[1][0], mulxor_v1(&[PAD_BYTE, PAD_BYTE, b't'], 4096));
    }

    #[test]
    fn pinned_values_of_mulxor_v1() {
        // Computed from the documented formula by hand in Python; a change of hash is a change
        // of format and must come with a new name.
        assert_eq!(mulxor_v1(b"ab", u32::MAX as usize + 1), 0xe786_388b);
        assert_eq!(mulxor_v1(b"abc", 1000), 873);
    }
}
