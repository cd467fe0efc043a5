//! A layer's deterministic weights streamed from storage matrix by matrix: the matrices every
//! token reads in a layer (attention, the router, shared experts or the dense MLP), each read
//! into 16 KiB-aligned buffers when the pass over the layers comes to it and let go once the
//! pass asks for a later one, when the budget cannot hold them all. The reads run ahead of the
//! compute, in the order the layers ask for their matrices, through a pool of the two largest
//! matrices' bytes: the one computing and the next. Norm vectors stay resident (a few KiB).
//! The bytes a streamed matrix computes from are the stored bytes, as a resident one's are, so
//! the output has the same bits.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::artifact::{Artifact, ArtifactError, LoadedPart, PartLayout, Stack, StackLayout};
use crate::step::{ModelError, StepStats};

/// Bytes one read of these matrices moves from storage.
pub fn read_bytes(matrices: &[StackLayout]) -> u64 {
    parts(matrices).map(PartLayout::read_bytes).sum()
}

/// Bytes these matrices take once read into aligned buffers.
pub fn allocated_bytes(matrices: &[StackLayout]) -> u64 {
    parts(matrices).map(PartLayout::allocated_bytes).sum()
}

/// Bytes these parts take held resident: a container's whole file (its header and padding
/// included, as a resident matrix reads it), a blob member's slice.
pub fn resident_bytes<'p>(artifact: &Artifact, parts: impl Iterator<Item = &'p PartLayout>) -> u64 {
    let mut files = std::collections::BTreeSet::new();
    let mut pieces = 0;
    for part in parts {
        match part {
            PartLayout::Tile { file, .. } => {
                files.insert(*file);
            }
            p @ (PartLayout::Pieces { .. } | PartLayout::Bands { .. }) => pieces += p.read_bytes(),
        }
    }
    pieces
        + files
            .iter()
            .map(|&f| artifact.payload_file_bytes(f))
            .sum::<u64>()
}

/// Every part of these matrices.
pub fn parts(matrices: &[StackLayout]) -> impl Iterator<Item = &PartLayout> {
    matrices.iter().flat_map(|m| m.parts.iter())
}

/// The two largest matrices' aligned buffers among `layers`, largest first: a pass streams its
/// matrices through a pool of their sum (the one computing and the next, read ahead), whichever
/// of the layers stream.
pub fn largest_two<'l>(layers: impl IntoIterator<Item = &'l [StackLayout]>) -> [u64; 2] {
    let mut largest = [0u64; 2];
    for matrix in layers.into_iter().flatten() {
        let bytes = allocated_bytes(std::slice::from_ref(matrix));
        if bytes > largest[0] {
            largest = [bytes, largest[0]];
        } else if bytes > largest[1] {
            largest[1] = bytes;
        }
    }
    largest
}

/// One streamed matrix's bytes, read for one pass: every part of its stack. Its buffers go
/// back to the pool when the last handle to it is dropped.
pub(crate) struct ReadMatrix {
    parts: Vec<LoadedPart>,
    /// The pool bytes it was read into.
    reserved: u64,
    read_bytes: u64,
    direct_reads: u64,
    buffered_reads: u64,
    /// Weak: the pool's own map of read matrices holds these, and a strong count back would
    /// keep both alive for ever.
    pool: Weak<Pool>,
}

impl ReadMatrix {
    /// The stack `layout` describes, computing from the bytes read.
    pub(crate) fn stack(&self, layout: &StackLayout) -> Result<Stack<'_>, ArtifactError> {
        let matrices = self
            .parts
            .iter()
            .enumerate()
            .map(|(i, part)| {
                let tensor_err = |reason: String| ArtifactError::Tensor {
                    name: layout.name.clone(),
                    reason,
                };
                let matrix_part = layout
                    .matrix_part(i)
                    .ok_or_else(|| tensor_err(format!("has no matrix {i}")))?;
                part.matrix(&matrix_part)
                    .map_err(|e| tensor_err(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Stack::new(
            layout.format,
            layout.rows,
            layout.cols,
            matrices,
        ))
    }
}

impl Drop for ReadMatrix {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.release(self.reserved);
        }
    }
}

