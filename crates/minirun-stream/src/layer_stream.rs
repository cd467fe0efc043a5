//! A layer's deterministic weights streamed from storage: the matrices every token reads in a
//! layer (attention, the router, shared experts or the dense MLP), read for one step into
//! 16 KiB-aligned buffers and dropped after it, when the budget cannot hold them all. Norm
//! vectors stay resident (they are a few KiB). The bytes a streamed layer computes from are the
//! stored bytes, as a resident layer's are, so the output has the same bits.

use std::collections::HashMap;
use std::time::Instant;

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

/// One layer's deterministic matrices, read.
pub struct LoadedLayer {
    stacks: HashMap<String, (StackLayout, Vec<LoadedPart>)>,
    pub read_bytes: u64,
    pub direct_reads: u64,
    pub buffered_reads: u64,
}

impl LoadedLayer {
    /// Reads every matrix of `matrices` now, one read per tile, up to `reads_in_flight` parts
    /// at once: one at a time, a layer's reads kept the device at queue depth one, slower than
    /// its best depth on the disks measured (docs/runtime.md §6).
    pub fn read(
        artifact: &Artifact,
        matrices: &[StackLayout],
        reads_in_flight: usize,
    ) -> Result<Self, ArtifactError> {
        let mut loaded = LoadedLayer {
            stacks: HashMap::new(),
            read_bytes: 0,
            direct_reads: 0,
            buffered_reads: 0,
        };
        let mut read = read_parts(artifact, matrices, reads_in_flight).into_iter();
        for layout in matrices {
            let parts = read
                .by_ref()
                .take(layout.parts.len())
                .collect::<Result<Vec<_>, _>>()?;
            for (direct, buffered) in parts.iter().map(LoadedPart::read_kinds) {
                loaded.direct_reads += direct;
                loaded.buffered_reads += buffered;
            }
            loaded.read_bytes += read_bytes(std::slice::from_ref(layout));
            let module = layout.name.trim_end_matches(".weight").to_string();
            loaded.stacks.insert(module, (layout.clone(), parts));
        }
        Ok(loaded)
    }

    /// The stack of `module`, computing from the bytes read.
    pub fn stack(
        &self,
        module: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Stack<'_>, ArtifactError> {
        let (layout, parts) = self
            .stacks
            .get(module)
            .ok_or_else(|| ArtifactError::Tensor {
                name: format!("{module}.weight"),
                reason: "was not read with its streamed layer".into(),
            })?;
        if (layout.rows, layout.cols) != (rows, cols) {
            return Err(ArtifactError::Tensor {
                name: layout.name.clone(),
                reason: format!(
                    "was read as {} x {}, the model needs {rows} x {cols}",
                    layout.rows, layout.cols
                ),
            });
        }
        let matrices = parts
            .iter()
            .enumerate()
            .map(|(i, part)| {
                let matrix_part = layout.matrix_part(i).ok_or_else(|| ArtifactError::Tensor {
                    name: layout.name.clone(),
                    reason: format!("has no matrix {i}"),
                })?;
                part.matrix(&matrix_part)
                    .map_err(|e| ArtifactError::Tensor {
                        name: layout.name.clone(),
                        reason: e.to_string(),
                    })
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

/// Every part of `matrices`, in order, read by up to `reads_in_flight` threads that take the
/// next part as they finish one.
fn read_parts(
    artifact: &Artifact,
    matrices: &[StackLayout],
    reads_in_flight: usize,
) -> Vec<Result<LoadedPart, ArtifactError>> {
    let all: Vec<&PartLayout> = parts(matrices).collect();
    let threads = reads_in_flight.clamp(1, all.len().max(1));
    if threads == 1 {
        return all.iter().map(|p| artifact.load_part(p)).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut read: Vec<Option<Result<LoadedPart, ArtifactError>>> = Vec::new();
    read.resize_with(all.len(), || None);
    let read = std::sync::Mutex::new(read);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(part) = all.get(i) else { break };
                    let loaded = artifact.load_part(part);
                    if let Ok(mut read) = read.lock() {
                        read[i] = Some(loaded);
                    }
                }
            });
        }
    });
    // Only a panicking reader could poison the lock, and the scope re-raises its panic before
    // here; were it ever reached, the parts read are kept, never dropped into a short layer.
    let read = read
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    read.into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(ArtifactError::Tensor {
                    name: "a streamed layer".into(),
                    reason: "a part's read thread ended without it".into(),
                })
            })
        })
        .collect()
}

/// A thread of a step's scope reading a streamed layer.
type LayerHandle<'scope> =
    std::thread::ScopedJoinHandle<'scope, Result<LoadedLayer, ArtifactError>>;

/// The next streamed layer: being read, or read (kept from the previous step).
enum Ahead<'scope> {
    Reading(usize, LayerHandle<'scope>),
    Read(usize, LoadedLayer),
}

/// The layer a read thread returned, or why it has none.
fn joined(i: usize, handle: LayerHandle<'_>) -> Result<LoadedLayer, ArtifactError> {
    handle.join().unwrap_or_else(|_| {
        Err(ArtifactError::Tensor {
            name: format!("layer {i}"),
            reason: "a read thread panicked".into(),
        })
    })
}

