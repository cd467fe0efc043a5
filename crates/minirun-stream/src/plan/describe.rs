//! A plan in words: the lines `minirun run` and `minirun plan` print, and the ranking and the
//! tables as the page's memory dial shows them.

use super::{Layers, Mode, Plan};
use crate::budget::human;
use crate::ranking::{Holdable, Ranked};
use crate::tables::TableUse;

/// What a table is, in words.
pub(super) fn table_label(used_as: TableUse) -> &'static str {
    match used_as {
        TableUse::Embedding => "the embedding",
        TableUse::Head => "the head",
        TableUse::EmbeddingAndHead => "the embedding and head",
    }
}

impl Plan {
    /// The tables the run reads by rows from storage, in words.
    pub fn stored_table_labels(&self) -> Vec<String> {
        self.tables
            .iter()
            .filter(|t| self.mode == Mode::Streamed && t.stored)
            .map(|t| format!("{} ({})", table_label(t.used_as), t.name))
            .collect()
    }

    /// What the budget above the floor holds first, in words (empty for a resident run).
    pub fn ranking_line(&self) -> String {
        ranking_line(&self.ranking)
    }

    /// The plan in lines, for the run's header.
    pub fn describe(&self) -> Vec<String> {
        let pool = match self.floor_layer_pool_bytes {
            0 => String::new(),
            p => format!(
                " + layer buffers {} ({} + {}, the two largest matrices)",
                human(p),
                human(self.layer_matrix_bytes[0]),
                human(self.layer_matrix_bytes[1])
            ),
        };
        let mut lines = vec![format!(
            "budget {} ({}): floor {} = resident {} + embedding and head {}{pool} + slot pool {} ({} x {}) + reserve {}",
            human(self.budget),
            match (self.mode, self.streamed_layers.is_empty()) {
                (Mode::Resident, _) => "fully resident",
                (Mode::Streamed, true) => "routed experts streamed",
                (Mode::Streamed, false) => match self.layers {
                    Layers::StreamEvery => "routed experts and every layer streamed, as asked",
                    Layers::HoldWhatFits if self.streamed_layers.len() == self.layer_count => {
                        "routed experts and every layer streamed"
                    }
                    Layers::HoldWhatFits => "routed experts and some layers streamed",
                },
            },
            human(self.floor),
            human(self.floor_resident_bytes),
            human(self.floor_tables_bytes),
            human(self.slot_pool_bytes),
            self.experts_per_token,
            human(self.expert_allocated_bytes),
            human(self.reserve_bytes),
        )];
        if !self.streamed_layers.is_empty() {
            lines.push(format!(
                "streamed each step: the attention, router and shared experts of {} of {} layers ({}), {} a token, {}; resident {}",
                self.streamed_layers.len(),
                self.layer_count,
                layer_list(&self.streamed_layers),
                human(self.layer_read_per_token),
                match self.read_ahead {
                    true => "matrix by matrix, the next read while one computes",
                    false => "no read-ahead",
                },
                human(self.resident_bytes),
            ));
        }
        let stored: Vec<String> = self
            .tables
            .iter()
            .filter(|t| self.mode == Mode::Streamed && t.stored)
            .map(|t| match t.used_as {
                TableUse::Embedding => format!("{} a row a token", table_label(t.used_as)),
                _ => format!(
                    "{} ({}) in tiles of {}",
                    table_label(t.used_as),
                    human(t.resident_bytes),
                    human(self.table_tile_bytes)
                ),
            })
            .collect();
        if !stored.is_empty() {
            let head = self
                .tables
                .iter()
                .any(|t| t.stored && t.used_as != TableUse::Embedding);
            lines.push(format!(
                "read by rows from storage: {}; {} a token{}",
                stored.join(", "),
                human(self.table_read_per_token),
                match (head, self.read_ahead) {
                    (true, true) => ", the next tile read while one computes",
                    _ => "",
                },
            ));
        }
        if !self.ranking.is_empty() {
            lines.push(format!(
                "above the floor, most bytes saved a token per byte held first: {}",
                ranking_line(&self.ranking)
            ));
        }
        if self.mode == Mode::Streamed {
            if !self.held_layers.is_empty() {
                lines.push(format!(
                    "held whole: {} of {} MoE layers ({}), {}, read once at load",
                    self.held_layers.len(),
                    self.moe_layers,
                    layer_list(&self.held_layers),
                    human(self.held_bytes),
                ));
            }
            lines.push(format!(
                "streamed: the routed experts of {} MoE layers ({} in all); expert cache {}; without cache hits a token reads {}; {}",
                self.moe_layers - self.held_layers.len(),
                human(self.routed_bytes),
                human(self.cache_bytes),
                human(self.uncached_read_per_token),
                match self.guessed_layers {
                    0 => "no expert read ahead on a guess".to_string(),
                    1 => format!("each layer's experts read ahead on a guess before its attention, in a slot pool of {} taken from the cache", human(self.slot_pool_bytes)),
                    n => format!("{n} layers' experts read ahead on a guess at once, in {n} slot pools taken from the cache"),
                },
            ));
        }
        lines
    }
}

