//! The weights handle: how a model asks for its tensors, by name, once. Where the bytes come
//! from is the handle's business, decided by the plan: the artifact's resident bytes, a streamed
//! layer's bytes read for this step, or nothing at all (a dry build, which records what the
//! model asked for). Routed experts are held or read on demand as the plan says.
//!
//! A model's builder is one function per layer run against a handle; the planner learns each
//! layer's deterministic matrices and routed experts by running that same builder dry
//! ([`ModelWeights::record`]), so there is no second, hand-written list to drift from it.

use std::cell::RefCell;
use std::sync::Arc;

use crate::artifact::{Artifact, ArtifactError, Stack, StackLayout};
use crate::expert_stream::ExpertStream;
use crate::experts::{ExpertNames, ExpertParts, Projections, routed_experts};
use crate::layer_stream::LayerStream;
use crate::matrix::Matrix;
use crate::model_weights::{LayerWeights, ModelWeights};
use crate::plan::{Mode, Plan};
use crate::tables::{RecordedTable, StoredTable, StoredTables, Table, TableUse};
use minirun_kernels::QMatrix;

/// Where a handle's matrices come from.
#[derive(Clone)]
enum Matrices<'w> {
    /// Read now and held for the run.
    Resident,
    /// A streamed layer's, read in each pass when the layer computes with them.
    Streamed(Arc<LayerStream<'w>>),
    /// Nothing read: the layouts are recorded, the matrices are zeros of the right size.
    Recording(&'w Recorder),
    /// Nothing read, outside the layers: the tables are recorded here; a matrix is not asked
    /// for there.
    RecordingTables(Arc<std::sync::Mutex<Vec<RecordedTable>>>),
}

/// A model's request for its tensors, at a prefix (`model.layers.3`), for one layer or for the
/// weights outside the layers.
#[derive(Clone)]
pub struct Weights<'w> {
    artifact: &'w Artifact,
    matrices: Matrices<'w>,
    layer: Option<usize>,
    prefix: String,
    experts: Option<Arc<ExpertStream<'w>>>,
    /// The tables read by rows from storage instead of held.
    tables: Option<Arc<StoredTables>>,
}

