//! Routed experts streamed from storage: where each expert's three matrices are stored, a cache
//! of loaded experts bounded in bytes (least recently used out first), and the reads: one read
//! per tile into a fresh 16 KiB-aligned buffer, the experts a router picked read at once on
//! their own threads. The bytes a streamed expert computes from are the stored bytes, exactly
//! what a resident run computes from, so its output has the same bits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::artifact::{Artifact, ArtifactError, LoadedPart, MatrixPart, StackLayout};

/// Where one routed expert's gate, up and down projections are stored.
#[derive(Debug, Clone)]
pub struct ExpertParts {
    pub gate: MatrixPart,
    pub up: MatrixPart,
    pub down: MatrixPart,
}

impl ExpertParts {
    fn parts(&self) -> [&MatrixPart; 3] {
        [&self.gate, &self.up, &self.down]
    }

    /// Bytes one load of this expert reads from storage.
    pub fn read_bytes(&self) -> u64 {
        self.parts().iter().map(|p| p.part.read_bytes()).sum()
    }

    /// Bytes one loaded copy of this expert holds in memory (each read's buffer is aligned,
    /// which may cost up to one alignment unit more).
    pub fn allocated_bytes(&self) -> u64 {
        self.parts().iter().map(|p| p.part.allocated_bytes()).sum()
    }
}

/// The per-expert projections' names DeepSeek's Hugging Face layout and MLX's stacks use.
pub const STACKED: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// The `n` routed experts under `prefix` (a layer's `mlp`), in expert order, without reading
/// them: the MLX layout's stacked `switch_mlp` containers or the Hugging Face layout's
/// per-expert tensors `{prefix}.experts.E.{gate, up, down}` named by `names`; gate and up
/// `[inner, hidden]`, down `[hidden, inner]`.
pub fn routed_experts(
    artifact: &Artifact,
    prefix: &str,
    (hidden, inner, n): (usize, usize, usize),
    names: [&str; 3],
) -> Result<Vec<ExpertParts>, ArtifactError> {
    let stacked = format!("{prefix}.switch_mlp");
    let one = |layout: StackLayout, i: usize| {
        layout.matrix_part(i).ok_or_else(|| ArtifactError::Tensor {
            name: layout.name.clone(),
            reason: format!("stacks {} experts; the config has {n}", layout.parts.len()),
        })
    };
    if !artifact.has(&format!("{stacked}.gate_proj.weight")) {
        return (0..n)
            .map(|e| {
                let m = |name: &str, rows, cols| {
                    artifact.stack_layout(&format!("{prefix}.experts.{e}.{name}"), rows, cols)
                };
                Ok(ExpertParts {
                    gate: one(single(m(names[0], inner, hidden)?)?, 0)?,
                    up: one(single(m(names[1], inner, hidden)?)?, 0)?,
                    down: one(single(m(names[2], hidden, inner)?)?, 0)?,
                })
            })
            .collect();
    }
    let stack = |name: &str, rows, cols| -> Result<StackLayout, ArtifactError> {
        let s = artifact.stack_layout(&format!("{stacked}.{name}"), rows, cols)?;
        if s.parts.len() != n {
            return Err(ArtifactError::Tensor {
                name: s.name,
                reason: format!("stacks {} experts; the config has {n}", s.parts.len()),
            });
        }
        Ok(s)
    };
    let (gate, up, down) = (
        stack("gate_proj", inner, hidden)?,
        stack("up_proj", inner, hidden)?,
        stack("down_proj", hidden, inner)?,
    );
    (0..n)
        .map(|e| {
            Ok(ExpertParts {
                gate: one(gate.clone(), e)?,
                up: one(up.clone(), e)?,
                down: one(down.clone(), e)?,
            })
        })
        .collect()
}

fn single(layout: StackLayout) -> Result<StackLayout, ArtifactError> {
    match layout.parts.len() {
        1 => Ok(layout),
        n => Err(ArtifactError::Tensor {
            name: layout.name,
            reason: format!("is a stack of {n} matrices where the model needs one"),
        }),
    }
}

/// One expert's three matrices, read.
#[derive(Debug)]
pub struct LoadedExpert {
    pub gate: LoadedPart,
    pub up: LoadedPart,
    pub down: LoadedPart,
}

impl LoadedExpert {
    fn allocated(&self) -> u64 {
        (self.gate.allocated() + self.up.allocated() + self.down.allocated()) as u64
    }

    fn read_kinds(&self) -> (u64, u64) {
        [&self.gate, &self.up, &self.down]
            .map(LoadedPart::read_kinds)
            .iter()
            .fold((0, 0), |(d, b), (dd, bb)| (d + dd, b + bb))
    }
}