/// What a pass read, charged to the pass that used it (or let it go unused).
#[derive(Debug, Default, Clone, Copy)]
struct Charged {
    read_bytes: u64,
    direct_reads: u64,
    buffered_reads: u64,
    /// Time the compute waited for a matrix.
    waited: Duration,
    /// Matrices read a second time in one pass: asked for after the pass had let them go.
    rereads: u64,
}

/// A read matrix in the pool, or why its read failed.
struct Entry {
    read: Result<Arc<ReadMatrix>, ArtifactError>,
    charged: bool,
}

impl Entry {
    fn charge(&mut self, to: &mut Charged) {
        if let (Ok(m), false) = (&self.read, self.charged) {
            to.read_bytes += m.read_bytes;
            to.direct_reads += m.direct_reads;
            to.buffered_reads += m.buffered_reads;
            self.charged = true;
        }
    }
}

/// The reads of the passes: read `s` is matrix `s % n` of pass `s / n`, of `n` matrices a pass.
#[derive(Default)]
struct State {
    /// Whether a pass is running: a streamed matrix is read only in one.
    active: bool,
    /// Passes begun.
    passes: u64,
    /// The next read the readers take.
    next: u64,
    /// Reads taken, not yet in `ready`.
    reading: BTreeSet<u64>,
    ready: BTreeMap<u64, Entry>,
    /// The read the compute asked for last.
    wanted: Option<u64>,
    /// Whether the readers are to stop (the pass is done).
    stop: bool,
    /// Bytes of matrices read or being read, still in memory.
    in_memory: u64,
    peak: u64,
    charged: Charged,
}

/// The pool's state and the signal that it changed.
#[derive(Default)]
struct Pool {
    state: Mutex<State>,
    changed: Condvar,
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'g>(&self, guard: MutexGuard<'g, State>) -> MutexGuard<'g, State> {
        self.changed
            .wait(guard)
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn reserve(state: &mut State, bytes: u64, read: u64) {
        state.in_memory += bytes;
        state.peak = state.peak.max(state.in_memory);
        state.reading.insert(read);
    }

    /// Read `read` done: no longer in flight, in `ready` for the compute.
    fn arrived(state: &mut State, read: u64, matrix: Result<Arc<ReadMatrix>, ArtifactError>) {
        state.reading.remove(&read);
        let entry = Entry {
            read: matrix,
            charged: false,
        };
        state.ready.insert(read, entry);
    }

    fn release(&self, bytes: u64) {
        let mut state = self.lock();
        state.in_memory = state.in_memory.saturating_sub(bytes);
        drop(state);
        self.changed.notify_all();
    }
}

/// Which layers stream their deterministic matrices, in the order their passes ask for them,
/// and the reads that run ahead of the compute: in a pass, a streamed matrix is read while the
/// ones before it compute, as far ahead as the pool's bytes allow, and the first ones of the
/// next pass while the last layers and the logits compute.
pub struct LayerStream<'a> {
    artifact: &'a Artifact,
    /// Every streamed matrix in the order a pass asks for them: layer by layer, each layer's
    /// in the order its model asked for them when it was built.
    order: Vec<StackLayout>,
    /// Per layer, its matrices in `order`; `None` for a held layer.
    layers: Vec<Option<Range<usize>>>,
    read_ahead: bool,
    reads_in_flight: usize,
    /// The pool's bytes: reads ahead wait while another would not fit beside what is in memory.
    capacity: u64,
    pool: Arc<Pool>,
    /// Held through a pass: one pass at a time.
    pass: Mutex<()>,
}