impl<'w> Weights<'w> {
    /// Every weight read now and held.
    pub fn resident(
        artifact: &'w Artifact,
        layer: Option<usize>,
        experts: Option<Arc<ExpertStream<'w>>>,
    ) -> Weights<'w> {
        Weights {
            artifact,
            matrices: Matrices::Resident,
            layer,
            prefix: String::new(),
            experts,
            tables: None,
        }
    }

    /// The weights outside the layers, the tables in `tables` read by rows from storage, every
    /// other weight read now and held.
    pub fn outside_layers(artifact: &'w Artifact, tables: Arc<StoredTables>) -> Weights<'w> {
        Weights {
            tables: Some(tables),
            ..Weights::resident(artifact, None, None)
        }
    }

    /// Layer `layer`'s deterministic matrices from `stream` (read in each pass).
    pub fn streamed(
        artifact: &'w Artifact,
        stream: Arc<LayerStream<'w>>,
        layer: usize,
        experts: Option<Arc<ExpertStream<'w>>>,
    ) -> Weights<'w> {
        Weights {
            artifact,
            matrices: Matrices::Streamed(stream),
            layer: Some(layer),
            prefix: String::new(),
            experts,
            tables: None,
        }
    }

    fn recording(artifact: &'w Artifact, recorder: &'w Recorder, layer: usize) -> Weights<'w> {
        Weights {
            artifact,
            matrices: Matrices::Recording(recorder),
            layer: Some(layer),
            prefix: String::new(),
            experts: None,
            tables: None,
        }
    }

    /// The same handle, its names under `prefix` (joined with a dot).
    pub fn at(&self, prefix: &str) -> Weights<'w> {
        Weights {
            prefix: self.name(prefix),
            ..self.clone()
        }
    }

    /// `name` under this handle's prefix.
    pub fn name(&self, name: &str) -> String {
        match self.prefix.is_empty() {
            true => name.to_string(),
            false => format!("{}.{name}", self.prefix),
        }
    }

    /// Whether the artifact stores tensor `name` (metadata only).
    pub fn has(&self, name: &str) -> bool {
        self.artifact.has(&self.name(name))
    }

    /// Whether the artifact stores a matrix for module `module` under this prefix.
    pub fn has_matrix(&self, module: &str) -> bool {
        self.artifact.has_matrix(&self.name(module))
    }

    /// The stack of matrices of module `module` (`{module}.weight` with its scales), `[..,
    /// rows, cols]`.
    pub fn stack(
        &self,
        module: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Matrix<'w>, ArtifactError> {
        self.stack_where(module, (rows, cols), |_| Ok(()))
    }

    /// The one matrix of module `module`, `[rows, cols]`.
    pub fn matrix(
        &self,
        module: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Matrix<'w>, ArtifactError> {
        self.stack_where(module, (rows, cols), |layout| match layout.parts.len() {
            1 => Ok(()),
            n => Err(ArtifactError::Tensor {
                name: layout.name.clone(),
                reason: format!("is a stack of {n} matrices where the model needs one"),
            }),
        })
    }

    /// The stack of `module`, its layout first passing `check`.
    fn stack_where(
        &self,
        module: &str,
        (rows, cols): (usize, usize),
        check: impl FnOnce(&StackLayout) -> Result<(), ArtifactError>,
    ) -> Result<Matrix<'w>, ArtifactError> {
        let module = self.name(module);
        let layout = || {
            let layout = self.artifact.stack_layout(&module, rows, cols)?;
            check(&layout)?;
            Ok::<_, ArtifactError>(layout)
        };
        match &self.matrices {
            Matrices::Resident => {
                layout()?;
                Ok(Matrix::held(self.artifact.matrix(&module, rows, cols)?))
            }
            Matrices::Streamed(stream) => {
                let layout = layout()?;
                let index = self
                    .layer
                    .and_then(|layer| stream.index_of(layer, &layout.name))
                    .ok_or_else(|| ArtifactError::Tensor {
                        name: layout.name.clone(),
                        reason: "was not planned with its streamed layer".into(),
                    })?;
                Ok(Matrix::streamed(Arc::clone(stream), index, &layout))
            }
            Matrices::Recording(recorder) => {
                Ok(Matrix::held(recorder.matrix(self.artifact, layout()?)?))
            }
            Matrices::RecordingTables(_) => Err(ArtifactError::Tensor {
                name: module,
                reason: "is a matrix outside the layers: a model asks for its tables there (Weights::table), which a plan can leave on storage".into(),
            }),
        }
    }

    /// The table of module `module` outside the layers (the token embedding, the output head),
    /// `[rows, cols]`: held, or read by rows from storage where the plan does not hold it. A
    /// dry build records it, and what the model computes with it, without reading it.
    pub fn table(
        &self,
        module: &str,
        (rows, cols): (usize, usize),
        used_as: TableUse,
    ) -> Result<Table<'w>, ArtifactError> {
        let module = self.name(module);
        if self.layer.is_some() {
            return Err(ArtifactError::Tensor {
                name: module,
                reason: "a table is outside the layers; a layer asks for its matrices".into(),
            });
        }
        let layout = self.artifact.stack_layout(&module, rows, cols)?;
        match (&self.matrices, &self.tables) {
            (Matrices::RecordingTables(recorded), _) => {
                if let Ok(mut tables) = recorded.lock()
                    && !tables.iter().any(|t| t.layout.name == layout.name)
                {
                    tables.push(RecordedTable { layout, used_as });
                }
                Ok(Table::Recorded { rows, cols })
            }
            (_, Some(t)) if t.names.contains(&layout.name) => Ok(Table::Stored(StoredTable::new(
                self.artifact,
                &layout,
                (t.tile_bytes, t.read_ahead),
            )?)),
            _ => Ok(Table::Held(
                self.artifact
                    .matrix(&module, rows, cols)?
                    .single(&layout.name)?,
            )),
        }
    }

    /// A float tensor (a norm's weights, a bias) of `len` elements, as f32. Always resident:
    /// a dry build checks it without reading it (and computes from zeros).
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ArtifactError> {
        let name = self.name(name);
        match self.matrices {
            Matrices::Recording(_) | Matrices::RecordingTables(_) => {
                self.artifact.check_vector(&name, len)?;
                Ok(vec![0.0; len])
            }
            _ => self.artifact.vector(&name, len),
        }
    }

    /// A plain integer tensor of `len` elements, widened to i64 (a dry build checks it
    /// without reading it, and computes from zeros).
    pub fn integers(&self, name: &str, len: usize) -> Result<Vec<i64>, ArtifactError> {
        let name = self.name(name);
        match self.matrices {
            Matrices::Recording(_) | Matrices::RecordingTables(_) => {
                self.artifact.check_integers(&name, len)?;
                Ok(vec![0; len])
            }
            _ => self.artifact.integers(&name, len),
        }
    }

    /// Where the `n` routed experts of this layer under `module` (its `mlp`) come from, gate
    /// and up `[inner, hidden]`, down `[hidden, inner]`, stacked (`switch_mlp.*`) or per expert
    /// (`experts.E.{names}`): held when the plan holds this layer's experts, else read when the
    /// router picks them; a dry build records where they are stored. All three find them with
    /// [`routed_experts`], so what is held is what a streamed run would read.
    pub fn routed_experts(
        &self,
        module: &str,
        names: ExpertNames,
        sizes: (usize, usize, usize),
    ) -> Result<ExpertsFrom<'w>, ArtifactError> {
        let module = self.name(module);
        let layer = self.layer.ok_or_else(|| ArtifactError::Tensor {
            name: module.clone(),
            reason: "routed experts outside a layer".into(),
        })?;
        if let Matrices::Recording(recorder) = &self.matrices {
            let parts = routed_experts(self.artifact, &module, sizes, names)?;
            recorder.experts.replace(Some(parts));
            return Ok(ExpertsFrom::Recorded);
        }
        if let Some(stream) = &self.experts
            && let Some(Some(_)) = stream.map.get(layer)
        {
            return Ok(ExpertsFrom::Storage {
                layer,
                stream: Arc::clone(stream),
            });
        }
        let held = routed_experts(self.artifact, &module, sizes, names)?
            .iter()
            .map(|e| e.try_map(|part| self.artifact.resident_part(part)))
            .collect::<Result<_, ArtifactError>>()?;
        Ok(ExpertsFrom::Held(held))
    }
}

