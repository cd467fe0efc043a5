//! Routed experts streamed from storage: where each expert's matrices are stored, a cache
//! of loaded experts bounded in bytes (least recently used out first), and the reads: one read
//! per tile into a 16 KiB-aligned buffer, a set of experts read at once by threads that take
//! their tiles from one queue (`TileReads`; what a layer fetches with them is
//! [`crate::fetched_experts`]). The bytes a streamed expert computes from are the stored bytes,
//! exactly what a resident run computes from, so its output has the same bits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use crate::artifact::{Artifact, ArtifactError, LoadedPart, MatrixPart, StackLayout};

/// A gated MLP's projections: gate and up, each its own matrix or one matrix whose rows
/// interleave them (gpt-oss: gate row `i` at row `2i`, up row `i` at `2i + 1`), then down. The
/// same shape holds where an expert is stored ([`ExpertParts`]), its bytes once read
/// ([`LoadedExpert`]) and the matrices computed from ([`crate::blocks::mlp::Mlp`]).
#[derive(Debug, Clone)]
pub enum Projections<T> {
    Separate { gate: T, up: T, down: T },
    Interleaved { gate_up: T, down: T },
}

impl<T> Projections<T> {
    /// Its matrices in storage order: gate, up, down (or gate-up, down).
    pub fn parts(&self) -> Vec<&T> {
        match self {
            Projections::Separate { gate, up, down } => vec![gate, up, down],
            Projections::Interleaved { gate_up, down } => vec![gate_up, down],
        }
    }

    /// The matrix the input meets first (gate, or gate-up).
    pub fn first(&self) -> &T {
        match self {
            Projections::Separate { gate, .. } => gate,
            Projections::Interleaved { gate_up, .. } => gate_up,
        }
    }

    /// The same shape over `f` of each matrix.
    pub fn try_map<U, E>(
        &self,
        mut f: impl FnMut(&T) -> Result<U, E>,
    ) -> Result<Projections<U>, E> {
        Ok(match self {
            Projections::Separate { gate, up, down } => Projections::Separate {
                gate: f(gate)?,
                up: f(up)?,
                down: f(down)?,
            },
            Projections::Interleaved { gate_up, down } => Projections::Interleaved {
                gate_up: f(gate_up)?,
                down: f(down)?,
            },
        })
    }

    /// The same shape over `parts` (as many as [`Self::parts`], in its order); `None` when
    /// their number differs.
    pub fn with_parts<U>(&self, parts: Vec<U>) -> Option<Projections<U>> {
        let mut parts = parts.into_iter();
        let shaped = match self {
            Projections::Separate { .. } => Projections::Separate {
                gate: parts.next()?,
                up: parts.next()?,
                down: parts.next()?,
            },
            Projections::Interleaved { .. } => Projections::Interleaved {
                gate_up: parts.next()?,
                down: parts.next()?,
            },
        };
        parts.next().is_none().then_some(shaped)
    }
}

/// Where one routed expert's projections are stored.
pub type ExpertParts = Projections<MatrixPart>;

impl ExpertParts {
    /// Bytes one load of this expert reads from storage.
    pub fn read_bytes(&self) -> u64 {
        self.parts().iter().map(|p| p.part.read_bytes()).sum()
    }

    /// Bytes loading this expert takes at once (each read's buffer is aligned, which may cost
    /// up to one alignment unit more; a banded part's read and its joined copy together).
    pub fn allocated_bytes(&self) -> u64 {
        self.parts().iter().map(|p| p.part.allocated_bytes()).sum()
    }

    /// Bytes a loaded copy of this expert keeps once loaded: what a cache of it holds.
    pub fn held_bytes(&self) -> u64 {
        self.parts().iter().map(|p| p.part.held_bytes()).sum()
    }

    /// The lengths of the buffers a loaded copy of this expert keeps, its parts in order.
    pub fn held_lengths(&self) -> Vec<usize> {
        self.parts()
            .iter()
            .flat_map(|p| p.part.held_lengths())
            .collect()
    }
}

