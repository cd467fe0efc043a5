//! The memory plan of a run: what stays resident, what streams, and whether the budget pays for
//! it, decided before a payload byte is read.
//!
//! The floor is the least a run can work in, and its terms:
//! 1. what is always held: every norm vector and bias, and a table that cannot be read by rows
//!    (a tile whose digest the run checks on every read);
//! 2. the tables outside the layers, the token embedding and the output head: the buffers
//!    reading them by rows takes ([`crate::tables`]: a row for the embedding, two tiles of the
//!    head's rows), or the tables themselves where holding them takes less;
//! 3. the layers' deterministic weights (attention, the router, shared experts or the dense
//!    MLP: what every token reads): read matrix by matrix ([`crate::layer_stream`]), through
//!    buffers for the two largest matrices (the one computing and the next, read ahead), when
//!    streaming them is what lowers the floor, else all of them held;
//! 4. the slot pool (one layer's chosen experts, read at once);
//! 5. a stated reserve (the KV cache for the run's context plus a fixed allowance for
//!    activations, the tokenizer and the runtime).
//!
//! A budget below the floor is refused before a payload byte is read, naming every term. Above
//! it, the budget holds what saves the most bytes read a token per byte held first
//! ([`crate::ranking`]): every layer's deterministic weights at once where it pays for them all
//! (which gives back their buffers), else layer by layer; the head; whole MoE layers (every
//! routed expert of the layer read at load), which make a token's reads exact; then a cache of
//! routed experts for the other MoE layers; the embedding, which saves one row a token, only
//! once no layer's experts stream. With no cache left over, a step reads exactly
//! `uncached_read_per_token` + `layer_read_per_token` + `table_read_per_token`. A budget that
//! holds everything runs fully resident.
//!
//! [`Layers::StreamEvery`] streams every layer's deterministic weights even where the budget
//! would hold them, and so sets the floor at the streaming one: a cut of a model too large for
//! any layer to stay resident (a few of its layers, at its real geometry) then reads per token
//! what each layer of the whole model reads at its floor.

use crate::artifact::{Artifact, ArtifactError, PartLayout};
use crate::budget::{Budget, human};
use crate::experts::{ExpertCache, ExpertParts};
use crate::layer_stream;
use crate::model_weights::ModelWeights;
use crate::ranking::{Holdable, Ranked, fill, rank};

mod describe;

use crate::tables::{StoredTables, TABLE_TILE_BYTES, TableTerms};
use describe::table_label;

/// Activations, the tokenizer and the runtime's own heap, beside the KV cache.
pub const FIXED_RESERVE: u64 = 16 << 20;

/// Expert reads in flight at once unless the caller says otherwise (`--reads-in-flight`): a
/// DeepSeek-V3 token's eight experts of a layer all at once. On this project's 2-core VM, 1, 2
/// and 4 reads in flight decoded 0.68 to 0.90x as fast as 8 (docs/runtime.md §6 has the
/// command).
pub const DEFAULT_READS_IN_FLIGHT: usize = 8;

/// Streamed MoE layers a plan lets a decode step guess ahead at once unless the caller says
/// otherwise (`--guessed-layers`), and the most it lets: see [`Plan::guess_ahead`]. One, the
/// layer about to run, guessed before its attention: on V4 Flash's geometry two (the next
/// layer's experts guessed a layer earlier too) chose the right experts less often and were no
/// faster, for a second slot pool taken from the cache (docs/runtime.md).
pub const GUESSED_LAYERS: usize = 1;
pub const MAX_GUESSED_LAYERS: usize = 2;

/// How the run holds its weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Every weight read once and held.
    Resident,
    /// Routed experts (and maybe some layers' deterministic weights) read from storage when a
    /// step needs them, cached within the budget.
    Streamed,
}

/// Why a plan could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error(transparent)]
    BelowFloor(Box<BelowFloor>),
}