/// Where a layer's routed experts come from.
pub enum ExpertsFrom<'w> {
    /// Held for the run: each expert's projections, read now.
    Held(Vec<Projections<QMatrix<'w>>>),
    /// Read from storage when the router picks them.
    Storage {
        layer: usize,
        stream: Arc<ExpertStream<'w>>,
    },
    /// A dry build's: recorded, never read.
    Recorded,
}

/// What a dry build of one layer asked for: its deterministic matrices, in the order it asked
/// for them, and its routed experts.
struct Recorder {
    /// The zeros each matrix is built over, one buffer per matrix (untouched allocations: the
    /// kernel's checks read them, nothing computes with them).
    zeros: typed_arena::Arena<Vec<u8>>,
    matrices: RefCell<Vec<StackLayout>>,
    experts: RefCell<Option<Vec<ExpertParts>>>,
}

impl Recorder {
    fn new() -> Recorder {
        Recorder {
            zeros: typed_arena::Arena::new(),
            matrices: RefCell::new(Vec::new()),
            experts: RefCell::new(None),
        }
    }
}

impl Recorder {
    fn matrix<'r>(
        &'r self,
        artifact: &Artifact,
        layout: StackLayout,
    ) -> Result<Stack<'r>, ArtifactError> {
        let longest = layout
            .parts
            .iter()
            .flat_map(|p| p.byte_lengths())
            .max()
            .unwrap_or(0);
        let zeros = self.zeros.alloc(vec![0u8; longest]);
        let stack = artifact.unread_stack(&layout, zeros)?;
        let mut matrices = self.matrices.borrow_mut();
        if !matrices.iter().any(|m| m.name == layout.name) {
            matrices.push(layout);
        }
        Ok(stack)
    }
}