/// Which layers stream their deterministic weights, and the reads in flight: with read-ahead,
/// a streamed layer's matrices are read while the layer before it computes (so at most two
/// streamed layers are in memory), and the first one of the next step while the step's last
/// layers and its logits compute.
pub struct LayerStream {
    /// Per layer, the matrices read for each step; `None` for a held layer.
    streamed: Vec<Option<Vec<StackLayout>>>,
    read_ahead: bool,
    /// Parts of a layer read at once.
    reads_in_flight: usize,
    /// The first streamed layer, read during the previous step.
    kept: std::sync::Mutex<Option<(usize, LoadedLayer)>>,
}

impl LayerStream {
    pub fn new(
        streamed: Vec<Option<Vec<StackLayout>>>,
        read_ahead: bool,
        reads_in_flight: usize,
    ) -> LayerStream {
        LayerStream {
            streamed,
            read_ahead,
            reads_in_flight,
            kept: std::sync::Mutex::new(None),
        }
    }

    pub fn is_streamed(&self, layer: usize) -> bool {
        matches!(self.streamed.get(layer), Some(Some(_)))
    }

    /// The streamed layer already read for the next step, if any.
    pub fn read_for_next_step(&self) -> Option<usize> {
        self.kept
            .lock()
            .ok()
            .and_then(|kept| kept.as_ref().map(|(j, _)| *j))
    }

    fn next_streamed(&self, after: Option<usize>) -> Option<usize> {
        (after.map_or(0, |i| i + 1)..self.streamed.len()).find(|&j| self.is_streamed(j))
    }

    fn read(&self, artifact: &Artifact, i: usize) -> Result<LoadedLayer, ArtifactError> {
        match self.streamed.get(i) {
            Some(Some(matrices)) => LoadedLayer::read(artifact, matrices, self.reads_in_flight),
            _ => Err(ArtifactError::Tensor {
                name: format!("layer {i}"),
                reason: "is held, not streamed".into(),
            }),
        }
    }

    /// Every layer in order through `run_layer` (handed a streamed layer's matrices, read for
    /// this step; `None` for a held layer), then `finish`. The time spent waiting for reads is
    /// I/O time; the time any read of the pass was in flight is its read-busy time.
    pub fn run<S, T>(
        &self,
        artifact: &Artifact,
        state: &mut S,
        stats: &mut StepStats,
        run_layer: impl FnMut(
            &mut S,
            usize,
            Option<&LoadedLayer>,
            &mut StepStats,
        ) -> Result<(), ModelError>,
        finish: impl FnOnce(&mut S, &mut StepStats) -> Result<T, ModelError>,
    ) -> Result<T, ModelError> {
        let busy_before = artifact.read_busy();
        let out = self.run_layers(artifact, state, stats, run_layer, finish);
        stats.read_busy += artifact.read_busy().saturating_sub(busy_before);
        out
    }

    fn run_layers<S, T>(
        &self,
        artifact: &Artifact,
        state: &mut S,
        stats: &mut StepStats,
        mut run_layer: impl FnMut(
            &mut S,
            usize,
            Option<&LoadedLayer>,
            &mut StepStats,
        ) -> Result<(), ModelError>,
        finish: impl FnOnce(&mut S, &mut StepStats) -> Result<T, ModelError>,
    ) -> Result<T, ModelError> {
        std::thread::scope(|scope| {
            let spawn = |j: usize| (j, scope.spawn(move || self.read(artifact, j)));
            let kept = self.kept.lock().ok().and_then(|mut k| k.take());
            let mut ahead = match (kept, self.read_ahead) {
                (Some((j, layer)), _) => Some(Ahead::Read(j, layer)),
                (None, true) => self.next_streamed(None).map(|j| {
                    let (j, handle) = spawn(j);
                    Ahead::Reading(j, handle)
                }),
                (None, false) => None,
            };
            let mut next_step = None;
            for i in 0..self.streamed.len() {
                if !self.is_streamed(i) {
                    run_layer(state, i, None, stats)?;
                    continue;
                }
                let started = Instant::now();
                let loaded = match ahead.take() {
                    Some(Ahead::Reading(j, handle)) if j == i => joined(i, handle)?,
                    Some(Ahead::Read(j, layer)) if j == i => layer,
                    _ => self.read(artifact, i)?,
                };
                stats.io_time += started.elapsed();
                stats.layer_read_bytes += loaded.read_bytes;
                stats.direct_reads += loaded.direct_reads;
                stats.buffered_reads += loaded.buffered_reads;
                if self.read_ahead {
                    match self.next_streamed(Some(i)) {
                        Some(j) => {
                            let (j, handle) = spawn(j);
                            ahead = Some(Ahead::Reading(j, handle));
                        }
                        None => next_step = self.next_streamed(None).map(spawn),
                    }
                }
                run_layer(state, i, Some(&loaded), stats)?;
            }
            let out = finish(state, stats)?;
            if let Some((j, handle)) = next_step {
                // A failed read is dropped: the next step reads the layer itself and reports it.
                let started = Instant::now();
                let layer = joined(j, handle);
                stats.io_time += started.elapsed();
                if let (Ok(layer), Ok(mut kept)) = (layer, self.kept.lock()) {
                    *kept = Some((j, layer));
                }
            }
            Ok(out)
        })
    }
}