/// A budget below the floor, with every term of the floor.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "--budget {budget} is below this run's floor of {}: resident weights {} + embedding and head {} (read by rows from storage where that takes less) + layer buffers {} ({}) + slot pool {} ({experts_per_token} experts of {}) + reserve {} (KV cache for {context_tokens} tokens + {} fixed). Give --budget {floor} or more, or --budget floor",
    human(*floor), human(*resident), human(*tables), human(*layer_pool), layer_pool_terms(*layer_pool, *matrices), human(*slot_pool), human(*expert), human(*reserve), human(FIXED_RESERVE)
)]
pub struct BelowFloor {
    pub budget: String,
    pub floor: u64,
    pub resident: u64,
    /// The tables outside the layers: their read buffers where they stream, else their bytes.
    pub tables: u64,
    /// Buffers for streamed deterministic weights (0 when the floor holds them all).
    pub layer_pool: u64,
    /// The two largest matrices of the layers, in aligned buffers.
    pub matrices: [u64; 2],
    pub slot_pool: u64,
    pub experts_per_token: usize,
    pub expert: u64,
    pub reserve: u64,
    pub context_tokens: usize,
}

fn layer_pool_terms(pool: u64, [largest, next]: [u64; 2]) -> String {
    match pool {
        0 => "every layer's attention, router and shared experts resident".to_string(),
        _ => format!(
            "{} + {}, the two largest matrices: the one computing and the next, read ahead",
            human(largest),
            human(next)
        ),
    }
}

/// What the run keeps resident, what it streams, and what the budget leaves for the cache.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Plan {
    pub mode: Mode,
    pub budget: u64,
    /// Weights held resident at this budget (payload bytes as stored).
    pub resident_bytes: u64,
    /// Every routed expert, as stored.
    pub routed_bytes: u64,
    /// The largest routed expert's read, and its footprint in aligned buffers.
    pub expert_read_bytes: u64,
    pub expert_allocated_bytes: u64,
    pub experts_per_token: usize,
    pub moe_layers: usize,
    pub slot_pool_bytes: u64,
    pub reserve_bytes: u64,
    /// Tokens of context the reserve's KV cache is sized for.
    pub context_tokens: usize,
    /// The least budget this run works in, and its terms: `floor_resident_bytes` +
    /// `floor_tables_bytes` + `floor_layer_pool_bytes` + `slot_pool_bytes` + `reserve_bytes`.
    pub floor: u64,
    pub floor_resident_bytes: u64,
    /// The embedding and the head at the floor: the buffers reading them by rows takes, or
    /// their bytes where holding them takes less (or they cannot be read by rows).
    pub floor_tables_bytes: u64,
    pub floor_layer_pool_bytes: u64,
    /// The least budget that holds every layer's deterministic weights resident (the tables
    /// as at the floor, routed experts streamed).
    pub deterministic_floor: u64,
    /// What a fully resident run needs: every payload byte and the reserve.
    pub everything: u64,
    /// Layers whose deterministic weights stream (read each step), and whether the next one is
    /// read while the current one computes.
    pub streamed_layers: Vec<usize>,
    /// Whether the layers the budget pays for are held, or every layer streams.
    pub layers: Layers,
    pub layer_count: usize,
    pub read_ahead: bool,
    /// Threads reading a layer's chosen experts at once (they never hold more than the slot
    /// pool: every chosen expert is held until its layer is done).
    pub reads_in_flight: usize,
    /// Buffers for the streamed deterministic weights, read matrix by matrix: the two largest
    /// matrices' (the one computing and the next, read ahead; set aside even with read-ahead
    /// off), 0 when no layer streams.
    pub layer_pool_bytes: u64,
    /// The two largest matrices of the layers' deterministic weights in aligned buffers,
    /// largest first.
    pub layer_matrix_bytes: [u64; 2],
    /// Deterministic bytes a step reads: the streamed layers'.
    pub layer_read_per_token: u64,
    /// The tables outside the layers (embedding, head): what each costs, and whether this
    /// plan leaves it on storage.
    pub tables: Vec<TableTerms>,
    /// Bytes of a tile of a streamed head's rows.
    pub table_tile_bytes: u64,
    /// Bytes a decode step reads of the tables left on storage, and their read buffers.
    pub table_read_per_token: u64,
    pub table_pool_bytes: u64,
    /// What the budget above the floor could hold, in the order it holds it (see
    /// [`crate::ranking`]), each marked held or not; empty for a fully resident run.
    pub ranking: Vec<Ranked>,
    /// MoE layers whose routed experts are all held resident, read when the model is loaded.
    pub held_layers: Vec<usize>,
    /// What the held layers' experts take resident (as stored).
    pub held_bytes: u64,
    /// Bytes of experts of the other layers the cache may hold.
    pub cache_bytes: u64,
    /// Routed-expert bytes a decode step reads when the cache holds none of the experts it
    /// needs: the chosen experts of every MoE layer not held.
    pub uncached_read_per_token: u64,
    /// Streamed MoE layers whose experts a decode step may read ahead on a guess at once
    /// (see [`crate::guessed_experts`]), each guess in a slot pool of its own taken from the
    /// cache: 0 where none streams, guessing is off, or the cache has no room for a pool.
    pub guessed_layers: usize,
}