impl ModelWeights {
    /// Runs `build` for each of `layers` layers against a handle that reads nothing.
    pub fn record(
        artifact: &Artifact,
        layers: usize,
        mut build: impl for<'r> FnMut(&Weights<'r>, usize) -> Result<(), ArtifactError>,
    ) -> Result<ModelWeights, ArtifactError> {
        let layers = (0..layers)
            .map(|i| {
                let recorder = Recorder::new();
                build(&Weights::recording(artifact, &recorder, i), i)?;
                Ok(LayerWeights {
                    matrices: recorder.matrices.into_inner(),
                    experts: recorder.experts.into_inner(),
                })
            })
            .collect::<Result<_, ArtifactError>>()?;
        Ok(ModelWeights {
            layers,
            tables: Vec::new(),
        })
    }

    /// Runs `build` against a handle for the weights outside the layers that reads nothing,
    /// recording the tables it asks for.
    pub fn record_outside<'w>(
        &mut self,
        artifact: &'w Artifact,
        build: impl FnOnce(&Weights<'w>) -> Result<(), ArtifactError>,
    ) -> Result<(), ArtifactError> {
        let recorded = Arc::new(std::sync::Mutex::new(Vec::new()));
        let w = Weights {
            matrices: Matrices::RecordingTables(Arc::clone(&recorded)),
            ..Weights::resident(artifact, None, None)
        };
        build(&w)?;
        drop(w);
        self.tables = Arc::try_unwrap(recorded)
            .ok()
            .and_then(|m| m.into_inner().ok())
            .unwrap_or_default();
        Ok(())
    }
}

/// How a model holds its weights, as a plan says: which layers stream their deterministic
/// matrices (with read-ahead or not), and the routed experts it reads on demand.
pub struct Placement<'a> {
    /// Per layer, the matrices read for each step; `None` for a layer held for the run.
    pub streamed_layers: Vec<Option<Vec<StackLayout>>>,
    /// The pool the streamed matrices are read into.
    pub layer_pool_bytes: u64,
    pub read_ahead: bool,
    /// Reads in flight at once, for a streamed layer's parts as for routed experts.
    pub reads_in_flight: usize,
    pub experts: Option<Arc<ExpertStream<'a>>>,
    /// The tables outside the layers read by rows from storage.
    pub tables: Arc<StoredTables>,
}

impl<'a> Placement<'a> {
    /// Every weight held.
    pub fn resident(layers: usize) -> Placement<'a> {
        Placement {
            streamed_layers: vec![None; layers],
            layer_pool_bytes: 0,
            read_ahead: true,
            reads_in_flight: 1,
            experts: None,
            tables: Arc::default(),
        }
    }

    /// The placement `plan` decides: the one place a plan is read. The routed experts of
    /// `plan.held_layers` are read at load and held, the others' streamed through a cache of
    /// `plan.cache_bytes`; the deterministic matrices of `plan.streamed_layers` are read for
    /// each step, and the tables the plan leaves on storage by rows.
    pub fn of(artifact: &'a Artifact, plan: &Plan, weights: &ModelWeights) -> Placement<'a> {
        let layers = weights.layers.len();
        if plan.mode == Mode::Resident {
            return Placement::resident(layers);
        }
        let mut map = weights.expert_map();
        for &layer in &plan.held_layers {
            if let Some(entry) = map.get_mut(layer) {
                *entry = None;
            }
        }
        let streamed_layers = (0..layers)
            .map(|i| {
                plan.streamed_layers
                    .contains(&i)
                    .then(|| weights.matrices(i).to_vec())
            })
            .collect();
        Placement {
            streamed_layers,
            layer_pool_bytes: plan.layer_pool_bytes,
            read_ahead: plan.read_ahead,
            reads_in_flight: plan.reads_in_flight,
            tables: Arc::new(plan.stored_tables()),
            experts: Some(Arc::new(ExpertStream {
                artifact,
                cache: plan.start_streaming(artifact),
                reads_in_flight: plan.reads_in_flight,
                slots: plan.experts_per_token,
                map,
                guessed_layers: plan.guessed_layers,
                guessing: Default::default(),
            })),
        }
    }
}
