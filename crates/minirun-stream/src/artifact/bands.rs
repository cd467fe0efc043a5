//! Row bands joined: a banded part's packed bands, then its scale bands, made one contiguous
//! matrix, inside its read where the bands allow it, else into a copy.

use minirun_store::AlignedBuf;

use super::part_layout::PartLayout;

/// A banded part's packed ranges, then its scale ranges, out of `read` (its range's bytes),
/// into `out` (exactly their total length).
pub(super) fn join_bands_into(part: &PartLayout, read: &[u8], out: &mut [u8]) {
    let PartLayout::Bands { packed, scales, .. } = part else {
        return;
    };
    let mut at = 0;
    for r in packed.iter().chain(scales) {
        let band = &read[r.start as usize..r.end as usize];
        out[at..at + band.len()].copy_from_slice(band);
        at += band.len();
    }
}

/// A banded part's bytes joined, packed then scales, out of `read` (its range's bytes): inside
/// the read where the part [`PartLayout::joins_in_place`], else into a buffer from `copy`. The
/// joined bytes are the returned buffer's first [`PartLayout::joined_len`].
pub(super) fn join_bands(
    part: &PartLayout,
    mut read: AlignedBuf,
    copy: impl FnOnce(usize) -> AlignedBuf,
) -> AlignedBuf {
    if part.joins_in_place() {
        join_bands_in_place(part, read.as_mut_slice());
        return read;
    }
    let mut joined = copy(part.joined_len());
    join_bands_into(part, read.as_slice(), joined.as_mut_slice());
    joined
}

/// `join_bands_into` inside `buf` (the part's read), for a part that
/// [`PartLayout::joins_in_place`] (checked by [`join_bands`]): the joined bytes start at
/// `buf[0]`.
pub(super) fn join_bands_in_place(part: &PartLayout, buf: &mut [u8]) {
    let PartLayout::Bands { packed, scales, .. } = part else {
        return;
    };
    let set_aside: Vec<u8> = scales
        .iter()
        .flat_map(|r| &buf[r.start as usize..r.end as usize])
        .copied()
        .collect();
    let mut at = 0;
    for r in packed {
        let (start, end) = (r.start as usize, r.end as usize);
        buf.copy_within(start..end, at);
        at += end - start;
    }
    buf[at..at + set_aside.len()].copy_from_slice(&set_aside);
}