/// How an architecture names its routed experts' projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertNames {
    /// Gate, up and down, each its own matrix.
    Separate([&'static str; 3]),
    /// One matrix of gate and up rows interleaved, and down (gpt-oss's own layout).
    Interleaved {
        gate_up: &'static str,
        down: &'static str,
    },
}

/// A gated MLP's gate, up and down projections as Hugging Face's DeepSeek-V3 and MLX's stacks
/// name them.
pub const STACKED: ExpertNames = ExpertNames::Separate(STACKED_NAMES);

const STACKED_NAMES: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// A gated MLP's gate, up and down projections as DeepSeek's own checkpoints (V4, and Kimi K3's
/// upstream) name them.
pub const W1_W3_W2: ExpertNames = ExpertNames::Separate(["w1", "w3", "w2"]);

/// gpt-oss's experts as OpenAI publishes them: `gate_up_proj` (rows interleaved) and `down_proj`.
pub const GATE_UP_DOWN: ExpertNames = ExpertNames::Interleaved {
    gate_up: "gate_up_proj",
    down: "down_proj",
};

impl ExpertNames {
    /// The projections, each `make(name, rows, cols)`, for `hidden` and `inner` wide layers:
    /// gate and up `[inner, hidden]` (gate-up `[2 inner, hidden]`), down `[hidden, inner]`.
    pub fn build<T, E>(
        self,
        (hidden, inner): (usize, usize),
        mut make: impl FnMut(&'static str, usize, usize) -> Result<T, E>,
    ) -> Result<Projections<T>, E> {
        Ok(match self {
            ExpertNames::Separate([gate, up, down]) => Projections::Separate {
                gate: make(gate, inner, hidden)?,
                up: make(up, inner, hidden)?,
                down: make(down, hidden, inner)?,
            },
            ExpertNames::Interleaved { gate_up, down } => Projections::Interleaved {
                gate_up: make(gate_up, 2 * inner, hidden)?,
                down: make(down, hidden, inner)?,
            },
        })
    }

    /// The name of the projection the input meets first (gate, or gate-up).
    fn first(self) -> &'static str {
        match self {
            ExpertNames::Separate([gate, ..]) => gate,
            ExpertNames::Interleaved { gate_up, .. } => gate_up,
        }
    }
}

/// The `n` routed experts under `prefix` (a layer's `mlp`), in expert order, without reading
/// them, from the first of these layouts the artifact has: MLX's stacked `switch_mlp`
/// containers (always named gate/up/down_proj); stacks under `{prefix}.experts` named by
/// `names` (gpt-oss, in OpenAI's layout and in MLX's); or Hugging Face's per-expert tensors
/// `{prefix}.experts.E.{names}`.
pub fn routed_experts(
    artifact: &Artifact,
    prefix: &str,
    (hidden, inner, n): (usize, usize, usize),
    names: ExpertNames,
) -> Result<Vec<ExpertParts>, ArtifactError> {
    let switch_mlp = format!("{prefix}.switch_mlp");
    let experts = format!("{prefix}.experts");
    let stacked_in = |at: &str, names: ExpertNames| {
        let stacks = names.build((hidden, inner), |name, rows, cols| {
            stacked(artifact, &format!("{at}.{name}"), rows, cols, n)
        })?;
        (0..n)
            .map(|e| stacks.try_map(|stack| Ok(stack[e].clone())))
            .collect()
    };
    if matches!(names, ExpertNames::Separate(_))
        && artifact.has(&format!("{switch_mlp}.gate_proj.weight"))
    {
        return stacked_in(&switch_mlp, STACKED);
    }
    if artifact.has_matrix(&format!("{experts}.{}", names.first())) {
        return stacked_in(&experts, names);
    }
    (0..n)
        .map(|e| {
            names.build((hidden, inner), |name, rows, cols| {
                single(artifact.stack_layout(&format!("{experts}.{e}.{name}"), rows, cols)?)
            })
        })
        .collect()
}

/// The stack `name` of `n` matrices `[rows, cols]`.
fn stacked(
    artifact: &Artifact,
    name: &str,
    rows: usize,
    cols: usize,
    n: usize,
) -> Result<Vec<MatrixPart>, ArtifactError> {
    let s = artifact.stack_layout(name, rows, cols)?;
    if s.parts.len() != n {
        return Err(ArtifactError::Tensor {
            name: s.name,
            reason: format!("stacks {} experts; the config has {n}", s.parts.len()),
        });
    }
    Ok(s.matrix_parts())
}

/// The one matrix of a stack of one.
fn single(layout: StackLayout) -> Result<MatrixPart, ArtifactError> {
    match (layout.parts.len(), layout.matrix_part(0)) {
        (1, Some(part)) => Ok(part),
        (n, _) => Err(ArtifactError::Tensor {
            name: layout.name,
            reason: format!("is a stack of {n} matrices where the model needs one"),
        }),
    }
}

/// One expert's matrices, read.
pub type LoadedExpert = Projections<LoadedPart>;

impl LoadedExpert {
    pub fn allocated(&self) -> u64 {
        self.parts().iter().map(|p| p.allocated() as u64).sum()
    }

    fn read_kinds(&self) -> (u64, u64) {
        self.parts()
            .iter()
            .map(|p| p.read_kinds())
            .fold((0, 0), |(d, b), (dd, bb)| (d + dd, b + bb))
    }
}

/// What fetching one expert cost.
#[derive(Debug, Default, Clone, Copy)]
pub struct Fetch {
    pub hit: bool,
    /// Read ahead on a guess of the router's choice, before the router chose it.
    pub guessed: bool,
    pub read_bytes: u64,
    pub direct_reads: u64,
    pub buffered_reads: u64,
}

impl Fetch {
    pub fn cached() -> Fetch {
        Fetch {
            hit: true,
            ..Fetch::default()
        }
    }

    /// `expert`, stored as `parts`, read from storage.
    pub fn read(parts: &ExpertParts, expert: &LoadedExpert, guessed: bool) -> Fetch {
        let (direct, buffered) = expert.read_kinds();
        Fetch {
            hit: false,
            guessed,
            read_bytes: parts.read_bytes(),
            direct_reads: direct,
            buffered_reads: buffered,
        }
    }
}

struct Entry {
    expert: Arc<LoadedExpert>,
    last_use: u64,
}

#[derive(Default)]
struct CacheState {
    entries: HashMap<(usize, usize), Entry>,
    used: u64,
    /// Bytes held per layer.
    layer_used: HashMap<usize, u64>,
    clock: u64,
    /// Bytes of experts loaded for the layer in progress that the cache does not hold.
    in_flight: u64,
    peak: u64,
}

/// Loaded experts, at most `capacity` bytes of them, shared equally between the streamed MoE
/// layers, each layer's least recently used evicted first. One pool across layers would be
/// emptied by every token: a token visits the layers in order, so with less room than one
/// token's experts, plain LRU evicts each layer's experts just before the next token needs them.
pub struct ExpertCache {
    per_layer: u64,
    state: Mutex<CacheState>,
}

impl ExpertCache {
    /// A cache of `capacity` bytes shared by `streamed_layers` layers.
    pub fn new(capacity: u64, streamed_layers: usize) -> ExpertCache {
        ExpertCache {
            per_layer: capacity / streamed_layers.max(1) as u64,
            state: Mutex::new(CacheState::default()),
        }
    }

    /// Makes the buffers this cache will hold before the first token, at most `limit` bytes of
    /// them: for each streamed layer (`None` in `map` for one that holds its experts) as many
    /// copies of its first expert's buffers as its share of the cache holds, every page
    /// written. The first reads then take memory already found instead of faulting it in, page
    /// by page, while a token waits. Returns the bytes made.
    pub fn prepare(
        &self,
        artifact: &Artifact,
        map: &[Option<Vec<ExpertParts>>],
        limit: u64,
    ) -> u64 {
        let mut made = 0;
        for expert in map.iter().flatten().filter_map(|experts| experts.first()) {
            let size = expert.held_bytes().max(1);
            let sets = (self.per_layer / size).min(limit.saturating_sub(made) / size);
            made += artifact.prepare_read_buffers(&expert.held_lengths(), sets as usize);
        }
        made
    }

    /// Bytes of experts held now, and the most ever held at once (cache and in-flight loads).
    pub fn usage(&self) -> (u64, u64) {
        self.state
            .lock()
            .map(|s| (s.used, s.peak))
            .unwrap_or((0, 0))
    }

    /// Whether expert `key` (layer, expert) is held, without counting it as a use.
    pub fn holds(&self, key: (usize, usize)) -> bool {
        self.state
            .lock()
            .map(|s| s.entries.contains_key(&key))
            .unwrap_or(false)
    }

    pub fn get(&self, key: (usize, usize)) -> Option<Arc<LoadedExpert>> {
        let mut s = self.state.lock().ok()?;
        s.clock += 1;
        let clock = s.clock;
        let entry = s.entries.get_mut(&key)?;
        entry.last_use = clock;
        Some(Arc::clone(&entry.expert))
    }

    /// Keeps `expert` if it fits, evicting the least recently used first; otherwise counts it
    /// as in flight until [`Self::keep_in_order`] ends.
    fn insert(&self, key: (usize, usize), expert: &Arc<LoadedExpert>) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        let size = expert.allocated();
        let layer = key.0;
        if size > self.per_layer {
            s.in_flight += size;
        } else {
            while s.layer_used.get(&layer).copied().unwrap_or(0) + size > self.per_layer {
                let Some(oldest) = s
                    .entries
                    .iter()
                    .filter(|(k, _)| k.0 == layer)
                    .min_by_key(|(_, e)| e.last_use)
                    .map(|(k, _)| *k)
                else {
                    break;
                };
                if let Some(old) = s.entries.remove(&oldest) {
                    let freed = old.expert.allocated();
                    s.used -= freed;
                    *s.layer_used.entry(layer).or_default() -= freed;
                }
            }
            s.clock += 1;
            let last_use = s.clock;
            s.used += size;
            *s.layer_used.entry(layer).or_default() += size;
            s.entries.insert(
                key,
                Entry {
                    expert: Arc::clone(expert),
                    last_use,
                },
            );
        }
        s.peak = s.peak.max(s.used + s.in_flight);
    }

    /// Which of the experts about to be read for `layer` (in the router's order, with the bytes
    /// each will hold at most) the cache keeps once they are in, the last chosen being the most
    /// recently used: decided before the reads, so that the others can give their buffers back
    /// as soon as they have computed, and the next read reuses a buffer still warm from the last.
    pub fn will_keep(&self, layer: usize, misses: &[(usize, u64)]) -> Vec<bool> {
        let Ok(s) = self.state.lock() else {
            return vec![false; misses.len()];
        };
        let mut held: Vec<(Option<usize>, u64, u64)> = s
            .entries
            .iter()
            .filter(|(k, _)| k.0 == layer)
            .map(|(_, e)| (None, e.last_use, e.expert.allocated()))
            .collect();
        let mut used: u64 = held.iter().map(|h| h.2).sum();
        for (i, &(_, size)) in misses.iter().enumerate() {
            if size > self.per_layer {
                continue;
            }
            while used + size > self.per_layer {
                let Some(oldest) = (0..held.len()).min_by_key(|&j| held[j].1) else {
                    break;
                };
                used -= held.swap_remove(oldest).2;
            }
            used += size;
            held.push((Some(i), s.clock + 1 + i as u64, size));
        }
        let mut keep = vec![false; misses.len()];
        for (i, _, _) in held {
            if let Some(i) = i {
                keep[i] = true;
            }
        }
        keep
    }

    /// Keeps the experts just read for `layer` that [`Self::will_keep`] chose, in the router's
    /// order. The peak counts every expert read for the layer as held at once (an upper bound:
    /// the ones not kept may already have given their buffers back); nothing is in flight
    /// afterwards.
    pub fn keep_in_order(&self, layer: usize, read: u64, kept: &[(usize, Arc<LoadedExpert>)]) {
        if let Ok(mut s) = self.state.lock() {
            s.peak = s.peak.max(s.used + read);
        }
        for (e, expert) in kept {
            self.insert((layer, *e), expert);
        }
        if let Ok(mut s) = self.state.lock() {
            s.in_flight = 0;
        }
    }
}

