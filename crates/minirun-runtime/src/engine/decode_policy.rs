//! One decode policy for every architecture: what a batch step and a batched prefill check
//! before any cache changes, how prompts are cut into passes of rows, and what a failed pass
//! does to the caches.

use minirun_kernels::KernelError;
use minirun_stream::step::ModelError;

/// Prompt positions run through the layers together: each matrix's bytes are read once for
/// all of them. The activations of a chunk (a few vectors of the widest projection per
/// position) stay well inside the runtime's stated overhead.
pub const PREFILL_CHUNK: usize = 64;

/// What a pass checks of one prompt before any cache changes: the cache is whole, the prompt
/// is not empty, its tokens are in the vocabulary, and it fits the context.
pub(crate) fn check_prompt(
    tokens: &[u32],
    cached: usize,
    broken: bool,
    vocab: usize,
    max_positions: usize,
) -> Result<(), ModelError> {
    if broken {
        return Err(ModelError::BrokenCache);
    }
    if tokens.is_empty() {
        return Err(ModelError::EmptyPrompt);
    }
    if let Some(&token) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ModelError::Token(token, vocab));
    }
    let last = cached + tokens.len() - 1;
    if last >= max_positions {
        return Err(ModelError::Position(last, max_positions));
    }
    Ok(())
}

/// Which logits a pass returns.
#[derive(Debug, Clone)]
pub enum Logits {
    /// Every row's (one per sequence of a batch step).
    Every,
    /// These rows' (the last rows of several prompts), in this order.
    Of(Vec<usize>),
}

impl Logits {
    /// The rows, of a pass of `count`, whose logits are wanted.
    pub fn rows(&self, count: usize) -> Vec<usize> {
        match self {
            Logits::Every => (0..count).collect(),
            Logits::Of(rows) => rows.clone(),
        }
    }
}

/// Several prompts as the rows of passes of at most `chunk` rows, each prompt's positions in
/// order after the `cached` positions of its cache; `pass(tokens, rows, logits)` runs one pass.
/// Returns each prompt's last logits.
pub(crate) fn prefill_rows(
    prompts: &[&[u32]],
    cached: &[usize],
    chunk: usize,
    mut pass: impl FnMut(&[u32], &Rows, Logits) -> Result<Vec<Vec<f32>>, ModelError>,
) -> Result<Vec<Vec<f32>>, ModelError> {
    let flat: Vec<(usize, usize, u32, bool)> = prompts
        .iter()
        .zip(cached)
        .enumerate()
        .flat_map(|(seq, (prompt, &from))| {
            prompt
                .iter()
                .enumerate()
                .map(move |(i, &t)| (seq, from + i, t, i + 1 == prompt.len()))
        })
        .collect();
    let mut last = vec![Vec::new(); prompts.len()];
    for part in flat.chunks(chunk.max(1)) {
        let tokens: Vec<u32> = part.iter().map(|r| r.2).collect();
        let rows = Rows {
            cache: part.iter().map(|r| r.0).collect(),
            position: part.iter().map(|r| r.1).collect(),
        };
        let wanted: Vec<usize> = (0..part.len()).filter(|&r| part[r].3).collect();
        let logits = pass(&tokens, &rows, Logits::Of(wanted.clone()))?;
        for (r, l) in wanted.into_iter().zip(logits) {
            last[part[r].0] = l;
        }
    }
    Ok(last)
}

/// Where each row of a pass goes: its sequence's cache (an index into the pass's caches) and
/// its position there.
pub struct Rows {
    pub cache: Vec<usize>,
    pub position: Vec<usize>,
}

impl Rows {
    /// One row per cache, at its next position (each holding `cached`).
    pub fn one_each(cached: impl IntoIterator<Item = usize>) -> Rows {
        let position: Vec<usize> = cached.into_iter().collect();
        Rows {
            cache: (0..position.len()).collect(),
            position,
        }
    }
}

/// One layer's part of a sequence's cache.
pub trait LayerState {
    /// Back to the first `len` positions, after a failed pass: `false` where the layer's state
    /// cannot be cut back (a recurrent state the pass overwrote).
    fn cut_back(&mut self, len: usize) -> bool;
}

/// A sequence's cache: one state per layer (layer `i` of a pass's row reads and extends its
/// own), the positions it holds, and whether a failed pass left it part-way.
#[derive(Debug, Clone)]
pub struct SequenceCache<L> {
    pub(crate) layers: Vec<L>,
    /// Positions it holds.
    pub len: usize,
    broken: bool,
}