/// Whether a plan holds the layers' deterministic weights the budget pays for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layers {
    /// In layer order, each layer's deterministic weights the budget still pays for are held,
    /// the others stream (only below the deterministic floor).
    #[default]
    HoldWhatFits,
    /// Every layer's deterministic weights stream, at any budget.
    StreamEvery,
}

/// What the planner needs to know of an architecture beside what its layers ask for
/// (implemented by each model's config).
pub trait Shape {
    fn layer_count(&self) -> usize;
    fn experts_per_token(&self) -> usize;
    /// What the model's cache holds for a context of `context_tokens` positions.
    fn cache_bytes(&self, context_tokens: usize) -> u64;
}

/// One MoE layer's routed experts: what a token reads there uncached, what holding them
/// resident takes.
struct ExpertLayer {
    index: usize,
    per_token: u64,
    hold: u64,
}

/// One layer's deterministic weights: resident (as stored), and read.
struct DeterministicLayer {
    resident: u64,
    read: u64,
}

/// What the artifact holds, by the plan's terms.
struct Sizes {
    routed_bytes: u64,
    expert_read_max: u64,
    expert_alloc_max: u64,
    expert_layers: Vec<ExpertLayer>,
    /// Every payload byte but the routed experts'.
    resident_all: u64,
    layers: Vec<DeterministicLayer>,
    /// The two largest of the layers' deterministic matrices, in aligned buffers.
    matrices: [u64; 2],
    tables: Vec<TableTerms>,
    total: u64,
}

/// The floor's terms: holding every layer's deterministic weights, or streaming them matrix by
/// matrix through the two largest matrices' buffers, the tables streamed where that takes less.
struct Floors {
    /// What is held at any budget: norms, and tables that cannot be read by rows.
    base: u64,
    /// Every deterministic weight but the streamable tables'.
    held_layers: u64,
    /// The streamable tables at the floor.
    tables: u64,
    matrices: [u64; 2],
    deterministic: u64,
    streaming: u64,
    floor: u64,
    floor_resident: u64,
    floor_pool: u64,
}

impl Floors {
    /// The floors of `s`, beside `fixed` (the slot pool and the reserve).
    fn of(s: &Sizes, fixed: u64, stream_every: bool) -> Floors {
        let streamable = s.tables.iter().filter(|t| t.by_rows);
        let tables_resident: u64 = streamable.clone().map(|t| t.resident_bytes).sum();
        let tables: u64 = streamable.map(TableTerms::floor_bytes).sum();
        let held_layers = s.resident_all.saturating_sub(tables_resident);
        let layer_resident: u64 = s.layers.iter().map(|l| l.resident).sum();
        let base = held_layers.saturating_sub(layer_resident);
        let pool = s.matrices[0] + s.matrices[1];
        let deterministic = (held_layers + tables).saturating_add(fixed);
        let streaming = (base + tables + pool).saturating_add(fixed);
        let (floor, floor_resident, floor_pool) = match stream_every || streaming < deterministic {
            true => (streaming, base, pool),
            false => (deterministic, held_layers, 0),
        };
        Floors {
            base,
            held_layers,
            tables,
            matrices: s.matrices,
            deterministic,
            streaming,
            floor,
            floor_resident,
            floor_pool,
        }
    }
}