/// One read expert: its position among the chosen, or the first read of it that failed.
pub type ReadExpert = (usize, Result<(Arc<LoadedExpert>, Fetch), ArtifactError>);

/// The tiles of the experts to read, one per projection of each expert (gate, up, down or
/// gate-up, down) in the given order, handed out one at a time to whichever reader asks next.
pub struct TileReads<'a> {
    artifact: &'a Artifact,
    parts: Vec<ExpertParts>,
    /// Per job: which expert (its slot among the read ones) and which of its projections.
    jobs: Vec<(usize, usize)>,
    next: AtomicUsize,
    control: Arc<ReadControl>,
    pending: Vec<Mutex<PendingExpert>>,
}

/// What the owner of reads running on other threads keeps of them: a way to stop them, and
/// what they read.
#[derive(Default)]
pub struct ReadControl {
    stopped: AtomicBool,
    /// Per expert (its slot among the read ones): whether no reader takes another of its tiles.
    skipped: Vec<AtomicBool>,
    /// Bytes of the tiles read so far, whole experts or not.
    read_bytes: AtomicU64,
}

impl ReadControl {
    /// No reader takes another tile.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    /// No reader takes another tile of the expert in `slot`.
    pub fn skip(&self, slot: usize) {
        if let Some(skipped) = self.skipped.get(slot) {
            skipped.store(true, Ordering::Relaxed);
        }
    }