/// What fetching one expert cost.
#[derive(Debug, Default, Clone, Copy)]
pub struct Fetch {
    pub hit: bool,
    pub read_bytes: u64,
    pub direct_reads: u64,
    pub buffered_reads: u64,
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

    /// Bytes of experts held now, and the most ever held at once (cache and in-flight loads).
    pub fn usage(&self) -> (u64, u64) {
        self.state
            .lock()
            .map(|s| (s.used, s.peak))
            .unwrap_or((0, 0))
    }

    fn get(&self, key: (usize, usize)) -> Option<Arc<LoadedExpert>> {
        let mut s = self.state.lock().ok()?;
        s.clock += 1;
        let clock = s.clock;
        let entry = s.entries.get_mut(&key)?;
        entry.last_use = clock;
        Some(Arc::clone(&entry.expert))
    }

    /// Keeps `expert` if it fits, evicting the least recently used first; otherwise counts it
    /// as in flight until [`Self::layer_done`].
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

    /// The layer's uncached experts are dropped: their buffers are free again.
    pub fn layer_done(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.in_flight = 0;
        }
    }
}

/// The experts the router picked for one token at one layer, fetched from the cache or read
/// from storage by `reads_in_flight` threads, which take the experts in turn in the order chosen. While
/// they are read, `meanwhile` runs (the shared expert's products); then `each` is called for the
/// experts in the order chosen, each as soon as its own read is done, so compute overlaps the
/// reads still in flight. Returns `meanwhile`'s value and the time spent waiting for reads.
#[allow(clippy::too_many_arguments)]
pub fn with_fetched<R>(
    artifact: &Artifact,
    cache: &ExpertCache,
    layer: usize,
    experts: &[ExpertParts],
    chosen: &[usize],
    reads_in_flight: usize,
    meanwhile: impl FnOnce() -> R,
    mut each: impl FnMut(usize, &LoadedExpert, Fetch) -> Result<(), crate::layers::ModelError>,
) -> Result<(R, Duration), crate::layers::ModelError> {
    type Fetched = Result<(Arc<LoadedExpert>, Fetch), ArtifactError>;
    let threads = reads_in_flight.clamp(1, chosen.len().max(1));
    // Reader t takes the chosen experts t, t + threads, ... in order, and owns their senders:
    // if it panics they are dropped, so waiting on its experts ends instead of hanging.
    let mut work: Vec<Vec<(usize, mpsc::Sender<Fetched>)>> =
        (0..threads).map(|_| Vec::new()).collect();
    let mut receivers = Vec::with_capacity(chosen.len());
    for (i, &e) in chosen.iter().enumerate() {
        let (sender, receiver) = mpsc::channel::<Fetched>();
        work[i % threads].push((e, sender));
        receivers.push(receiver);
    }
    std::thread::scope(|scope| {
        for share in work {
            scope.spawn(move || {
                for (e, sender) in share {
                    // The receiver is gone only when the layer already failed.
                    let _ = sender.send(fetch(artifact, cache, layer, experts, e));
                }
            });
        }
        let value = meanwhile();
        let mut waited = Duration::ZERO;
        for (i, receiver) in receivers.into_iter().enumerate() {
            let started = Instant::now();
            let fetched = receiver.recv().unwrap_or_else(|_| {
                Err(ArtifactError::Tensor {
                    name: format!("model.layers.{layer}.mlp experts"),
                    reason: "a read thread panicked".into(),
                })
            });
            waited += started.elapsed();
            let (expert, cost) = fetched?;
            each(i, &expert, cost)?;
        }
        cache.layer_done();
        Ok((value, waited))
    })
}

fn fetch(
    artifact: &Artifact,
    cache: &ExpertCache,
    layer: usize,
    experts: &[ExpertParts],
    e: usize,
) -> Result<(Arc<LoadedExpert>, Fetch), ArtifactError> {
    if let Some(expert) = cache.get((layer, e)) {
        return Ok((
            expert,
            Fetch {
                hit: true,
                ..Fetch::default()
            },
        ));
    }
    let parts = experts.get(e).ok_or_else(|| ArtifactError::Tensor {
        name: format!("model.layers.{layer}.mlp experts"),
        reason: format!("the router chose expert {e} of {}", experts.len()),
    })?;
    let expert = Arc::new(LoadedExpert {
        gate: artifact.load_part(&parts.gate.part)?,
        up: artifact.load_part(&parts.up.part)?,
        down: artifact.load_part(&parts.down.part)?,
    });
    let (direct, buffered) = expert.read_kinds();
    cache.insert((layer, e), &expert);
    Ok((
        expert,
        Fetch {
            hit: false,
            read_bytes: parts.read_bytes(),
            direct_reads: direct,
            buffered_reads: buffered,
        },
    ))
}