fn sizes(artifact: &Artifact, weights: &ModelWeights, experts_per_token: usize) -> Sizes {
    let mut container_files = std::collections::BTreeSet::new();
    let mut pieces = 0u64;
    let (mut routed_bytes, mut read_max, mut alloc_max) = (0u64, 0, 0);
    let mut expert_layers = Vec::new();
    for (index, layer) in weights.layers.iter().enumerate() {
        let Some(layer) = &layer.experts else {
            continue;
        };
        let largest = layer.iter().map(ExpertParts::read_bytes).max().unwrap_or(0);
        read_max = read_max.max(largest);
        alloc_max = alloc_max.max(
            layer
                .iter()
                .map(ExpertParts::allocated_bytes)
                .max()
                .unwrap_or(0),
        );
        let parts = layer
            .iter()
            .flat_map(|e| e.parts().into_iter().map(|p| &p.part));
        expert_layers.push(ExpertLayer {
            index,
            per_token: largest * experts_per_token as u64,
            hold: layer_stream::resident_bytes(artifact, parts),
        });
        for expert in layer {
            routed_bytes += expert.read_bytes();
            for part in expert.parts() {
                match &part.part {
                    PartLayout::Tile { file, .. } => {
                        container_files.insert(*file);
                    }
                    p @ (PartLayout::Pieces { .. } | PartLayout::Bands { .. }) => {
                        pieces += p.read_bytes()
                    }
                }
            }
        }
    }
    let streamed_files: u64 = container_files
        .iter()
        .map(|&f| artifact.payload_file_bytes(f))
        .sum();
    let total = artifact.total_payload_bytes();
    let layers = weights
        .layers
        .iter()
        .map(|layer| {
            let m = &layer.matrices;
            DeterministicLayer {
                resident: layer_stream::resident_bytes(artifact, layer_stream::parts(m)),
                read: layer_stream::read_bytes(m),
            }
        })
        .collect();
    let matrices = layer_stream::largest_two(weights.layers.iter().map(|l| &l.matrices[..]));
    Sizes {
        routed_bytes,
        expert_read_max: read_max,
        expert_alloc_max: alloc_max,
        expert_layers,
        resident_all: total.saturating_sub(streamed_files + pieces),
        layers,
        matrices,
        tables: weights
            .tables
            .iter()
            .map(|t| TableTerms::of(artifact, t, TABLE_TILE_BYTES))
            .collect(),
        total,
    }
}

impl Plan {
    /// Plans a run of at most `context_tokens` positions under `budget`.
    pub fn new(
        artifact: &Artifact,
        c: &(impl Shape + ?Sized),
        weights: &ModelWeights,
        budget: Budget,
        context_tokens: usize,
    ) -> Result<Plan, PlanError> {
        Plan::with_layers(
            artifact,
            c,
            weights,
            (budget, Layers::HoldWhatFits),
            context_tokens,
        )
    }