impl<L: LayerState> SequenceCache<L> {
    pub fn new(layers: Vec<L>) -> SequenceCache<L> {
        SequenceCache {
            layers,
            len: 0,
            broken: false,
        }
    }

    /// Whether a failed pass left it part-way (no prefix's state): such a cache is refused.
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// What a failed pass does to it: back to `len` positions where every layer can be cut
    /// back, else marked broken.
    fn rewind(&mut self, len: usize) {
        match !self.broken && self.layers.iter_mut().all(|l| l.cut_back(len)) {
            true => self.len = len,
            false => self.broken = true,
        }
    }
}

/// A batch needs one token (or prompt) per cache, and at least one.
pub(crate) fn check_batch<C>(tokens: usize, caches: &[&mut C]) -> Result<(), ModelError> {
    match (tokens, caches.len()) {
        (0, _) => Err(ModelError::EmptyPrompt),
        (t, c) if t != c => Err(ModelError::BatchShape {
            tokens: t,
            caches: c,
        }),
        _ => Ok(()),
    }
}

/// One token per cache, as one pass: every token and cache checked before any cache changes
/// (one token per cache, in the vocabulary, with room for one more position, no broken cache),
/// then `forward` on one row per cache; if it fails, every cache is rewound.
pub(crate) fn step_each<L: LayerState>(
    tokens: &[u32],
    caches: &mut [&mut SequenceCache<L>],
    (vocab, max_positions): (usize, usize),
    forward: impl FnOnce(&Rows, &mut [&mut SequenceCache<L>]) -> Result<Vec<Vec<f32>>, ModelError>,
) -> Result<Vec<Vec<f32>>, ModelError> {
    check_batch(tokens.len(), caches)?;
    for (token, cache) in tokens.iter().zip(caches.iter()) {
        let one = std::slice::from_ref(token);
        check_prompt(one, cache.len, cache.broken(), vocab, max_positions)?;
    }
    let before: Vec<usize> = caches.iter().map(|c| c.len).collect();
    let rows = Rows::one_each(before.iter().copied());
    let result = forward(&rows, caches);
    if result.is_err() {
        rewind_all(caches, &before);
    }
    result
}

/// Several prompts, in passes of at most `chunk` rows: every prompt and cache checked before
/// any cache changes (one prompt per cache, each non-empty, in the vocabulary, within the
/// context, no broken cache), then `forward` per pass; if one fails, every cache is rewound.
/// Each prompt's last logits.
pub(crate) fn prefill_each<L: LayerState>(
    prompts: &[&[u32]],
    caches: &mut [&mut SequenceCache<L>],
    (vocab, max_positions, chunk): (usize, usize, usize),
    mut forward: impl FnMut(
        &[u32],
        &Rows,
        &mut [&mut SequenceCache<L>],
        Logits,
    ) -> Result<Vec<Vec<f32>>, ModelError>,
) -> Result<Vec<Vec<f32>>, ModelError> {
    if prompts.len() != caches.len() {
        return Err(ModelError::BatchShape {
            tokens: prompts.len(),
            caches: caches.len(),
        });
    }
    for (prompt, cache) in prompts.iter().zip(caches.iter()) {
        check_prompt(prompt, cache.len, cache.broken(), vocab, max_positions)?;
    }
    let before: Vec<usize> = caches.iter().map(|c| c.len).collect();
    let result = prefill_rows(prompts, &before, chunk, |tokens, rows, logits| {
        forward(tokens, rows, caches, logits)
    });
    if result.is_err() {
        rewind_all(caches, &before);
    }
    result
}

fn rewind_all<L: LayerState>(caches: &mut [&mut SequenceCache<L>], before: &[usize]) {
    for (cache, &len) in caches.iter_mut().zip(before) {
        cache.rewind(len);
    }
}

/// The layer a pass is in, and where its rows go.
#[derive(Clone, Copy)]
pub struct Place<'r> {
    pub layer: usize,
    pub rows: &'r Rows,
}

