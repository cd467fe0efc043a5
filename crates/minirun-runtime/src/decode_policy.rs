//! One decode policy for every architecture: what a batch step and a batched prefill check
//! before any cache changes, how prompts are cut into passes of rows, and what a failed pass
//! does to the caches.

use crate::kernels::KernelError;
use crate::step::ModelError;

/// Prompt positions run through the layers together: each matrix's bytes are read once for
/// all of them. The activations of a chunk (a few vectors of the widest projection per
/// position) stay well inside the runtime's stated overhead.
pub const PREFILL_CHUNK: usize = 64;

/// What the prefill of a model whose cache cannot be rewound checks before the cache changes:
/// the cache is whole, the prompt is not empty, its tokens are in the vocabulary, and it fits
/// the context.
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

/// A sequence's cache, kept per layer: layer `i` of a pass's row reads and extends its own
/// entry.
pub trait SequenceCache {
    type Layer;

    fn layers_mut(&mut self) -> &mut [Self::Layer];
    /// Positions it holds.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// One position more: a pass ran a row of this sequence through every layer.
    fn advance(&mut self);
    /// Whether a failed pass left it part-way (no prefix's state): such a cache is refused.
    fn broken(&self) -> bool;
    /// What a failed pass does to it: back to `len` positions where every layer's state can be
    /// cut back (an attention cache that only appends), else marked broken (a recurrent state
    /// a pass overwrote).
    fn rewind(&mut self, len: usize);
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
pub(crate) fn step_each<C: SequenceCache>(
    tokens: &[u32],
    caches: &mut [&mut C],
    (vocab, max_positions): (usize, usize),
    forward: impl FnOnce(&Rows, &mut [&mut C]) -> Result<Vec<Vec<f32>>, ModelError>,
) -> Result<Vec<Vec<f32>>, ModelError> {
    check_batch(tokens.len(), caches)?;
    for (token, cache) in tokens.iter().zip(caches.iter()) {
        let one = std::slice::from_ref(token);
        check_prompt(one, cache.len(), cache.broken(), vocab, max_positions)?;
    }
    let before: Vec<usize> = caches.iter().map(|c| c.len()).collect();
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
pub(crate) fn prefill_each<C: SequenceCache>(
    prompts: &[&[u32]],
    caches: &mut [&mut C],
    (vocab, max_positions, chunk): (usize, usize, usize),
    mut forward: impl FnMut(&[u32], &Rows, &mut [&mut C], Logits) -> Result<Vec<Vec<f32>>, ModelError>,
) -> Result<Vec<Vec<f32>>, ModelError> {
    if prompts.len() != caches.len() {
        return Err(ModelError::BatchShape {
            tokens: prompts.len(),
            caches: caches.len(),
        });
    }
    for (prompt, cache) in prompts.iter().zip(caches.iter()) {
        check_prompt(prompt, cache.len(), cache.broken(), vocab, max_positions)?;
    }
    let before: Vec<usize> = caches.iter().map(|c| c.len()).collect();
    let result = prefill_rows(prompts, &before, chunk, |tokens, rows, logits| {
        forward(tokens, rows, caches, logits)
    });
    if result.is_err() {
        rewind_all(caches, &before);
    }
    result
}

fn rewind_all<C: SequenceCache>(caches: &mut [&mut C], before: &[usize]) {
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
    pub fn layer_cache<'c, C: SequenceCache>(
        &self,
        caches: &'c mut [&mut C],
        row: usize,
    ) -> Result<&'c mut C::Layer, ModelError> {
        let missing = ModelError::Kernel(KernelError::Length {
            what: "cache layers",
            expected: self.layer + 1,
            actual: 0,
        });
        let Some(&seq) = self.rows.cache.get(row) else {
            return Err(missing);
        };
        match caches.get_mut(seq) {
            Some(cache) => cache.layers_mut().get_mut(self.layer).ok_or(missing),
            None => Err(missing),
        }
    }
}