impl<'a> LayerStream<'a> {
    /// Streams the layers given their matrices (`None` for a held layer) through a pool of
    /// `capacity` bytes, with `reads_in_flight` matrices read at once.
    pub fn new(
        artifact: &'a Artifact,
        streamed: Vec<Option<Vec<StackLayout>>>,
        capacity: u64,
        read_ahead: bool,
        reads_in_flight: usize,
    ) -> LayerStream<'a> {
        let mut order = Vec::new();
        let layers = streamed
            .into_iter()
            .map(|matrices| {
                matrices.map(|m| {
                    let first = order.len();
                    order.extend(m);
                    first..order.len()
                })
            })
            .collect();
        LayerStream {
            artifact,
            order,
            layers,
            read_ahead,
            reads_in_flight: reads_in_flight.max(1),
            capacity,
            pool: Arc::default(),
            pass: Mutex::new(()),
        }
    }

    pub fn is_streamed(&self, layer: usize) -> bool {
        matches!(self.layers.get(layer), Some(Some(_)))
    }

    /// Where matrix `name` of streamed layer `layer` is in a pass's order.
    pub(crate) fn index_of(&self, layer: usize, name: &str) -> Option<usize> {
        let range = self.layers.get(layer)?.clone()?;
        range
            .clone()
            .find(|&i| self.order.get(i).is_some_and(|m| m.name == name))
    }

    /// The layout of the matrix at `index` of a pass's order.
    pub(crate) fn layout(&self, index: usize) -> Option<&StackLayout> {
        self.order.get(index)
    }

    /// Streamed matrices already read for the next pass (read ahead while this one's last
    /// layers and logits computed).
    pub fn read_for_next_pass(&self) -> usize {
        let state = self.pool.lock();
        let next_pass = state.passes * self.order.len() as u64;
        state.ready.range(next_pass..).count()
    }

    /// The most bytes of streamed matrices in memory at once so far.
    pub fn peak_bytes(&self) -> u64 {
        self.pool.lock().peak
    }

    /// Every layer in order through `run_layer`, then `finish`, with the streamed matrices
    /// read ahead of them. The time spent waiting for reads is I/O time; the time any read of
    /// the pass was in flight is its read-busy time.
    pub fn run<S, T>(
        &self,
        state: &mut S,
        stats: &mut StepStats,
        mut run_layer: impl FnMut(&mut S, usize, &mut StepStats) -> Result<(), ModelError>,
        finish: impl FnOnce(&mut S, &mut StepStats) -> Result<T, ModelError>,
    ) -> Result<T, ModelError> {
        let _one_pass = self.pass.lock().unwrap_or_else(PoisonError::into_inner);
        let busy_before = self.artifact.read_busy();
        drop(self.begin());
        let out = std::thread::scope(|scope| {
            let readers = match (self.order.is_empty(), self.read_ahead) {
                (true, _) => 0,
                (false, true) => self.reads_in_flight,
                (false, false) => 1,
            };
            for _ in 0..readers {
                scope.spawn(|| self.read_loop());
            }
            let pass = || {
                for i in 0..self.layers.len() {
                    run_layer(state, i, stats)?;
                }
                finish(state, stats)
            };
            let out = pass();
            self.pool.lock().stop = true;
            self.pool.changed.notify_all();
            out
        });
        let charged = {
            let mut pool = self.pool.lock();
            pool.active = false;
            std::mem::take(&mut pool.charged)
        };
        stats.layer_read_bytes += charged.read_bytes;
        stats.direct_reads += charged.direct_reads;
        stats.buffered_reads += charged.buffered_reads;
        stats.io_time += charged.waited;
        stats.layer_rereads += charged.rereads;
        stats.read_busy += self.artifact.read_busy().saturating_sub(busy_before);
        out
    }

    /// Starts a pass: what an unfinished pass before it left is let go (returned, to be
    /// dropped outside the lock), what was read ahead for this one kept.
    fn begin(&self) -> BTreeMap<u64, Entry> {
        let mut state = self.pool.lock();
        let base = state.passes * self.order.len() as u64;
        state.passes += 1;
        state.active = true;
        state.stop = false;
        state.wanted = None;
        state.next = state.next.max(base);
        let kept = state.ready.split_off(&base);
        let mut left = std::mem::replace(&mut state.ready, kept);
        left.values_mut().for_each(|e| e.charge(&mut state.charged));
        left
    }

    /// A reader: takes the next read while the pool has room for it (or the compute waits for
    /// it), until the pass is done.
    fn read_loop(&self) {
        let n = self.order.len() as u64;
        loop {
            let (read, index, bytes) = {
                let mut state = self.pool.lock();
                loop {
                    if state.stop {
                        return;
                    }
                    if let Some(wanted) = state.wanted
                        && wanted > state.next
                    {
                        // The pass went past these without asking for them.
                        state.next = wanted;
                    }
                    let read = state.next;
                    let index = (read % n) as usize;
                    let bytes = allocated_bytes(&self.order[index..=index]);
                    let this_pass = state.passes.saturating_sub(1) * n;
                    let ahead = self.read_ahead
                        && read < this_pass + 2 * n
                        && state.in_memory + bytes <= self.capacity;
                    if ahead || state.wanted == Some(read) {
                        state.next += 1;
                        Pool::reserve(&mut state, bytes, read);
                        break (read, index, bytes);
                    }
                    state = self.pool.wait(state);
                }
            };
            let matrix = self.read_matrix(index, bytes);
            let mut state = self.pool.lock();
            Pool::arrived(&mut state, read, matrix);
            drop(state);
            self.pool.changed.notify_all();
        }
    }

    /// Matrix `index` of the order, read now into `bytes` of the pool taken for it.
    fn read_matrix(&self, index: usize, bytes: u64) -> Result<Arc<ReadMatrix>, ArtifactError> {
        let layout = &self.order[index];
        let parts = layout
            .parts
            .iter()
            .map(|p| self.artifact.load_part(p))
            .collect::<Result<Vec<_>, _>>();
        let parts = match parts {
            Ok(parts) => parts,
            Err(e) => {
                self.pool.release(bytes);
                return Err(e);
            }
        };
        let (direct_reads, buffered_reads) = parts
            .iter()
            .map(LoadedPart::read_kinds)
            .fold((0, 0), |(d, b), (pd, pb)| (d + pd, b + pb));
        Ok(Arc::new(ReadMatrix {
            parts,
            reserved: bytes,
            read_bytes: read_bytes(std::slice::from_ref(layout)),
            direct_reads,
            buffered_reads,
            pool: Arc::downgrade(&self.pool),
        }))
    }

    /// Matrix `index` of this pass, read: waits for its read (read ahead, or taken now), and
    /// lets go of every matrix before it. A matrix asked for after the pass let it go is read
    /// again (correct, but a read more than the plan's: counted in `layer_rereads`).
    pub(crate) fn read(&self, index: usize) -> Result<Arc<ReadMatrix>, ModelError> {
        let n = self.order.len() as u64;
        let mut state = self.pool.lock();
        if !state.active || index as u64 >= n {
            return Err(ModelError::Artifact(ArtifactError::Tensor {
                name: self
                    .order
                    .get(index)
                    .map_or_else(|| format!("streamed matrix {index}"), |m| m.name.clone()),
                reason: "streams, and is read only in a pass over the layers".into(),
            }));
        }
        let read = (state.passes - 1) * n + index as u64;
        let kept = state.ready.split_off(&read);
        let mut done = std::mem::replace(&mut state.ready, kept);
        done.values_mut().for_each(|e| e.charge(&mut state.charged));
        state.wanted = Some(read);
        // Let go of the matrices before this one now, not once it has arrived: their bytes are
        // the room the read after this one needs to start while this one is still being read.
        drop(state);
        drop(done);
        self.pool.changed.notify_all();
        let mut state = self.pool.lock();
        let started = Instant::now();
        let out = loop {
            let State { ready, charged, .. } = &mut *state;
            if let Some(entry) = ready.get_mut(&read) {
                entry.charge(charged);
                if let Ok(m) = &entry.read {
                    break Ok(Arc::clone(m));
                }
                if let Some(Entry { read: Err(e), .. }) = ready.remove(&read) {
                    break Err(e);
                }
            }
            if read < state.next && !state.reading.contains(&read) {
                let bytes = allocated_bytes(&self.order[index..=index]);
                Pool::reserve(&mut state, bytes, read);
                state.charged.rereads += 1;
                drop(state);
                let matrix = self.read_matrix(index, bytes);
                state = self.pool.lock();
                Pool::arrived(&mut state, read, matrix);
                continue;
            }
            state = self.pool.wait(state);
        };
        state.charged.waited += started.elapsed();
        drop(state);
        out.map_err(ModelError::from)
    }
}