impl Place<'_> {
    /// Row `row`'s state of this layer, in its sequence's cache.
    pub fn layer_cache<'c, L>(
        &self,
        caches: &'c mut [&mut SequenceCache<L>],
        row: usize,
    ) -> Result<&'c mut L, ModelError> {
        let missing = ModelError::Kernel(KernelError::Length {
            what: "cache layers",
            expected: self.layer + 1,
            actual: 0,
        });
        let Some(&seq) = self.rows.cache.get(row) else {
            return Err(missing);
        };
        match caches.get_mut(seq) {
            Some(cache) => cache.layers.get_mut(self.layer).ok_or(missing),
            None => Err(missing),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer that only appends (one entry per position): it can be cut back.
    #[derive(Debug, Clone, PartialEq)]
    struct Appends(Vec<usize>);

    impl LayerState for Appends {
        fn cut_back(&mut self, len: usize) -> bool {
            self.0.truncate(len);
            true
        }
    }

    /// A layer whose state a pass overwrites: it cannot be cut back.
    #[derive(Debug, Clone, PartialEq)]
    struct Recurrent(usize);

    impl LayerState for Recurrent {
        fn cut_back(&mut self, _len: usize) -> bool {
            false
        }
    }

    /// A cache with both kinds of layer (as Kimi K3's KDA and MLA layers).
    #[derive(Debug, Clone, PartialEq)]
    enum Mixed {
        A(Appends),
        R(Recurrent),
    }

    impl LayerState for Mixed {
        fn cut_back(&mut self, len: usize) -> bool {
            match self {
                Mixed::A(a) => a.cut_back(len),
                Mixed::R(r) => r.cut_back(len),
            }
        }
    }

    const LIMITS: (usize, usize) = (10, 8);

    /// A forward pass that extends every row's layer state, advances its cache and then fails.
    fn extend_then_fail<L>(
        rows: &Rows,
        caches: &mut [&mut SequenceCache<L>],
        extend: impl Fn(&mut L, usize),
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        for (r, &seq) in rows.cache.iter().enumerate() {
            for layer in &mut caches[seq].layers {
                extend(layer, rows.position[r]);
            }
            caches[seq].len += 1;
        }
        Err(ModelError::EmptyPrompt)
    }

    #[test]
    fn a_failed_step_cuts_an_appending_cache_back_to_where_it_was() {
        let mut cache = SequenceCache::new(vec![Appends(vec![0, 1]); 2]);
        cache.len = 2;
        let before = cache.layers.clone();
        let failed = step_each(&[3], &mut [&mut cache], LIMITS, |rows, caches| {
            extend_then_fail(rows, caches, |l: &mut Appends, p| l.0.push(p))
        });
        assert!(failed.is_err());
        assert_eq!((cache.len, cache.broken()), (2, false));
        assert_eq!(cache.layers, before);
    }

    #[test]
    fn a_failed_prefill_breaks_a_recurrent_cache_and_it_is_refused_after() {
        let mut cache =
            SequenceCache::new(vec![Mixed::A(Appends(Vec::new())), Mixed::R(Recurrent(0))]);
        let failed = prefill_each(
            &[&[1, 2, 3]],
            &mut [&mut cache],
            (LIMITS.0, LIMITS.1, 2),
            |_, rows, caches, _| {
                extend_then_fail(rows, caches, |l, p| match l {
                    Mixed::A(a) => a.0.push(p),
                    Mixed::R(r) => r.0 += 1,
                })
            },
        );
        assert!(failed.is_err());
        assert!(cache.broken());
        let refused = step_each(&[1], &mut [&mut cache], LIMITS, |_, _| Ok(Vec::new()));
        assert!(
            matches!(refused, Err(ModelError::BrokenCache)),
            "{refused:?}"
        );
    }

    #[test]
    fn a_bad_token_or_a_full_context_is_refused_before_the_pass_runs() {
        let mut cache = SequenceCache::new(vec![Appends(Vec::new())]);
        let never = |_: &Rows, _: &mut [&mut SequenceCache<Appends>]| -> Result<_, ModelError> {
            panic!("the pass ran")
        };
        let bad = step_each(&[10], &mut [&mut cache], LIMITS, never);
        assert!(matches!(bad, Err(ModelError::Token(10, 10))), "{bad:?}");
        cache.len = 8;
        let full = step_each(&[1], &mut [&mut cache], LIMITS, never);
        assert!(matches!(full, Err(ModelError::Position(8, 8))), "{full:?}");
        let shape = step_each(&[1, 2], &mut [&mut cache], LIMITS, never);
        assert!(
            matches!(shape, Err(ModelError::BatchShape { .. })),
            "{shape:?}"
        );
        assert_eq!((cache.len, cache.broken()), (8, false));
    }
}