/// The ranking in words, neighbouring items of one kind alike (held or not, same share) merged
/// into one: `layers 0-3 (100%) held, the head (lm_head.weight) (101%) streamed, the routed
/// experts of layers 1-8 (2%) streamed, ...`.
fn ranking_line(ranked: &[Ranked]) -> String {
    let mut runs: Vec<(Vec<usize>, &Ranked)> = Vec::new();
    for item in ranked {
        let layer = match item.what {
            Holdable::Layer { layer } | Holdable::Experts { layer } => Some(layer),
            Holdable::Table { .. } => None,
        };
        match (runs.last_mut(), layer) {
            (Some((layers, last)), Some(l))
                if std::mem::discriminant(&last.what) == std::mem::discriminant(&item.what)
                    && last.held == item.held
                    && last.percent == item.percent =>
            {
                layers.push(l)
            }
            (_, Some(l)) => runs.push((vec![l], item)),
            (_, None) => runs.push((Vec::new(), item)),
        }
    }
    runs.iter()
        .map(|(layers, item)| {
            let what = match item.what {
                Holdable::Layer { .. } => layer_list(layers),
                Holdable::Experts { .. } => format!("the routed experts of {}", layer_list(layers)),
                Holdable::Table { .. } => item.label.clone(),
            };
            let state = if item.held { "held" } else { "streamed" };
            match item.percent {
                u64::MAX => format!("{what} (costs nothing) {state}"),
                p => format!("{what} ({p}%) {state}"),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `3-5, 9` for layers 3, 4, 5 and 9.
fn layer_list(layers: &[usize]) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &layer in layers {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == layer => *end = layer,
            _ => runs.push((layer, layer)),
        }
    }
    let shown: Vec<String> = runs
        .iter()
        .map(|&(a, b)| match a == b {
            true => a.to_string(),
            false => format!("{a}-{b}"),
        })
        .collect();
    format!(
        "layer{} {}",
        if layers.len() == 1 { "" } else { "s" },
        shown.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::layer_list;

    #[test]
    fn the_ranking_merges_neighbours_alike() {
        use crate::ranking::{Holdable, Ranked};
        let item = |what, held| Ranked {
            held,
            ..Ranked::new(what, "the head (lm_head.weight)".into(), 100, 100)
        };
        let ranked = [
            item(Holdable::Layer { layer: 0 }, true),
            item(Holdable::Layer { layer: 1 }, true),
            item(Holdable::Layer { layer: 2 }, false),
            item(Holdable::Table { table: 0 }, false),
            item(Holdable::Experts { layer: 1 }, false),
            item(Holdable::Experts { layer: 2 }, false),
        ];
        assert_eq!(
            super::ranking_line(&ranked),
            "layers 0-1 (100%) held, layer 2 (100%) streamed, the head (lm_head.weight) (100%) streamed, the routed experts of layers 1-2 (100%) streamed"
        );
    }

    #[test]
    fn held_layers_are_listed_as_runs() {
        assert_eq!(layer_list(&[3]), "layer 3");
        assert_eq!(layer_list(&[1, 2, 3, 7]), "layers 1-3, 7");
        assert_eq!(layer_list(&[1, 3]), "layers 1, 3");
    }
}