    /// [`Plan::new`] with the layers' deterministic weights held or streamed as `layers` says.
    pub fn with_layers(
        artifact: &Artifact,
        c: &(impl Shape + ?Sized),
        weights: &ModelWeights,
        (budget, layers): (Budget, Layers),
        context_tokens: usize,
    ) -> Result<Plan, PlanError> {
        let s = sizes(artifact, weights, c.experts_per_token());
        let stream_every = layers == Layers::StreamEvery && !s.layers.is_empty();
        // Payload sizes are bounded by Artifact::open; the config's counts are not, so the
        // products saturate (a saturated floor is refused like any other too-large one).
        let reserve_bytes = FIXED_RESERVE.saturating_add(c.cache_bytes(context_tokens));
        let experts_per_token = c.experts_per_token();
        let slot_pool_bytes = s.expert_alloc_max.saturating_mul(experts_per_token as u64);
        let f = Floors::of(
            &s,
            slot_pool_bytes.saturating_add(reserve_bytes),
            stream_every,
        );
        let everything = s.total.saturating_add(reserve_bytes);
        let budget_bytes = match budget {
            Budget::Bytes(b) => b,
            Budget::Floor => f.floor,
            Budget::Balanced => f.floor + everything.saturating_sub(f.floor) / 2,
            Budget::Generous => everything.max(f.floor),
        };
        if budget_bytes < f.floor {
            return Err(PlanError::BelowFloor(Box::new(BelowFloor {
                budget: budget.to_string(),
                floor: f.floor,
                resident: f.floor_resident,
                tables: f.tables,
                layer_pool: f.floor_pool,
                matrices: f.matrices,
                slot_pool: slot_pool_bytes,
                experts_per_token,
                expert: s.expert_alloc_max,
                reserve: reserve_bytes,
                context_tokens,
            })));
        }
        let moe_layers = s.expert_layers.len();
        let mode = match stream_every || budget_bytes < everything {
            true => Mode::Streamed,
            false => Mode::Resident,
        };
        let mut plan = Plan {
            mode,
            budget: budget_bytes,
            resident_bytes: s.resident_all,
            routed_bytes: s.routed_bytes,
            expert_read_bytes: s.expert_read_max,
            expert_allocated_bytes: s.expert_alloc_max,
            experts_per_token,
            moe_layers,
            slot_pool_bytes,
            reserve_bytes,
            context_tokens,
            floor: f.floor,
            floor_resident_bytes: f.floor_resident,
            floor_tables_bytes: f.tables,
            floor_layer_pool_bytes: f.floor_pool,
            deterministic_floor: f.deterministic,
            everything,
            streamed_layers: Vec::new(),
            layers,
            layer_count: c.layer_count(),
            read_ahead: true,
            reads_in_flight: DEFAULT_READS_IN_FLIGHT,
            layer_pool_bytes: 0,
            layer_matrix_bytes: f.matrices,
            layer_read_per_token: 0,
            tables: s.tables.clone(),
            table_tile_bytes: TABLE_TILE_BYTES,
            table_read_per_token: 0,
            table_pool_bytes: 0,
            ranking: Vec::new(),
            held_layers: Vec::new(),
            held_bytes: 0,
            cache_bytes: 0,
            uncached_read_per_token: 0,
            guessed_layers: 0,
        };
        if mode == Mode::Streamed {
            plan.fill(&s, &f, budget_bytes);
        }
        plan.guess_ahead(GUESSED_LAYERS);
        Ok(plan)
    }

    /// A streamed run's budget above its floor, filled as [`crate::ranking`] says: the layers'
    /// deterministic weights streamed at the floor (all held where the budget pays for them
    /// all, which gives back their buffers), the tables streamed at the floor, and whole MoE
    /// layers, most bytes saved per byte held first; the rest is the expert cache.
    fn fill(&mut self, s: &Sizes, f: &Floors, budget: u64) {
        let layers_stream = self.layers == Layers::StreamEvery || budget < f.deterministic;
        let (floor, held) = match layers_stream {
            true => (f.streaming, f.base),
            false => (f.deterministic, f.held_layers),
        };
        self.resident_bytes = held;
        let mut ranked = Vec::new();
        if layers_stream {
            self.layer_pool_bytes = self.layer_matrix_bytes[0] + self.layer_matrix_bytes[1];
            if self.layers == Layers::HoldWhatFits {
                for (index, layer) in s.layers.iter().enumerate() {
                    let what = Holdable::Layer { layer: index };
                    ranked.push(Ranked::new(
                        what,
                        format!("layer {index}"),
                        layer.resident,
                        layer.read,
                    ));
                }
            }
        }
        for (index, table) in self.tables.iter_mut().enumerate() {
            table.stored = table.stored_at_floor();
            if table.stored {
                let cost = table.resident_bytes - table.pool_bytes;
                let label = format!("{} ({})", table_label(table.used_as), table.name);
                ranked.push(Ranked::new(
                    Holdable::Table { table: index },
                    label,
                    cost,
                    table.read_per_token,
                ));
            }
        }
        for layer in &s.expert_layers {
            let what = Holdable::Experts { layer: layer.index };
            let label = format!("the routed experts of layer {}", layer.index);
            ranked.push(Ranked::new(what, label, layer.hold, layer.per_token));
        }
        let mut ranked = rank(ranked);
        // The cache saves at least what a whole MoE layer does per byte: what saves less waits
        // until no layer's experts stream.
        let cache_percent = ranked
            .iter()
            .filter(|r| matches!(r.what, Holdable::Experts { .. }))
            .map(|r| r.percent)
            .min();
        let spare = fill(&mut ranked, budget.saturating_sub(floor), |r| {
            cache_percent.is_none_or(|p| r.percent >= p)
        });
        let experts_all_held = ranked
            .iter()
            .all(|r| r.held || !matches!(r.what, Holdable::Experts { .. }));
        self.cache_bytes = match experts_all_held {
            true => fill(&mut ranked, spare, |_| true),
            false => spare,
        };
        self.apply(s, &ranked);
        self.ranking = ranked;
    }