    /// Bytes of the tiles read so far.
    pub fn read_bytes(&self) -> u64 {
        self.read_bytes.load(Ordering::Relaxed)
    }

    fn skips(&self, slot: usize) -> bool {
        self.skipped
            .get(slot)
            .is_some_and(|s| s.load(Ordering::Relaxed))
    }
}

/// The tiles of one expert read so far, in its projections' order.
type PendingExpert = Vec<Option<LoadedPart>>;

impl<'a> TileReads<'a> {
    pub fn new(artifact: &'a Artifact, parts: Vec<ExpertParts>) -> TileReads<'a> {
        let experts = parts.len();
        let jobs = parts
            .iter()
            .enumerate()
            .flat_map(|(slot, p)| (0..p.parts().len()).map(move |k| (slot, k)))
            .collect();
        TileReads {
            artifact,
            pending: parts
                .iter()
                .map(|p| Mutex::new((0..p.parts().len()).map(|_| None).collect()))
                .collect(),
            parts,
            jobs,
            next: AtomicUsize::new(0),
            control: Arc::new(ReadControl {
                skipped: (0..experts).map(|_| AtomicBool::new(false)).collect(),
                ..ReadControl::default()
            }),
        }
    }

    /// What stops these reads and counts their bytes, for whoever started them.
    pub fn control(&self) -> Arc<ReadControl> {
        Arc::clone(&self.control)
    }

    pub fn jobs(&self) -> usize {
        self.jobs.len()
    }

    /// No reader takes another tile.
    pub fn stop(&self) {
        self.control.stop();
    }

    /// One reader: takes tiles until none is left or a read fails, and sends each expert whose
    /// last tile it read, or the first failure.
    pub fn run(&self, sender: &mpsc::Sender<ReadExpert>) {
        while !self.control.stopped.load(Ordering::Relaxed) {
            let job = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(&(slot, k)) = self.jobs.get(job) else {
                return;
            };
            if self.control.skips(slot) {
                continue;
            }
            let stored = &self.parts[slot].parts()[k].part;
            match self.artifact.load_part(stored) {
                Ok(part) => {
                    self.control
                        .read_bytes
                        .fetch_add(stored.read_bytes(), Ordering::Relaxed);
                    if let Some(done) = self.arrive(slot, k, part) {
                        // The receiver is gone only when the layer already failed.
                        let _ = sender.send((slot, Ok(done)));
                    }
                }
                Err(error) => {
                    self.stop();
                    let _ = sender.send((slot, Err(error)));
                    return;
                }
            }
        }
    }

    /// Records tile `k` of expert `slot`; the expert, when that was its last tile.
    fn arrive(
        &self,
        slot: usize,
        k: usize,
        part: LoadedPart,
    ) -> Option<(Arc<LoadedExpert>, Fetch)> {
        let mut pending = self.pending[slot]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        pending[k] = Some(part);
        if pending.iter().any(Option::is_none) {
            return None;
        }
        let loaded: Vec<LoadedPart> = std::mem::take(&mut *pending)
            .into_iter()
            .flatten()
            .collect();
        let expert = Arc::new(self.parts[slot].with_parts(loaded)?);
        let fetch = Fetch::read(&self.parts[slot], &expert, false);
        Some((expert, fetch))
    }
}