    /// What the ranking holds and what it leaves on storage, in the plan's terms.
    fn apply(&mut self, s: &Sizes, ranked: &[Ranked]) {
        let held = |what: Holdable| ranked.iter().any(|r| r.what == what && r.held);
        if self.layer_pool_bytes > 0 {
            for (index, layer) in s.layers.iter().enumerate() {
                match held(Holdable::Layer { layer: index }) {
                    true => self.resident_bytes += layer.resident,
                    false => {
                        self.streamed_layers.push(index);
                        self.layer_read_per_token += layer.read;
                    }
                }
            }
        }
        for (index, table) in self.tables.iter_mut().enumerate() {
            if table.stored && held(Holdable::Table { table: index }) {
                table.stored = false;
            }
            match table.stored {
                true => {
                    self.table_read_per_token += table.read_per_token;
                    self.table_pool_bytes += table.pool_bytes;
                }
                false if table.by_rows => self.resident_bytes += table.resident_bytes,
                false => {}
            }
        }
        for layer in &s.expert_layers {
            match held(Holdable::Experts { layer: layer.index }) {
                true => {
                    self.held_bytes += layer.hold;
                    self.held_layers.push(layer.index);
                }
                false => self.uncached_read_per_token += layer.per_token,
            }
        }
    }

    /// What a decode step reads from storage with no cache hits: the streamed MoE layers'
    /// chosen experts, the streamed layers' deterministic weights and the tables' rows left on
    /// storage (nothing for a resident run).
    pub fn read_per_token(&self) -> u64 {
        match self.mode {
            Mode::Resident => 0,
            Mode::Streamed => {
                self.uncached_read_per_token + self.layer_read_per_token + self.table_read_per_token
            }
        }
    }

    /// The tables the run reads by rows from storage.
    pub fn stored_tables(&self) -> StoredTables {
        StoredTables {
            names: self
                .tables
                .iter()
                .filter(|t| self.mode == Mode::Streamed && t.stored)
                .map(|t| t.name.clone())
                .collect(),
            tile_bytes: self.table_tile_bytes,
            read_ahead: self.read_ahead,
        }
    }

    /// Lets a decode step read up to `layers` streamed MoE layers' experts ahead on a guess at
    /// once (at most [`MAX_GUESSED_LAYERS`]), each in a slot pool of its own taken from the
    /// cache, as many as the cache holds: a guess holds at most one token's experts of its
    /// layer, right or wrong, until its layer's router chose. 0 turns guessing off and gives
    /// the pools back.
    pub fn guess_ahead(&mut self, layers: usize) {
        self.cache_bytes += self.guessed_layers as u64 * self.slot_pool_bytes;
        let streamed = self.mode == Mode::Streamed && self.held_layers.len() < self.moe_layers;
        let affordable = match self.slot_pool_bytes {
            0 => 0,
            pool => (self.cache_bytes / pool) as usize,
        };
        self.guessed_layers = match streamed {
            true => layers.min(MAX_GUESSED_LAYERS).min(affordable),
            false => 0,
        };
        self.cache_bytes -= self.guessed_layers as u64 * self.slot_pool_bytes;
    }

    /// The expert cache of a streamed run under this plan, for the layers not held. The
    /// artifact keeps what a step frees (its uncached experts, its streamed layers, the experts
    /// the cache lets go) for the next read into again: the plan set that much aside for reads
    /// in flight and for the cache.
    pub fn start_streaming(&self, artifact: &Artifact) -> ExpertCache {
        let slot_pools = 1 + self.guessed_layers as u64;
        artifact.keep_read_buffers(
            slot_pools * self.slot_pool_bytes
                + self.layer_pool_bytes
                + self.table_pool_bytes
                + self.cache_bytes,
        );
        ExpertCache::new(self.cache_bytes, self.moe_layers - self.held_layers.len())
    }
}
